"""AwsBackend against the stack's real exports (the program run offline), EKS scaling against a moto
server on loopback, and the run flow's guaranteed teardown on failure and Ctrl-C.

The parts that need a live EKS cluster (kubectl apply, logs, MPIJob status) skip visibly here."""

from __future__ import annotations

import json
import os
import shutil
import stat

import boto3
import pytest

from cluster.aws.backend import AwsBackend, check_fits_group, nodes_needed
from cluster.aws.kubectl import (
    Kubectl,
    job_pods,
    launcher_exit_code,
    mpijob_state,
    pending_reason,
    pod_problem,
    ready_nodes,
)
from cluster.aws.outputs import OutputsError, parse_outputs
from cluster.backend import BackendError
from cluster.flow import FlowInterrupted, FlowOptions, run_job
from cluster.job import JobSpec, trainer_config
from cluster.local.objectstore import LOCAL_CREDENTIALS
from tests.summaries import run_summary


@pytest.fixture(scope="module")
def dev_exports(dev_outputs_file):
    """What `pulumi stack output` would give for the dev stack: the program's exports under mocks (run
    once per session: tests/conftest.py)."""
    return json.loads(dev_outputs_file.read_text())


class RecordingStack:
    def __init__(self, name, outputs):
        self.name = name
        self.calls = []
        self.config = {}
        self._outputs = dict(outputs)

    def set_config(self, key, value):
        self.config[key] = value

    def get_config(self, key):
        return self.config.get(key)

    def up(self):
        self.calls.append(("up", dict(self.config)))

    def destroy(self):
        self.calls.append(("destroy", dict(self.config)))

    def outputs(self):
        if self.config.get("ringtrain:compute") != "false":
            return dict(self._outputs)
        data = ("datasetsBucket", "checkpointsBucket", "ecrRepositoryUrl")
        return {k: v for k, v in self._outputs.items() if k in data}

    def last_update(self):
        return None


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """Credentials boto3 finds, no real AWS reachable (IMDS off, config files empty)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))


def backend_for(exports, tmp_path, **kw):
    ops = RecordingStack("dev", exports)
    backend = AwsBackend("dev", kubeconfig=tmp_path / "kubeconfig", ops_factory=lambda s: ops,
                         log=lambda m: None, **kw)
    return backend, ops


def test_the_stack_exports_parse_into_outputs(dev_exports):
    out = parse_outputs("dev", dev_exports)
    assert out.has_compute and out.cluster_name == dev_exports["clusterName"]
    assert (out.training_namespace, out.training_service_account) == ("training", "trainer")
    groups = {g.name: g for g in out.node_groups}
    assert set(groups) == {"a10g-spot", "l4-spot"}
    assert groups["a10g-spot"].instance_types == ("g5.12xlarge", "g5.24xlarge")
    assert groups["a10g-spot"].eks_name == "ringtrain-dev-a10g-spot"
    with pytest.raises(OutputsError, match="several GPU node groups \\(a10g-spot, l4-spot\\): name one"):
        out.node_group(None)
    with pytest.raises(OutputsError, match="'h100' is not in stack 'dev': allowed are a10g-spot, l4-spot"):
        out.node_group("h100")
    data_only = {k: dev_exports[k] for k in ("datasetsBucket", "checkpointsBucket", "ecrRepositoryUrl")}
    with pytest.raises(OutputsError, match="no compute outputs .* run `scripts/up --stack dev` first"):
        parse_outputs("dev", data_only).node_group("a10g-spot")
    with pytest.raises(OutputsError, match="lacks the outputs datasetsBucket"):
        parse_outputs("dev", {})


def test_render_uses_the_stack_outputs_and_image_version(dev_exports, tmp_path):
    backend, _ = backend_for(dev_exports, tmp_path, node_group="a10g-spot", dataset="cifar")
    job = JobSpec(name="r1", num_hosts=2, slots_per_host=4)
    manifest = backend.render(job)
    version = (backend.repo_root / "image" / "VERSION").read_text().strip()
    worker = manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    (container,) = worker["containers"]
    assert container["image"] == f"{dev_exports['ecrRepositoryUrl']}:{version}"
    assert worker["serviceAccountName"] == "trainer" and manifest["metadata"]["namespace"] == "training"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4  # g5.12xlarge / g5.24xlarge: 4 GPUs
    cmd = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
    assert cmd[cmd.index("--data") + 1] == "s3://acme-ringtrain-dev-datasets/datasets/cifar"
    assert cmd[cmd.index("--checkpoint-dir") + 1] == "s3://acme-ringtrain-dev-checkpoints/checkpoints/r1"
    storage = backend.storage("r1")
    # The region in the pods' environment: at IMDS hop limit 1 they cannot ask the instance.
    region = {"AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}
    assert (storage.dataset_uri, storage.env) == ("s3://acme-ringtrain-dev-datasets/datasets/cifar", region)
    for spec in manifest["spec"]["mpiReplicaSpecs"].values():
        env = {e["name"]: e["value"] for e in spec["template"]["spec"]["containers"][0]["env"]}
        assert env.items() >= region.items()


def test_up_turns_compute_on_and_writes_the_kubeconfig_0600(dev_exports, tmp_path, aws_env):
    backend, ops = backend_for(dev_exports, tmp_path)
    backend.up()
    assert ops.calls == [("up", {"ringtrain:compute": "true"})]
    mode = stat.S_IMODE(os.stat(tmp_path / "kubeconfig").st_mode)
    assert mode == 0o600
    assert (tmp_path / "kubeconfig").read_text() == dev_exports["kubeconfig"]
    backend.down()
    backend.down()  # safe twice
    assert ops.calls[1:] == [("up", {"ringtrain:compute": "false"})] * 2


def test_down_without_reaching_the_stack_touches_nothing(dev_exports, tmp_path):
    def unreachable(stack):
        raise AssertionError("down() must not create a stack session it never had")

    AwsBackend("dev", ops_factory=unreachable).down()


def test_job_size_rules():
    assert nodes_needed(JobSpec(name="a", num_hosts=4)) == 4
    assert nodes_needed(JobSpec(name="a", num_hosts=4, elastic=True, min_hosts=2)) == 2
    out = parse_outputs("s", {"datasetsBucket": "d", "checkpointsBucket": "c", "ecrRepositoryUrl": "e",
                              "clusterName": "k", "trainingNamespace": "n", "trainingServiceAccount": "t",
                              "nodeGroups": {"g": {"instanceTypes": ["g5.12xlarge"], "capacityType": "SPOT",
                                                   "efaInterfaces": 0}}})
    with pytest.raises(BackendError, match="5 hosts but node group 'g' has maxSize 4: allowed are 1..4"):
        check_fits_group(JobSpec(name="a", num_hosts=5), out.node_group("g"), 4)


def test_kubectl_json_is_read_correctly():
    cond = lambda t, s="True", m="": {"type": t, "status": s, "message": m}  # noqa: E731
    assert mpijob_state({}) == ("Pending", "")
    def state(*conditions):
        return mpijob_state({"status": {"conditions": list(conditions)}})

    assert state(cond("Created"), cond("Running", m="up")) == ("Running", "up")
    assert state(cond("Running", "False"), cond("Succeeded", m="done")) == ("Succeeded", "done")
    assert state(cond("Failed", m="backoff")) == ("Failed", "backoff")
    node = lambda ready, unsched=False: {"spec": {"unschedulable": unsched},  # noqa: E731
                                         "status": {"conditions": [{"type": "Ready", "status": ready}]}}
    nodes = [node("True"), node("False"), node("True", unsched=True), node("True")]
    assert ready_nodes({"items": nodes}) == 2
    term = lambda code, at: {"status": {"containerStatuses": [  # noqa: E731
        {"state": {"terminated": {"exitCode": code, "finishedAt": at}}}]}}
    assert launcher_exit_code({"items": []}) is None
    pods = [term(75, "2026-01-01T00:00:01Z"), term(0, "2026-01-01T00:00:09Z")]
    assert launcher_exit_code({"items": pods}) == 0  # the latest attempt counts


def _pod(name, *, phase="Pending", owner="mpijob-uid", conditions=(), init=(), containers=(), **meta):
    return {"metadata": {"name": name, "ownerReferences": [{"uid": owner}], **meta},
            "status": {"phase": phase, "conditions": list(conditions), "initContainerStatuses": list(init),
                       "containerStatuses": list(containers)}}


def test_pod_problems_name_the_pod_and_the_reason():
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": "0/2 nodes are available: 2 Insufficient cpu."}
    assert pod_problem(_pod("j-worker-1", conditions=[unschedulable])) == \
        "pod j-worker-1 cannot be scheduled: 0/2 nodes are available: 2 Insufficient cpu."
    failed_init = {"name": "selftest", "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}
    assert pod_problem(_pod("j-worker-0", phase="Failed", init=[failed_init])) == \
        "pod j-worker-0: init container selftest failed with exit code 3 (Error)"
    restarting = {"name": "selftest", "lastState": {"terminated": {"exitCode": 1}},
                  "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    assert "init container selftest failed with exit code 1" in pod_problem(_pod("w", init=[restarting]))
    pull = {"name": "worker", "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}}}
    assert pod_problem(_pod("w", containers=[pull])) == "pod w: container worker ErrImagePull: not found"
    creating = {"name": "worker", "state": {"waiting": {"reason": "ContainerCreating"}}}
    assert pod_problem(_pod("w", containers=[creating])) is None   # still starting
    assert pending_reason(_pod("w", containers=[creating])) == "container worker waiting: ContainerCreating"
    assert pod_problem(_pod("w", phase="Running")) is None


def test_a_jobs_pods_are_selected_by_its_uid_never_a_terminating_one():
    launcher_job = {"metadata": {"uid": "job-uid", "ownerReferences": [{"uid": "mpijob-uid"}]}}
    old_launcher = _pod("j-launcher-old", phase="Failed", owner="old-job-uid")
    terminating = _pod("j-worker-0", phase="Running", deletionTimestamp="2026-12-07T00:00:00Z")
    ours = [_pod("j-launcher-new", owner="job-uid"), _pod("j-worker-0"), _pod("j-worker-1")]
    launchers, workers = job_pods({"items": [old_launcher, terminating, *ours]}, "mpijob-uid", launcher_job)
    assert [p["metadata"]["name"] for p in launchers] == ["j-launcher-new"]
    assert [p["metadata"]["name"] for p in workers] == ["j-worker-0", "j-worker-1"]
    assert "deletionTimestamp" not in workers[0]["metadata"]
    old_job = {"metadata": {"uid": "old-job-uid", "ownerReferences": [{"uid": "old-mpijob"}]}}
    assert job_pods({"items": [old_launcher]}, "mpijob-uid", old_job) == ([], [])


def test_nodes_count_once_the_device_plugins_advertise_their_resources():
    def node(gpus):
        return {"status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                           "conditions": [{"type": "Ready", "status": "True"}]}}

    nodes = {"items": [node(4), node(0), node(4)]}
    assert ready_nodes(nodes) == 3 and ready_nodes(nodes, {"nvidia.com/gpu": 4}) == 2


def test_kubectls_own_errors_are_not_log_lines(tmp_path, monkeypatch):
    """Defect: follow_logs merged kubectl's stderr into the log and ignored its exit status."""
    from cluster.aws.kubectl import LogStreamError
    from tests.cluster.kubectl_standin import FakeCluster

    FakeCluster(tmp_path / "cluster").install(monkeypatch)
    lines = []
    with pytest.raises(LogStreamError, match=r'exited 1: Error from server \(NotFound\): pods "j-launcher-x" '
                                             "not found"):
        lines.extend(Kubectl(tmp_path / "kubeconfig").follow_logs("training", "j-launcher-x", "launcher"))
    assert lines == []


