"""Room on a GPU node for its own pods (cluster/node_room.py): every DaemonSet the stack installs is
counted, and a worker's requests plus theirs plus kube-reserved fit every GPU type of the catalog."""

from __future__ import annotations

import pytest

from cluster import node_room
from cluster.mpijob import worker_nodes
from infra.catalog import load_catalog

GPU_TYPES = {name: t for name, t in load_catalog().instance_types.items() if t.gpus}


def test_every_daemonset_the_stack_installs_is_counted():
    """A DaemonSet added to the stack without its requests here fails this test (issue 40 §1.5)."""
    from infra.cluster import NODE_ADDONS, WORKLOAD_ADDONS
    from infra.platform import EFA_DEVICE_PLUGIN, NVIDIA_DEVICE_PLUGIN

    deployments_only = {"coredns"}   # a Deployment on the system nodes, no pod on GPU nodes
    installers = set(NODE_ADDONS) | (set(WORKLOAD_ADDONS) - deployments_only) | \
        {NVIDIA_DEVICE_PLUGIN.release, EFA_DEVICE_PLUGIN.release}
    assert {d.installed_by for d in node_room.DAEMONSETS} == installers
    assert all(d.source for d in node_room.DAEMONSETS)


def test_kube_reserved_follows_the_eks_ami():
    # nodeadm getCPUMillicoresToReserve: 60 + 10 + 2 x 5 + 0.25% of the rest
    assert node_room.kube_reserved_cpu_m(2) == 70
    assert node_room.kube_reserved_cpu_m(48) == 190
    assert node_room.kube_reserved_cpu_m(192) == 550
    assert node_room.kube_reserved_memory_mib(250) == 3005


def test_the_daemonset_requests_sum_up():
    assert node_room.daemonset_cpu_m() == 25 + 100 + 0 + 250 + 50 + 250 + 50 + 0 + 10 == 735
    assert node_room.daemonset_memory_mib() == 128 + 25 + 128 + 30 + 20 == 331
    assert node_room.daemonset_memory_mib(limits=True) == 512 + 250 + 750 + 100 + 20 == 1632


@pytest.mark.parametrize("name", sorted(GPU_TYPES))
def test_a_worker_and_the_nodes_own_pods_fit_every_gpu_type(name):
    t = GPU_TYPES[name]
    workers = worker_nodes("g", (name,), "SPOT", 0, GPU_TYPES)
    cpu_m = (int(workers.cpu_request) * 1000 + node_room.kube_reserved_cpu_m(t.vcpus)
             + node_room.daemonset_cpu_m())
    # what the scheduler checks, with a spare core left for one more DaemonSet
    assert cpu_m + node_room.SPARE_CPU_M <= t.vcpus * 1000
    memory_mib = (int(workers.memory_limit.removesuffix("Gi")) * 1024
                  + node_room.daemonset_memory_mib(limits=True))
    assert memory_mib <= node_room.allocatable_memory_mib(t.memory_gib)


def test_a_p5_worker_leaves_room():
    """Defect: a p5 worker asked for 190 of 192 vCPUs; kube-reserved (550m) and the DaemonSets (735m)
    left 715m, so one more DaemonSet asking for more would keep the next job's workers Pending."""
    p5 = worker_nodes("h100", ("p5.48xlarge",), "ON_DEMAND", 32, GPU_TYPES)
    assert p5.cpu_request == "189" and p5.memory_limit == "1839Gi"
