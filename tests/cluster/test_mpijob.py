"""The MPIJob renderer: schema-valid manifests (CRD + Kubernetes objects), the right commands, bad input."""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from cluster.aws.mpijob import (
    EFA_RESOURCE,
    GPU_RESOURCE,
    HUGEPAGES_RESOURCE,
    SYSTEM_NODES,
    MPIJobError,
    WorkerNodes,
    image_reference,
    read_image_version,
    render_mpijob,
    worker_hostnames,
    worker_nodes,
)
from cluster.aws.outputs import NodeGroupOutput, parse_outputs
from cluster.backend import Storage
from cluster.job import MPI_OPERATOR_DISCOVERY_SCRIPT, JobSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
# CI runs with a copy of shared/ beside the clone.
CRD_PATH = REPO_ROOT.parent / "shared" / "schemas" / "kubeflow.org_mpijobs.yaml"
KUBERNETES_VERSION = "1.33"  # the committed stacks' ringtrain:cluster.kubernetesVersion

NS = "training"
SA = "ringtrain-trainer"
STORAGE = Storage(dataset_uri="s3://acme-datasets/datasets/cifar", checkpoint_uri="s3://acme-ckpt/checkpoints/j1")
LAUNCHER = SYSTEM_NODES
P5 = WorkerNodes(node_group="gpu-efa", instance_types=("p5.48xlarge",), gpus_per_node=8, efa_interfaces=32,
                 capacity_type="ON_DEMAND")
G5_SPOT = WorkerNodes(node_group="gpu-spot", instance_types=("g5.12xlarge", "g6.12xlarge"), gpus_per_node=4,
                      efa_interfaces=0, capacity_type="SPOT")
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/ringtrain:1.2.3"


def render(job: JobSpec, workers: WorkerNodes = P5, **kw):
    return render_mpijob(job, image=IMAGE, storage=STORAGE, namespace=NS, service_account=SA, workers=workers,
                         launcher=LAUNCHER, **kw)


STATIC = JobSpec(name="j1", num_hosts=2, slots_per_host=8, trainer_args=("--steps", "10"))
ELASTIC = JobSpec(name="j2", num_hosts=4, slots_per_host=4, elastic=True, min_hosts=2)


@functools.cache
def crd_schema() -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    doc = yaml.load(CRD_PATH.read_text(), Loader=loader)
    (version,) = [v for v in doc["spec"]["versions"] if v["name"] == "v2beta1"]
    return version["schema"]["openAPIV3Schema"]


def validate_crd(manifest: dict) -> None:
    if not CRD_PATH.exists():
        pytest.skip(f"MPIJob CRD schema not found at {CRD_PATH} (shared/ must sit beside the clone)")
    jsonschema.Draft7Validator(crd_schema()).validate(manifest)


