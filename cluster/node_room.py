"""What a GPU node keeps for its own pods, and so what one worker pod may request there (pure).

The scheduler places a pod only where its requests fit the node's allocatable resources (capacity less
kube-reserved and the eviction threshold) minus what the pods already there request; every DaemonSet
the stack installs runs a pod on each GPU node first. A worker that asks for more than is left stays
Pending (Unschedulable, "Insufficient cpu"). So the worker's share is computed here, from the instance
catalog, the EKS AMI's reservation and each DaemonSet's own requests.

kube-reserved, as nodeadm sets it on the EKS AL2023 AMIs (awslabs/amazon-eks-ami
nodeadm/internal/kubelet/config.go, read 2026-12-06: `getCPUMillicoresToReserve`,
`getMemoryMebibytesToReserve`, evictionHard memory.available 100Mi; no systemReserved):
- CPU: 6% of the first core, 1% of the second, 0.5% of the third and fourth, 0.25% of the rest;
- memory: 11 MiB per pod the node may run plus 255 MiB (max pods at most 250 on these sizes).

The DaemonSets on a GPU node, each with the requests (and memory limits) its own manifest or chart sets
(sources read 2026-12-06); tests/cluster/test_node_room.py fails when the stack installs one that is
not listed here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_PODS_PER_NODE = 250
EVICTION_HARD_MIB = 100
# Of what is left for pods, the worker takes this share: the EKS AMIs reserve nothing for the operating
# system (no systemReserved), whose daemons and page cache live in the same allocatable memory.
WORKER_MEMORY_SHARE = 0.9
# CPU kept free beyond the listed DaemonSets: a DaemonSet added later (an add-on update, an agent) must
# not leave the next job's workers Pending.
SPARE_CPU_M = 1000


@dataclass(frozen=True)
class DaemonSetPod:
    """One DaemonSet pod on every GPU node: what it requests, and the memory it may grow to."""

    installed_by: str        # the EKS add-on or Helm release that installs it (infra/cluster.py, platform.py)
    name: str
    cpu_m: int               # requested millicores (the scheduler sums requests)
    memory_mib: int          # requested memory
    memory_limit_mib: int    # its limit, or its request where it has none
    source: str


DAEMONSETS: tuple[DaemonSetPod, ...] = (
    DaemonSetPod("vpc-cni", "aws-node", 25, 0, 0,
                 "aws/amazon-vpc-cni-k8s charts/aws-vpc-cni values.yaml v1.23.1: aws-node requests cpu 25m; "
                 "the node agent and init container set none"),
    DaemonSetPod("kube-proxy", "kube-proxy", 100, 0, 0,
                 "the EKS kube-proxy add-on's DaemonSet (kube-system/kube-proxy, label "
                 "eks.amazonaws.com/component): requests cpu 100m"),
    DaemonSetPod("eks-pod-identity-agent", "eks-pod-identity-agent", 0, 0, 0,
                 "aws/eks-pod-identity-agent charts/eks-pod-identity-agent values.yaml: resources {}"),
    DaemonSetPod("amazon-cloudwatch-observability", "cloudwatch-agent", 250, 128, 512,
                 "aws-observability/helm-charts amazon-cloudwatch-observability 6.4.0 values.yaml agent"),
    DaemonSetPod("amazon-cloudwatch-observability", "fluent-bit", 50, 25, 250,
                 "the same chart, containerLogs.fluentBit.resources"),
    DaemonSetPod("amazon-cloudwatch-observability", "dcgm-exporter", 250, 128, 750,
                 "the same chart, dcgmExporter.resources (GPU nodes)"),
    DaemonSetPod("amazon-cloudwatch-observability", "node-exporter", 50, 30, 100,
                 "the same chart, nodeExporter.resources"),
    DaemonSetPod("nvidia-device-plugin", "nvidia-device-plugin", 0, 0, 0,
                 "NVIDIA/k8s-device-plugin deployments/helm/nvidia-device-plugin values.yaml: resources {}"),
    DaemonSetPod("aws-efa-k8s-device-plugin", "aws-efa-k8s-device-plugin", 10, 20, 20,
                 "aws/eks-charts stable/aws-efa-k8s-device-plugin values.yaml: requests cpu 10m, memory 20Mi "
                 "(EFA nodes; counted on every GPU node)"),
)


def kube_reserved_cpu_m(vcpus: int) -> int:
    """nodeadm's CPU reservation in millicores for a node of `vcpus` (integer arithmetic as there)."""
    total = vcpus * 1000
    reserved = 0
    for start, end, per_10000 in ((0, 1000, 600), (1000, 2000, 100), (2000, 4000, 50), (4000, total, 25)):
        if total > start:
            reserved += (min(total, end) - start) * per_10000 // 10000
    return reserved


def kube_reserved_memory_mib(max_pods: int = MAX_PODS_PER_NODE) -> int:
    return 11 * max_pods + 255


def daemonset_cpu_m() -> int:
    return sum(d.cpu_m for d in DAEMONSETS)


def daemonset_memory_mib(limits: bool = False) -> int:
    return sum(d.memory_limit_mib if limits else d.memory_mib for d in DAEMONSETS)


def allocatable_memory_mib(memory_gib: int) -> int:
    return memory_gib * 1024 - kube_reserved_memory_mib() - EVICTION_HARD_MIB


def worker_cpu_request(vcpus: int) -> int:
    """Whole CPUs one worker requests: the node's less kube-reserved, every DaemonSet's request and
    SPARE_CPU_M, rounded down (no CPU limit: CFS throttling would stall the ranks)."""
    room_m = vcpus * 1000 - kube_reserved_cpu_m(vcpus) - daemonset_cpu_m() - SPARE_CPU_M
    return max(1, room_m // 1000)


def worker_memory_limit_gib(memory_gib: int) -> int:
    """Whole GiB one worker requests (and is limited to): allocatable memory less what the DaemonSets
    may grow to, times WORKER_MEMORY_SHARE. The pod holds all of the node's ranks and its memory-backed
    /dev/shm, so a fixed small limit would OOM-kill big nodes' jobs."""
    room_mib = allocatable_memory_mib(memory_gib) - daemonset_memory_mib(limits=True)
    return max(1, math.floor(room_mib * WORKER_MEMORY_SHARE / 1024))