def test_kubectl_missing_is_a_clear_error(monkeypatch, tmp_path, dev_exports):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BackendError, match=r"`kubectl` is not on PATH: install kubectl"):
        Kubectl(tmp_path / "kubeconfig")
    backend, _ = backend_for(dev_exports, tmp_path)
    (tmp_path / "kubeconfig").write_text("stale: from an earlier cluster\n")
    with pytest.raises(BackendError, match=r"`kubectl` is not on PATH"):
        backend.job_status("j1")
    assert (tmp_path / "kubeconfig").read_text() == dev_exports["kubeconfig"]
    assert (tmp_path / "kubeconfig").stat().st_mode & 0o777 == 0o600  # written from the outputs first


@pytest.fixture
def moto_aws(object_store, aws_env, monkeypatch, dev_exports):
    """boto3 (S3 and EKS) pointed at the session's moto server on loopback, with the dev stack's cluster,
    node group and buckets in it."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", object_store.endpoint_url)
    eks = boto3.client("eks")
    cluster = dev_exports["clusterName"]
    if cluster not in eks.list_clusters()["clusters"]:
        eks.create_cluster(name=cluster, roleArn="arn:aws:iam::123456789012:role/eks",
                           resourcesVpcConfig={"subnetIds": ["subnet-1", "subnet-2"]})
        eks.create_nodegroup(clusterName=cluster, nodegroupName="ringtrain-dev-a10g-spot",
                             nodeRole="arn:aws:iam::123456789012:role/node", subnets=["subnet-1"],
                             scalingConfig={"minSize": 0, "maxSize": 4, "desiredSize": 0})
    else:
        eks.update_nodegroup_config(clusterName=cluster, nodegroupName="ringtrain-dev-a10g-spot",
                                    scalingConfig={"desiredSize": 0})
    s3 = boto3.client("s3")
    for bucket in (dev_exports["datasetsBucket"], dev_exports["checkpointsBucket"]):
        if bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
            s3.create_bucket(Bucket=bucket)
    return eks


def _desired(eks, cluster):
    return eks.describe_nodegroup(clusterName=cluster, nodegroupName="ringtrain-dev-a10g-spot")[
        "nodegroup"]["scalingConfig"]["desiredSize"]


def test_run_flow_scales_then_tears_down_when_the_cluster_is_unreachable(dev_exports, tmp_path, moto_aws,
                                                                         monkeypatch):
    """`run --backend aws`: up, dataset, scale the node group (EKS API), then kubectl is missing: the run
    fails with that message and the compute is taken down anyway."""
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                               if not (shutil.which("kubectl", path=p))))
    backend, ops = backend_for(dev_exports, tmp_path, node_group="a10g-spot", dataset="flow-ds")
    boto3.client("s3").put_object(Bucket=dev_exports["datasetsBucket"], Key="datasets/flow-ds/index.json",
                                  Body=b"{}")
    job = JobSpec(name="flow1", num_hosts=2, slots_per_host=4, trainer=trainer_config(("--steps", "5")))
    lines = []
    with pytest.raises(BackendError, match="`kubectl` is not on PATH"):
        run_job(backend, job, FlowOptions(progress_bar=False), out=lines.append)
    assert _desired(moto_aws, dev_exports["clusterName"]) == 2
    assert ops.calls[0] == ("up", {"ringtrain:compute": "true"})
    assert ops.calls[-1] == ("up", {"ringtrain:compute": "false"})  # teardown ran
    assert not any("submitted" in line for line in lines)


def test_run_flow_tears_down_on_ctrl_c(dev_exports, tmp_path, moto_aws):
    def interrupted(kubeconfig):
        raise KeyboardInterrupt  # Ctrl-C while waiting for the GPU nodes

    backend, ops = backend_for(dev_exports, tmp_path, node_group="a10g-spot", dataset="flow-ds",
                               kubectl_factory=interrupted)
    boto3.client("s3").put_object(Bucket=dev_exports["datasetsBucket"], Key="datasets/flow-ds/index.json",
                                  Body=b"{}")
    with pytest.raises(FlowInterrupted):
        run_job(backend, JobSpec(name="flow2", num_hosts=1, slots_per_host=4),
                FlowOptions(progress_bar=False), out=lambda m: None)
    assert ops.calls[-1] == ("up", {"ringtrain:compute": "false"})


def test_submit_refuses_more_hosts_than_the_group_allows_before_touching_the_cluster(
        dev_exports, tmp_path, moto_aws):
    def no_cluster(kubeconfig):
        raise AssertionError("the cluster must not be touched")

    backend, _ = backend_for(dev_exports, tmp_path, node_group="a10g-spot", kubectl_factory=no_cluster)
    with pytest.raises(BackendError, match="needs 5 hosts but node group 'a10g-spot' has maxSize 4"):
        backend.submit(JobSpec(name="big", num_hosts=5, slots_per_host=4))
    assert _desired(moto_aws, dev_exports["clusterName"]) == 0


def test_submit_logs_wait_on_a_live_cluster():
    if shutil.which("kubectl") is None or not os.environ.get("RINGTRAIN_AWS_STACK"):
        pytest.skip("needs a live EKS stack: kubectl on PATH, AWS credentials and "
                    "RINGTRAIN_AWS_STACK=<stack> (submits a 1-host job to it)")
    stack = os.environ["RINGTRAIN_AWS_STACK"]
    backend = AwsBackend(stack)
    job = JobSpec(name="ringtrain-smoke", num_hosts=1, trainer=trainer_config(("--steps", "20")))
    handle = backend.submit(job)
    lines = list(backend.logs(handle))
    result = backend.wait(handle, timeout_s=1800)
    assert result.succeeded, (result.message, lines[-20:])
    assert result.summary is not None and result.summary.steps == 20


# What horovodrun printed when host-1's worker stopped on SIGTERM after rank 0's checkpoint (a spot reclaim),
# and it exited 1: the launcher pod's exit code says nothing more than "failed".
RECLAIMED_LOG = [
    "[0]<stdout>:step 150 loss 0.61",
    "[0]<stdout>:" + run_summary(steps=153, interrupted=True, resumed_from_step=None).line(),
    "Process 1 exit with status code 75.",
    "Process 0 exit with status code 143.",
]


def test_a_reclaimed_aws_job_maps_to_the_resumable_exit_code_so_run_resubmits():
    """Defect: the AWS backend took the launcher's exit code (1), so `run --backend aws` never resubmitted.
    It now maps the launcher's code and log with the local backend's function (cluster.exit_codes)."""
    from cluster.aws.backend import job_result
    from train.contract import EXIT_INTERRUPTED_RESUMABLE

    result = job_result("j1", "Failed", "launcher exited 1", 1, RECLAIMED_LOG)
    assert result.exit_code == EXIT_INTERRUPTED_RESUMABLE and not result.succeeded
    assert result.summary.steps == 153
    bad = job_result("j1", "Failed", "", 1, ["[1]<stderr>:train: error: --lr -1.0: must be > 0",
                                             "Process 1 exit with status code 2."])
    assert bad.exit_code == 2 and "train: error: --lr -1.0" in bad.message
    ok = job_result("j1", "Succeeded", "", 0, ["[0]<stdout>:" + run_summary(steps=20).line()])
    assert ok.succeeded and ok.exit_code == 0 and ok.message == ""
    gone = job_result("j1", "Failed", "BackoffLimitExceeded", None, [])
    assert gone.exit_code == 1 and "BackoffLimitExceeded" in gone.message


def test_the_aws_and_local_backends_share_one_exit_code_mapping():
    import cluster.aws.backend as aws
    import cluster.exit_codes as exit_codes
    import cluster.local.backend as local

    assert aws.job_exit_code is exit_codes.job_exit_code is local.job_exit_code


def test_a_submitted_job_names_its_node_group_for_the_run_cost(dev_exports, tmp_path, moto_aws, monkeypatch):
    """The handle carries the node group, its types and capacity type: the flow's attempt records
    them and cluster/run_cost.py prices its node-hours from them."""
    from tests.cluster.kubectl_standin import FakeCluster

    FakeCluster(tmp_path / "cluster").install(monkeypatch).add_nodes("a10g-spot", 2, {"nvidia.com/gpu": 4})
    backend, _ = backend_for(dev_exports, tmp_path, node_group="a10g-spot")
    handle = backend.submit(JobSpec(name="priced", num_hosts=2, slots_per_host=4))
    group = backend.outputs().node_group("a10g-spot")
    assert handle.details["node_group"] == "a10g-spot"
    assert handle.details["instance_types"] == list(group.instance_types) and group.instance_types
    assert handle.details["capacity_type"] == group.capacity_type == "SPOT"
    assert len(handle.details["hosts"]) == 2