def validate_pod_templates(manifest: dict) -> None:
    """Each replica's pod template as a Kubernetes PodTemplate, strict (unknown fields are errors)."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for role, replica in manifest["spec"]["mpiReplicaSpecs"].items():
        obj = {"apiVersion": "v1", "kind": "PodTemplate",
               "metadata": {"name": f"{manifest['metadata']['name']}-{role.lower()}", "namespace": NS},
               "template": replica["template"]}
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("job,workers", [(STATIC, P5), (ELASTIC, G5_SPOT)],
                         ids=["static-efa", "elastic-spot"])
def test_manifest_is_valid_against_crd_and_kubernetes_schemas(job, workers):
    manifest = render(job, workers)
    validate_crd(manifest)
    validate_pod_templates(manifest)


def test_schema_checks_catch_a_broken_manifest():
    """The validators used above do reject bad manifests (so their passing means something)."""
    manifest = render(STATIC)
    bad_crd = copy.deepcopy(manifest)
    bad_crd["spec"]["slotsPerWorker"] = "eight"
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(bad_crd)
    bad_pod = copy.deepcopy(manifest)
    bad_pod["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["gpus"] = 8
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_pod_templates(bad_pod)


def test_static_launcher_runs_horovodrun_on_the_operator_hostnames():
    manifest = render(STATIC)
    spec = manifest["spec"]
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    hosts = "j1-worker-0.j1-worker.training.svc:8,j1-worker-1.j1-worker.training.svc:8"
    assert "command" not in launcher  # the image's entrypoint stays
    assert launcher["args"] == ["launcher", "--", "horovodrun", "--gloo", "-np", "16", "-H", hosts,
                                   "python", "-m", "train", "--steps", "10",
                                   "--data", "s3://acme-datasets/datasets/cifar",
                                   "--checkpoint-dir", "s3://acme-ckpt/checkpoints/j1"]
    assert "--host-discovery-script" not in launcher["args"]
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert spec["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert spec["slotsPerWorker"] == 8
    assert worker_hostnames(STATIC, NS) == ["j1-worker-0.j1-worker.training.svc",
                                           "j1-worker-1.j1-worker.training.svc"]


def test_elastic_launcher_uses_the_operator_discovery_script():
    manifest = render(ELASTIC, G5_SPOT)
    spec = manifest["spec"]
    cmd = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
    script = cmd[cmd.index("--host-discovery-script") + 1]
    assert script == MPI_OPERATOR_DISCOVERY_SCRIPT == "/etc/mpi/discover_hosts.sh"
    assert cmd[cmd.index("--min-np") + 1] == "8" and cmd[cmd.index("--max-np") + 1] == "16"
    assert "-H" not in cmd
    assert cmd[-1] == "--elastic"  # the trainer runs under hvd.elastic
    assert spec["launcherCreationPolicy"] == "AtStartup"
    assert spec["mpiReplicaSpecs"]["Worker"]["restartPolicy"] == "OnFailure"


def test_launcher_sits_on_on_demand_system_nodes_without_gpus():
    spec = render(STATIC)["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert spec["nodeSelector"] == {"ringtrain.io/node-pool": "system",
                                    "eks.amazonaws.com/capacityType": "ON_DEMAND"}
    assert "tolerations" not in spec  # cannot land on tainted GPU nodes
    resources = spec["containers"][0]["resources"]
    assert GPU_RESOURCE not in resources.get("requests", {}) and "limits" not in resources
    assert spec["serviceAccountName"] == SA


def test_efa_workers_request_gpus_efa_hugepages_and_shm():
    spec = render(STATIC)["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    (container,) = spec["containers"]
    for kind in ("requests", "limits"):
        res = container["resources"][kind]
        assert res[GPU_RESOURCE] == 8
        assert res[EFA_RESOURCE] == 32  # p5.48xlarge: 32 network cards
        assert res[HUGEPAGES_RESOURCE] == "5120Mi"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    (shm,) = [v for v in spec["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"] == {"medium": "Memory"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms = required["nodeSelectorTerms"]
    exprs = {e["key"]: e["values"] for e in terms[0]["matchExpressions"]}
    assert exprs == {"ringtrain.io/node-pool": ["gpu-efa"],
                     "node.kubernetes.io/instance-type": ["p5.48xlarge"],
                     "eks.amazonaws.com/capacityType": ["ON_DEMAND"]}
    anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert spec["serviceAccountName"] == SA


def test_workers_without_efa_request_no_efa_and_no_hugepages():
    worker = render(ELASTIC, G5_SPOT)["spec"]["mpiReplicaSpecs"]["Worker"]
    res = worker["template"]["spec"]["containers"][0]["resources"]
    assert res["limits"][GPU_RESOURCE] == 4
    assert EFA_RESOURCE not in res["limits"] and HUGEPAGES_RESOURCE not in res["limits"]


def test_storage_locations_image_and_run_policy():
    manifest = render(STATIC, clean_pod_policy="All", backoff_limit=2, ttl_seconds_after_finished=60)
    assert manifest["apiVersion"] == "kubeflow.org/v2beta1" and manifest["kind"] == "MPIJob"
    assert manifest["metadata"] == {"name": "j1", "namespace": NS, "labels": {"ringtrain.io/job": "j1"}}
    assert manifest["spec"]["runPolicy"] == {"cleanPodPolicy": "All", "backoffLimit": 2,
                                             "ttlSecondsAfterFinished": 60}
    assert manifest["spec"]["sshAuthMountPath"] == "/root/.ssh"
    for role in ("Launcher", "Worker"):
        (container,) = manifest["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"]
        assert container["image"] == IMAGE
        assert "env" not in container  # on AWS the pod's role supplies S3 credentials: nothing to pass


def test_image_tag_comes_from_image_version(tmp_path):
    outputs = parse_outputs("dev", {"datasetsBucket": "d", "checkpointsBucket": "c",
                                    "ecrRepositoryUrl": "123.dkr.ecr.us-east-1.amazonaws.com/ringtrain"})
    with pytest.raises(MPIJobError, match=r"image/VERSION is missing"):
        read_image_version(tmp_path)
    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "VERSION").write_text("0.4.1\n")
    expected = "123.dkr.ecr.us-east-1.amazonaws.com/ringtrain:0.4.1"
    assert image_reference(outputs, read_image_version(tmp_path)) == expected
    (tmp_path / "image" / "VERSION").write_text("two words\n")
    with pytest.raises(MPIJobError, match="expected one image tag"):
        read_image_version(tmp_path)


def test_bad_input_is_refused_with_a_clear_message():
    with pytest.raises(MPIJobError, match=r"slots_per_host=8 .* 4 GPUs per node: allowed are 1\.\.4"):
        render(STATIC, G5_SPOT)
    with pytest.raises(MPIJobError, match="cleanPodPolicy 'Sometimes': allowed are None, Running, All"):
        render(STATIC, clean_pod_policy="Sometimes")
    with pytest.raises(MPIJobError, match="backoffLimit"):
        render(STATIC, backoff_limit=-1)
    with pytest.raises(MPIJobError, match="expected <repository>:<tag>"):
        render_mpijob(STATIC, image="ringtrain", storage=STORAGE, namespace=NS, service_account=SA,
                      workers=P5, launcher=LAUNCHER)


def test_worker_nodes_from_a_node_group_and_catalog_gpu_counts():
    gpus = {"g5.12xlarge": 4, "g6.12xlarge": 4, "g5.48xlarge": 8, "m7i.large": 0}.__getitem__
    group = NodeGroupOutput(name="gpu-spot", instance_types=("g5.12xlarge", "g6.12xlarge"),
                            capacity_type="SPOT", efa_interfaces=0)
    assert worker_nodes(group, gpus) == G5_SPOT
    mixed = NodeGroupOutput(name="mixed", instance_types=("g5.12xlarge", "g5.48xlarge"), capacity_type="SPOT",
                            efa_interfaces=0)
    with pytest.raises(MPIJobError, match=r"mixes GPU counts \(g5.12xlarge=4, g5.48xlarge=8\)"):
        worker_nodes(mixed, gpus)
    cpu = NodeGroupOutput(name="cpu", instance_types=("m7i.large",), capacity_type="ON_DEMAND",
                          efa_interfaces=0)
    with pytest.raises(MPIJobError, match="has no GPUs"):
        worker_nodes(cpu, gpus)


def test_node_labels_match_what_the_node_groups_set():
    """The selectors name the labels infra/nodegroups.py actually puts on nodes (and its GPU taint)."""
    from cluster.aws import mpijob
    from infra import nodegroups

    assert mpijob.NODE_POOL_LABEL == nodegroups.NODE_POOL_LABEL
    assert mpijob.SYSTEM_POOL == nodegroups.SYSTEM_POOL
    assert nodegroups.GPU_TAINT["key"] == mpijob.GPU_RESOURCE
    assert nodegroups.GPU_TAINT["effect"] == "NO_SCHEDULE"


def test_storage_flags_come_from_the_stack_unless_the_job_names_its_own():
    job = JobSpec(name="j3", num_hosts=1, slots_per_host=1, trainer_args=("--data=synthetic",))
    cmd = render(job)["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
    assert cmd[cmd.index("train") + 1:] == ["--data=synthetic", "--checkpoint-dir", "s3://acme-ckpt/checkpoints/j1"]


def test_job_and_store_environment_reach_both_pods():
    storage = Storage(dataset_uri="s3://d/datasets/x", checkpoint_uri="s3://c/checkpoints/j4",
                      endpoint_url="http://127.0.0.1:9000", env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"})
    job = JobSpec(name="j4", num_hosts=1, env={"NCCL_DEBUG": "INFO"})
    manifest = render_mpijob(job, image=IMAGE, storage=storage, namespace=NS, service_account=SA, workers=P5,
                             launcher=LAUNCHER)
    for role in ("Launcher", "Worker"):
        (container,) = manifest["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"]
        assert container["env"] == [{"name": "AWS_ENDPOINT_URL", "value": "http://127.0.0.1:9000"},
                                    {"name": "NCCL_DEBUG", "value": "INFO"}]


def test_pod_args_are_modes_the_image_entrypoint_accepts():
    """The launcher and worker `args` parse with image/entrypoint.py's own parser."""
    import importlib.util

    path = REPO_ROOT / "image" / "entrypoint.py"
    spec = importlib.util.spec_from_file_location("ringtrain_entrypoint", path)
    entrypoint = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = entrypoint  # dataclasses resolve their module by name
    spec.loader.exec_module(entrypoint)
    replicas = render(STATIC)["spec"]["mpiReplicaSpecs"]
    def args(role):
        return replicas[role]["template"]["spec"]["containers"][0]["args"]

    launcher = entrypoint.parse_invocation(args("Launcher"), {})
    assert launcher.mode == "launcher" and not launcher.selftest
    assert list(launcher.args) == launch_args(STATIC)
    worker = entrypoint.parse_invocation(args("Worker"), {})
    assert worker.mode == "sshd"


