"""Issue 26 defect 7: every GPU worker runs the image's self-test as its init container, expecting the GPUs
and EFA interfaces its pod requests (from the catalog); the launcher never self-tests and runs the slim
launcher image that scripts/image-build pushes beside the worker image (defect 8)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cluster.aws.backend import AwsBackend
from cluster.backend import Storage
from cluster.job import JobSpec
from cluster.mpijob import (
    EFA_RESOURCE,
    GPU_RESOURCE,
    SYSTEM_NODES,
    MPIJobError,
    WorkerNodes,
    launcher_container,
    launcher_image_for,
    render_mpijob,
    worker_container,
    worker_selftest_container,
)
from tests.image.helpers import DOCKERFILE, load_entry_module, load_image_module

REPO_ROOT = Path(__file__).resolve().parents[2]
STACKS = sorted(p.name.split(".")[1] for p in REPO_ROOT.glob("Pulumi.*.yaml"))
entry_settings = load_entry_module("settings")
build = load_image_module("build")

STORAGE = Storage(dataset_uri="s3://d/datasets/x", checkpoint_uri="s3://c/checkpoints/x")
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/ringtrain:1.2.3"
P5 = WorkerNodes(node_group="gpu-efa", instance_types=("p5.48xlarge",), gpus_per_node=8, efa_interfaces=32,
                 capacity_type="ON_DEMAND", memory_limit="1840Gi", cpu_request="190",
                 shm_size_limit="942080Mi")
G5 = dataclasses.replace(P5, node_group="gpu", instance_types=("g5.12xlarge",), gpus_per_node=4,
                         efa_interfaces=0, memory_limit="170Gi", cpu_request="46", shm_size_limit="87040Mi")
CPU_HOSTS = dataclasses.replace(G5, node_group="local", gpus_per_node=0)
JOB = JobSpec(name="j1", num_hosts=2, slots_per_host=8)


def render(job: JobSpec = JOB, workers: WorkerNodes = P5, **kw):
    return render_mpijob(job, image=IMAGE, storage=STORAGE, namespace="training", service_account="sa",
                         workers=workers, launcher=SYSTEM_NODES, **kw)


def expectations(container: dict) -> entry_settings.Settings:
    """What the image's entrypoint reads from the init container's environment."""
    return entry_settings.parse_settings({e["name"]: e["value"] for e in container.get("env", [])})


def test_gpu_workers_self_test_first_with_the_requested_gpus_and_efa():
    manifest = render(dataclasses.replace(JOB, env={"NCCL_DEBUG": "WARN"}))
    selftest, worker = worker_selftest_container(manifest), worker_container(manifest)
    assert selftest is not None
    assert selftest["image"] == worker["image"] == IMAGE
    assert entry_settings.parse_invocation(selftest["args"], {}).mode == "selftest"
    assert selftest["resources"] == worker["resources"], "it sees the GPUs and EFA devices the ranks get"
    settings = expectations(selftest)
    assert (settings.expect_gpus, settings.expect_efa) == (8, 32)
    assert entry_settings.efa_expected(settings), "on EFA groups NCCL must show the EFA provider in use"
    assert {"name": "NCCL_DEBUG", "value": "WARN"} in selftest["env"], "the job's env, as the worker's"
    assert not any(e["name"].startswith("RINGTRAIN_EXPECT") for e in worker.get("env", []))


def test_fewer_slots_than_gpus_expect_what_the_pod_requests():
    selftest = worker_selftest_container(render(dataclasses.replace(JOB, slots_per_host=2)))
    assert (expectations(selftest).expect_gpus, expectations(selftest).expect_efa) == (2, 32)
    assert selftest["resources"]["limits"][GPU_RESOURCE] == 2


def test_non_efa_groups_expect_no_efa():
    selftest = worker_selftest_container(render(dataclasses.replace(JOB, slots_per_host=4), workers=G5))
    settings = expectations(selftest)
    assert (settings.expect_gpus, settings.expect_efa) == (4, 0)
    assert not entry_settings.efa_expected(settings)


def test_cpu_workers_have_no_self_test():
    """The local executor's hosts have no GPUs: nothing to test, and its object runs as rendered."""
    manifest = render(dataclasses.replace(JOB, slots_per_host=1), workers=CPU_HOSTS)
    assert worker_selftest_container(manifest) is None
    assert "initContainers" not in manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]


