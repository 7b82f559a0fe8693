"""Rules over every node group of every committed stack: the MPIJob rendered for it validates against the
pinned operator's CRD and Kubernetes' own schemas, and asks for what the catalog says its nodes have."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import mpi_operator
from cluster.aws.backend import AwsBackend
from cluster.job import JobSpec
from cluster.mpijob import EFA_RESOURCE, GPU_RESOURCE, parse_gib, worker_memory_limit_gib
from cluster.schemas import validate_mpijob

REPO_ROOT = Path(__file__).resolve().parents[2]
STACKS = sorted(p.name.split(".")[1] for p in REPO_ROOT.glob("Pulumi.*.yaml"))


class OutputsOnly:
    def __init__(self, name, outputs):
        self.name, self._outputs = name, outputs

    def outputs(self):
        return dict(self._outputs)


@pytest.fixture(scope="module", params=STACKS)
def stack(request):
    import yaml

    from tests.infra.harness import run_program

    config = yaml.safe_load((REPO_ROOT / f"Pulumi.{request.param}.yaml").read_text())["config"]
    return request.param, run_program(request.param).exports, config


def test_every_committed_stack_is_covered():
    assert {"dev", "prod"} <= set(STACKS)


@pytest.mark.parametrize("elastic", [False, True], ids=["static", "elastic"])
def test_rendered_mpijobs_of_every_node_group_validate_and_match_the_catalog(stack, elastic, tmp_path):
    pytest.importorskip("kubernetes_validate")
    from infra.catalog import load_catalog

    name, exports, config = stack
    catalog = load_catalog()
    kubernetes_version = str(config["ringtrain:cluster"]["kubernetesVersion"])
    declared = {g["name"]: g for g in config["ringtrain:nodeGroups"]}
    assert declared
    for group_name, declared_group in declared.items():
        backend = AwsBackend(name, node_group=group_name, kubeconfig=tmp_path / "kc",
                             ops_factory=lambda s: OutputsOnly(s, exports), log=lambda m: None)
        group = backend.outputs().node_group(group_name)
        types = [catalog[t] for t in group.instance_types]
        gpus = types[0].gpus
        job = JobSpec(name=f"{group_name}-job", num_hosts=2, slots_per_host=gpus, elastic=elastic,
                      min_hosts=1 if elastic else None)
        manifest = backend.render(job)
        validate_mpijob(manifest, kubernetes_version)
        (container,) = manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
        res = container["resources"]
        where = f"{name}/{group_name}"
        assert res["limits"][GPU_RESOURCE] == res["requests"][GPU_RESOURCE] == gpus, where
        # Every EFA interface the catalog lists for the type, on groups declared with efa: true.
        efa = types[0].efa_interfaces if declared_group.get("efa") else 0
        assert res["limits"].get(EFA_RESOURCE, 0) == res["requests"].get(EFA_RESOURCE, 0) == efa, where
        memory = parse_gib(res["limits"]["memory"])
        assert memory == min(worker_memory_limit_gib(t.memory_gib) for t in types), where
        assert memory < min(t.memory_gib for t in types), where
        assert int(res["requests"]["cpu"]) < min(t.vcpus for t in types), where
        assert not any(k.startswith("hugepages-") for k in res["limits"]), where
        assert container["readinessProbe"]["tcpSocket"]["port"] == 22, where
        args = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
        path = mpi_operator.DISCOVER_HOSTS_PATH if elastic else mpi_operator.HOSTFILE_PATH
        assert path in args, where