def launch_args(job):
    from cluster.aws.mpijob import launcher_command, with_storage_args

    return launcher_command(with_storage_args(job, STORAGE), NS)


@functools.cache
def image_entrypoint():
    import importlib.util

    path = REPO_ROOT / "image" / "entrypoint.py"
    spec = importlib.util.spec_from_file_location("ringtrain_entrypoint_for_grace", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("job,workers", [(STATIC, P5), (ELASTIC, G5_SPOT)], ids=["static", "elastic-spot"])
def test_worker_grace_period_outlasts_the_entrypoints_stop(job, workers):
    """On a reclaim the kubelet SIGKILLs the worker when terminationGracePeriodSeconds ends: the entrypoint
    must have stopped the trainers (its grace) and sshd within it, or the checkpoint is cut short."""
    from cluster.aws.mpijob import STOP_GRACE_MARGIN_S, WORKER_TERMINATION_GRACE_S

    entrypoint = image_entrypoint()
    replicas = render(job, workers)["spec"]["mpiReplicaSpecs"]
    worker = replicas["Worker"]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] == WORKER_TERMINATION_GRACE_S == 120  # the spot notice
    default_grace = entrypoint.parse_stop_grace({})
    assert default_grace + entrypoint.SSHD_STOP_S < WORKER_TERMINATION_GRACE_S - 5
    assert entrypoint.SSHD_STOP_S < STOP_GRACE_MARGIN_S
    # The launcher is not on spot capacity and stops with horovodrun: the default grace serves it.
    assert "terminationGracePeriodSeconds" not in replicas["Launcher"]["template"]["spec"]


def test_a_stop_grace_the_job_sets_must_fit_the_pods_grace_period():
    ok = JobSpec(name="j5", num_hosts=1, env={"RINGTRAIN_STOP_GRACE_S": "110"})
    container = render(ok)["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert {"name": "RINGTRAIN_STOP_GRACE_S", "value": "110"} in container["env"]
    for bad in ("111", "600", "soon", "-1"):
        job = JobSpec(name="j5", num_hosts=1, env={"RINGTRAIN_STOP_GRACE_S": bad})
        message = rf"RINGTRAIN_STOP_GRACE_S='{bad}': allowed are 0\.\.110 seconds"
        with pytest.raises(MPIJobError, match=message):
            render(job)