def test_the_launcher_never_self_tests():
    manifest = render(dataclasses.replace(JOB, env={"NCCL_DEBUG": "WARN"}))
    launcher_spec = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert "initContainers" not in launcher_spec
    container = launcher_container(manifest)
    assert entry_settings.parse_invocation(container["args"], {}).mode == "launcher"
    assert not any(e["name"].startswith("RINGTRAIN_") for e in container.get("env", []))


def test_a_job_env_asking_for_the_old_self_test_switch_is_refused():
    with pytest.raises(MPIJobError, match="RINGTRAIN_SELFTEST: not allowed in a job's environment"):
        render(dataclasses.replace(JOB, env={"RINGTRAIN_SELFTEST": "1"}))


def test_the_launcher_runs_the_slim_image_built_with_the_worker_image():
    manifest = render()
    assert launcher_container(manifest)["image"] == IMAGE + "-launcher" == launcher_image_for(IMAGE)
    assert render(launcher_image="r/launcher:9")["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"][
        "containers"][0]["image"] == "r/launcher:9"
    with pytest.raises(MPIJobError, match="launcher image 'r/launcher': expected <repository>:<tag>"):
        render(launcher_image="r/launcher")


def test_the_launcher_tag_is_the_one_image_build_pushes():
    """scripts/image-build tags the launcher target <version>-launcher and git-<rev>-launcher: exactly the
    worker's tag plus the suffix the renderer appends."""
    pins = build.Pins.from_dockerfile(DOCKERFILE.read_text())
    worker_tags = build.compute_tags("1.2.3", pins, "0123456789ab", build.TRAIN)
    launcher_tags = build.compute_tags("1.2.3", pins, "0123456789ab", build.LAUNCHER)
    for worker_tag in (worker_tags[0], worker_tags[-1]):  # <version> and git-<rev>
        assert launcher_image_for(f"repo:{worker_tag}").split(":", 1)[1] in launcher_tags


class OutputsOnly:
    def __init__(self, name, outputs):
        self.name, self._outputs = name, outputs

    def outputs(self):
        return dict(self._outputs)


@pytest.mark.parametrize("stack", STACKS)
def test_every_node_group_self_tests_with_the_catalogs_counts(stack, tmp_path):
    """A rule over every node group of every committed stack: GPUs and EFA interfaces the init container
    expects are the catalog's (every GPU by default; every EFA interface on efa groups), and the AWS
    backend's launcher runs <ecrRepositoryUrl>:<image/VERSION>-launcher."""
    import yaml

    from infra.catalog import load_catalog
    from tests.infra.harness import run_program

    exports = run_program(stack).exports
    config = yaml.safe_load((REPO_ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
    catalog = load_catalog()
    version = (REPO_ROOT / "image" / "VERSION").read_text().strip()
    for declared in config["ringtrain:nodeGroups"]:
        backend = AwsBackend(stack, node_group=declared["name"], kubeconfig=tmp_path / "kc",
                             ops_factory=lambda s: OutputsOnly(s, exports), log=lambda m: None)
        group = backend.outputs().node_group(declared["name"])
        kind = catalog[group.instance_types[0]]
        manifest = backend.render(JobSpec(name="j1", num_hosts=1, slots_per_host=kind.gpus))
        settings = expectations(worker_selftest_container(manifest))
        efa = kind.efa_interfaces if declared.get("efa") else 0
        where = f"{stack}/{declared['name']}"
        assert (settings.expect_gpus, settings.expect_efa) == (kind.gpus, efa), where
        resources = worker_container(manifest)["resources"]["requests"]
        assert (resources[GPU_RESOURCE], resources.get(EFA_RESOURCE, 0)) == (kind.gpus, efa), where
        image = worker_container(manifest)["image"]
        assert image.endswith(f":{version}"), where
        assert launcher_container(manifest)["image"] == f"{image}-launcher", where
