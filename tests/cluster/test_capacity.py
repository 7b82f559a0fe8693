"""Capacity fallback (`--node-group a,b,c --capacity-timeout S`) and the AWS preflight floor: the pure
rules directly, the AWS path through the kubectl stand-in (nodes) and a moto server (EKS scaling)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cluster.aws.backend as aws_backend
from cluster.aws.backend import PREFLIGHT_FLOOR_SHARE, AwsBackend, busbw_floor
from cluster.aws.capacity import (
    CapacityWait,
    NodeGroupsError,
    check_against_stack_config,
    choose_groups,
    exhausted_message,
    fallback_message,
    node_wait_s,
    parse_node_groups,
    running_message,
)
from cluster.aws.outputs import parse_outputs
from cluster.backend import BackendError
from cluster.flow import FlowOptions, format_summary, run_job
from cluster.job import JobSpec, trainer_config
from cluster.mpijob import launcher_container
from cluster.run_cost import format_costs, node_group_costs
from cluster.usage import UsageError
from infra.catalog import CatalogError, load_catalog, parse_catalog
from tests.cluster.kubectl_standin import FakeCluster, JobScript
from tests.cluster.test_aws_backend import RecordingStack, aws_env, dev_exports, moto_aws  # noqa: F401
from tests.summaries import run_summary

REPO_ROOT = Path(__file__).resolve().parents[2]
RINGTRAIN = str(Path(sys.executable).parent / "ringtrain")
CATALOG = load_catalog().instance_types
GPU_NODE = {"nvidia.com/gpu": 4}
JOB = JobSpec(name="cap", num_hosts=2, slots_per_host=4,
              trainer=trainer_config(("--data", "s3://d/x", "--steps", "20")))
DONE_LOG = ["[0]<stdout>:" + run_summary(steps=20).line()]


# -- the pure rules ---------------------------------------------------------------------------------

def test_node_group_lists_parse_in_order():
    assert parse_node_groups("a10g-spot, l4-spot ,od") == ("a10g-spot", "l4-spot", "od")
    assert parse_node_groups("a10g-spot") == ("a10g-spot",)
    assert parse_node_groups(None) == parse_node_groups("") == ()
    assert parse_node_groups(["a", "b"]) == ("a", "b")
    with pytest.raises(NodeGroupsError, match=r"--node-group 'a,,b': an empty name; allowed is a "
                                              r"comma-separated list"):
        parse_node_groups("a,,b")
    with pytest.raises(NodeGroupsError, match="a named twice"):
        parse_node_groups("a,b,a")


def _outputs(groups: dict) -> object:
    return parse_outputs("s", {"datasetsBucket": "d", "checkpointsBucket": "c",
                               "ecrRepositoryUrl": "123456789012.dkr.ecr.us-east-1.amazonaws.com/r",
                               "clusterName": "k", "trainingNamespace": "n", "trainingServiceAccount": "t",
                               "nodeGroups": groups})


SPOT_A10G = {"instanceTypes": ["g5.12xlarge"], "capacityType": "SPOT", "efaInterfaces": 0}
SPOT_L4 = {"instanceTypes": ["g6.12xlarge", "g6.24xlarge"], "capacityType": "SPOT", "efaInterfaces": 0}
OD_A10G = {"instanceTypes": ["g5.12xlarge"], "capacityType": "ON_DEMAND", "efaInterfaces": 0}


def test_groups_are_tried_in_the_order_named_and_every_name_must_exist():
    groups = _outputs({"a": SPOT_A10G, "b": SPOT_L4, "od": OD_A10G}).node_groups
    assert [g.name for g in choose_groups(("b", "od", "a"), groups, "s")] == ["b", "od", "a"]
    with pytest.raises(NodeGroupsError) as err:
        choose_groups(("a", "h100", "p5"), groups, "s")
    assert str(err.value) == "node groups h100, p5 are not in stack 's': allowed are a, b, od"
    assert isinstance(err.value, UsageError) and isinstance(err.value, BackendError)   # exit 2 from the CLI
    with pytest.raises(NodeGroupsError, match=r"several GPU node groups \(a, b, od\): name one"):
        choose_groups((), groups, "s")
    (only,) = _outputs({"a": SPOT_A10G}).node_groups
    assert choose_groups((), (only,), "s") == (only,)


def test_the_wait_per_group_and_the_messages():
    assert node_wait_s(None, 1800) == 1800          # no --capacity-timeout: the startup timeout
    assert node_wait_s(600, 1800) == 600
    assert node_wait_s(3600, 1800) == 1800          # never past the startup timeout
    a, b = _outputs({"a": SPOT_A10G, "b": SPOT_L4}).node_groups
    wait = CapacityWait("a", ready=1, needed=2, waited_s=600.4, scaled_back_to=0)
    assert fallback_message(wait, b, CATALOG, 2) == (
        "node group a 1/2 nodes Ready after 600 s, scaled back to 0 (no capacity?): trying node group b "
        "(g6.12xlarge, g6.24xlarge, SPOT; g6.24xlarge at $6.68/h per node, $13.35/h for 2 (priced at its "
        "most expensive type; spot at on-demand list price (upper bound)))")
    assert running_message(b, 2, [wait], CATALOG) == (
        "node group b (g6.12xlarge, g6.24xlarge, SPOT) has the job's nodes: g6.24xlarge at $6.68/h per "
        "node, $13.35/h for 2 (priced at its most expensive type; spot at on-demand list price (upper "
        "bound)); passed over for want of capacity: a 1/2 nodes Ready after 600 s, scaled back to 0")
    assert running_message(a, 1, [], CATALOG).endswith(
        "has the job's nodes: g5.12xlarge at $5.67/h per node, $5.67/h for 1 (spot at on-demand list price "
        "(upper bound))")
    assert exhausted_message([wait, CapacityWait("b", 0, 2, 600.0, None)]) == (
        "no node group had the job's nodes Ready in time (spot capacity or quota?): a 1/2 nodes Ready "
        "after 600 s, scaled back to 0; b 0/2 nodes Ready after 600 s; nothing was submitted")


def test_names_are_checked_against_the_stack_config_before_anything_is_stood_up():
    check_against_stack_config(("l4-spot", "a10g-spot"), "dev")
    with pytest.raises(NodeGroupsError, match=r"node group h100 is not in stack 'dev' \(Pulumi.dev.yaml\): "
                                              r"allowed are a10g-spot, l4-spot"):
        check_against_stack_config(("a10g-spot", "h100"), "dev")
    check_against_stack_config(("anything",), "no-such-stack")   # no config here: the backend checks later


# -- the preflight floor -----------------------------------------------------------------------------

def test_the_busbw_floor_comes_from_the_catalogs_reference_for_multi_node_jobs():
    p5 = CATALOG["p5.48xlarge"]
    # aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/README.md: 2 x p5.48xlarge,
    # all_reduce_perf at 2147483648 B, out-of-place busbw 443.72 GB/s.
    assert p5.allreduce_busbw_gbps == 443.72
    assert "awsome-distributed-training micro-benchmarks/nccl-tests/README.md" in p5.allreduce_busbw_source
    assert busbw_floor(["p5.48xlarge"], 2, CATALOG) == pytest.approx(443.72e9 * PREFLIGHT_FLOOR_SHARE)
    assert busbw_floor(["p5.48xlarge"], 1, CATALOG) is None            # one node: no network figure
    assert busbw_floor(["g5.12xlarge"], 2, CATALOG) is None            # no reference: report only
    assert busbw_floor(["p5.48xlarge", "g5.12xlarge"], 4, CATALOG) is None
    assert busbw_floor(["p5.48xlarge", "p4de.24xlarge"], 2, CATALOG) == pytest.approx(78.33e9 * 0.5)
    assert busbw_floor(["p9.unknown"], 2, CATALOG) is None
    # A floor half the reference fails a link at a quarter of it (skypilot issue 8391: ~20 of ~78 GB/s).
    assert 20e9 < busbw_floor(["p4de.24xlarge"], 2, CATALOG) < 0.9 * 78.33e9


def test_a_reference_figure_needs_its_source():
    doc = {"fixedCosts": {"eksControlPlaneUsdPerHour": 0.1, "natGatewayUsdPerHour": 0.045,
                          "priceSource": "x", "priceDate": "2025"},
           "instanceTypes": {"p5.48xlarge": {
               "gpus": 8, "gpuModel": "H100", "gpuMemoryGiB": 80, "vcpus": 192, "memoryGiB": 2048,
               "efa": True, "networkCards": 32, "onDemandUsdPerHour": 55.04, "priceSource": "x",
               "priceDate": "2025",
               "allreduceBusbwGbps": 443.72}}}
    with pytest.raises(CatalogError, match="allreduceBusbwGbps needs its allreduceBusbwSource"):
        parse_catalog(doc)


def test_the_aws_backend_gives_the_floor_of_its_groups(dev_exports, tmp_path):  # noqa: F811
    p5 = {"instanceTypes": ["p5.48xlarge"], "capacityType": "CAPACITY_BLOCK", "efaInterfaces": 32,
          "eksNodeGroupName": "ringtrain-dev-p5"}
    exports = {**dev_exports, "nodeGroups": {**dev_exports["nodeGroups"], "p5": p5}}
    ops = RecordingStack("dev", exports)

    def backend(groups):
        return AwsBackend("dev", node_group=groups, kubeconfig=tmp_path / "kc", ops_factory=lambda s: ops)

    assert backend("p5").preflight_floor(JobSpec(name="j", num_hosts=2)) == pytest.approx(221.86e9)
    assert backend("p5").preflight_floor(JobSpec(name="j", num_hosts=1)) is None
    assert backend("a10g-spot,l4-spot").preflight_floor(JobSpec(name="j", num_hosts=2)) is None
    assert backend("p5,a10g-spot").preflight_floor(JobSpec(name="j", num_hosts=2)) is None


# -- the AWS path: stand-in nodes, moto EKS ----------------------------------------------------------

@pytest.fixture
def two_groups(moto_aws, dev_exports, tmp_path, monkeypatch):  # noqa: F811
    """Both dev GPU groups in EKS at desired size 0, and a stand-in cluster."""
    monkeypatch.setattr(aws_backend, "POLL_S", 0.05)
    cluster = dev_exports["clusterName"]
    eks_names = {n: g["eksNodeGroupName"] for n, g in dev_exports["nodeGroups"].items()}
    existing = moto_aws.list_nodegroups(clusterName=cluster)["nodegroups"]
    for eks_name in eks_names.values():
        if eks_name not in existing:
            moto_aws.create_nodegroup(clusterName=cluster, nodegroupName=eks_name,
                                      nodeRole="arn:aws:iam::123456789012:role/node", subnets=["subnet-1"],
                                      scalingConfig={"minSize": 0, "maxSize": 4, "desiredSize": 0})
        moto_aws.update_nodegroup_config(clusterName=cluster, nodegroupName=eks_name,
                                         scalingConfig={"desiredSize": 0})

    def desired():
        return {n: moto_aws.describe_nodegroup(clusterName=cluster, nodegroupName=e)["nodegroup"][
            "scalingConfig"]["desiredSize"] for n, e in eks_names.items()}

    return FakeCluster(tmp_path / "cluster").install(monkeypatch), desired


def _backend(exports, tmp_path, **kw):
    messages: list[str] = []
    backend = AwsBackend("dev", kubeconfig=tmp_path / "kubeconfig", ops_factory=lambda s: RecordingStack(
        "dev", exports), log=messages.append, **kw)
    return backend, messages


def _pools(mpijob):
    terms = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [e["values"] for t in terms for e in t["matchExpressions"] if e["key"] == "ringtrain.io/node-pool"]


def test_no_capacity_in_the_first_group_runs_the_job_on_the_next(two_groups, dev_exports, tmp_path):  # noqa: F811
    """a10g-spot's nodes never become Ready (no spot capacity); l4-spot's do: the job runs there, a10g-spot
    is scaled back to 0, the log and the run's cost lines say where it ran and at what price."""
    fake, desired = two_groups
    fake.add_nodes("a10g-spot", 2, GPU_NODE, ready=False)
    fake.add_nodes("l4-spot", 2, GPU_NODE)
    fake.plan(JobScript(log=DONE_LOG, exit_code=0))
    backend, messages = _backend(dev_exports, tmp_path, node_group="a10g-spot,l4-spot",
                                 capacity_timeout_s=1.0)
    result = run_job(backend, JOB, FlowOptions(progress_bar=False, dataset=None), out=lambda m: None)
    assert result.succeeded, messages
    assert desired() == {"a10g-spot": 0, "l4-spot": 2}
    assert "node group a10g-spot: desired size 0 -> 2" in messages
    assert "node group a10g-spot: desired size back to 0" in messages
    fallback = [m for m in messages if m.startswith("node group a10g-spot 0/2 nodes Ready after ")]
    assert fallback and "scaled back to 0 (no capacity?): trying node group l4-spot" in fallback[0]
    assert any(m.startswith("node group l4-spot (g6.12xlarge, g6.24xlarge, SPOT) has the job's nodes: "
                            "g6.24xlarge at $6.68/h per node, $13.35/h for 2") for m in messages), messages
    (mpijob,) = fake.mpijobs()
    assert _pools(mpijob["manifest"]) == [["l4-spot"]]
    (attempt,) = result.attempts
    assert (attempt.node_group, attempt.capacity_type) == ("l4-spot", "SPOT")
    assert "node group l4-spot (SPOT):" in format_costs(node_group_costs(result.attempts, CATALOG))


def test_a_later_submit_on_the_preferred_group_scales_the_fallback_back(two_groups, dev_exports, tmp_path):  # noqa: F811
    fake, desired = two_groups
    fake.add_nodes("l4-spot", 2, GPU_NODE)
    fake.plan(JobScript(log=DONE_LOG, exit_code=0), JobScript(log=DONE_LOG, exit_code=0))
    backend, messages = _backend(dev_exports, tmp_path, node_group="a10g-spot,l4-spot",
                                 capacity_timeout_s=0.5, startup_timeout_s=100.0)
    submitted = time.monotonic()
    first = backend.submit(JOB)
    assert first.details["node_group"] == "l4-spot"
    # the start is timed from l4-spot's scale-up, after the 0.5 s on a10g-spot
    assert first.details["startup_deadline"] >= submitted + 0.5 + 100.0
    fake.add_nodes("a10g-spot", 2, GPU_NODE)    # spot A10G capacity is back for the resubmission
    assert backend.submit(JOB).details["node_group"] == "a10g-spot"
    assert desired() == {"a10g-spot": 2, "l4-spot": 0}, messages


def test_no_group_with_capacity_fails_with_every_group_scaled_back(two_groups, dev_exports, tmp_path):  # noqa: F811
    fake, desired = two_groups
    fake.add_nodes("a10g-spot", 2, GPU_NODE, ready=False)
    fake.add_nodes("l4-spot", 1, GPU_NODE)     # one of the two nodes the job needs
    backend, _ = _backend(dev_exports, tmp_path, node_group="a10g-spot,l4-spot", capacity_timeout_s=0.5)
    with pytest.raises(BackendError, match=r"no node group had the job's nodes Ready in time \(spot "
                                           r"capacity or quota\?\): a10g-spot 0/2 nodes Ready after \d+ s, "
                                           r"scaled back to 0; l4-spot 1/2 nodes Ready after \d+ s, scaled "
                                           r"back to 0; nothing was submitted"):
        backend.submit(JOB)
    assert desired() == {"a10g-spot": 0, "l4-spot": 0}
    assert fake.mpijobs() == []


def test_one_group_without_nodes_is_scaled_back_too(two_groups, dev_exports, tmp_path):  # noqa: F811
    _, desired = two_groups
    backend, _ = _backend(dev_exports, tmp_path, node_group="a10g-spot", startup_timeout_s=0.5)
    with pytest.raises(BackendError, match=r"node group 'a10g-spot': 0 of 2 nodes Ready with 4 "
                                           r"nvidia.com/gpu after 0.5 s \(spot capacity or quota\?\); "
                                           "scaled back to 0; nothing was submitted"):
        backend.submit(JOB)
    assert desired() == {"a10g-spot": 0, "l4-spot": 0}


def test_a_group_not_in_the_stack_stops_submit_before_anything_is_scaled(two_groups, dev_exports, tmp_path):  # noqa: F811
    fake, desired = two_groups
    backend, _ = _backend(dev_exports, tmp_path, node_group="a10g-spot,h100,p5")
    with pytest.raises(NodeGroupsError, match="node groups h100, p5 are not in stack 'dev': allowed are "
                                              "a10g-spot, l4-spot"):
        backend.submit(JOB)
    assert desired() == {"a10g-spot": 0, "l4-spot": 0} and fake.calls() == []


# -- the commands ----------------------------------------------------------------------------------

def test_unknown_groups_are_one_message_and_exit_2_in_both_commands(dev_outputs_file, tmp_path):
    def ringtrain(*args):
        return subprocess.run([RINGTRAIN, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PATH": str(Path(sys.executable).parent),
                                   "HOME": str(tmp_path)})

    submit = ringtrain("submit", "--stack", "dev", "--outputs", str(dev_outputs_file), "--dry-run",
                       "--job-name", "j", "--node-group", "a10g-spot,h100,p5")
    assert submit.returncode == 2, submit.stderr
    assert submit.stderr == ("submit: error: node groups h100, p5 are not in stack 'dev': allowed are "
                             "a10g-spot, l4-spot\n")
    # `run` checks against Pulumi.dev.yaml before it stands anything up (no Pulumi CLI on this PATH)
    run = ringtrain("run", "--backend", "aws", "--stack", "dev", "--node-group", "l4-spot,h100")
    assert run.returncode == 2, run.stderr
    assert run.stderr == ("run: error: node group h100 is not in stack 'dev' (Pulumi.dev.yaml): allowed are "
                          "a10g-spot, l4-spot\n")
    local = ringtrain("run", "--node-group", "l4-spot", "--capacity-timeout", "60")
    assert local.returncode == 2
    assert "--node-group/--capacity-timeout: only with --backend aws" in local.stderr
    dry = json.loads(ringtrain("submit", "--stack", "dev", "--outputs", str(dev_outputs_file), "--dry-run",
                               "--job-name", "j", "--node-group", "l4-spot,a10g-spot").stdout)
    assert _pools(dry) == [["l4-spot"]]   # the dry run shows the first group's manifest


def test_an_elastic_jobs_preflight_keeps_its_slow_node_out(two_groups, dev_exports, tmp_path):  # noqa: F811
    """The elastic job's preflight runs first as a static MPIJob (--preflight-only); it names worker 2
    slow, so the elastic MPIJob's workers get a node affinity that rules out the node worker 2 ran on:
    the scheduler puts them on the other two nodes and the job runs there (cluster/preflight_gate.py)."""
    from train.metrics import metrics_line

    fake, _ = two_groups
    fake.add_nodes("a10g-spot", 3, GPU_NODE)
    slow = {"busbw_gbps": 0.4, "floor_gbps": 100.0, "ranks": 12, "passed": False, "bytes": 2 ** 31,
            "slow_hosts": ["gate-worker-2"], "pairs_gbps": {}}
    fake.plan(JobScript(log=["[0]<stdout>:" + metrics_line({"step": 0, "preflight": slow, "time": 1.0}),
                             "[0]<stderr>:train: error: preflight: allreduce busbw 0.4 GB/s over 12 ranks: "
                             "BELOW THE FLOOR; slow: gate-worker-2",
                             "Process 0 exit with status code 69."], exit_code=1,
                        start_s=1.0),   # its workers are there (and seen) at least this long
              JobScript(log=DONE_LOG, exit_code=0))
    backend, messages = _backend(dev_exports, tmp_path, node_group="a10g-spot")
    job = JobSpec(name="gate", num_hosts=3, slots_per_host=4, elastic=True, min_hosts=2,
                  trainer=trainer_config(("--data", "s3://d/x", "--steps", "20")))
    lines: list[str] = []
    result = run_job(backend, job, FlowOptions(progress_bar=False, dataset=None), out=lines.append)
    assert result.succeeded, (lines, messages)
    pre, elastic = fake.mpijobs()
    assert "--preflight-only" in _launcher_args(pre) and "--elastic" not in _launcher_args(pre)
    assert "--preflight-only" not in _launcher_args(elastic) and "--elastic" in _launcher_args(elastic)
    worker_2_node = "ip-10-0-0-12.ec2.internal"   # the stand-in's scheduler: worker i on the i-th node
    (term,) = elastic["manifest"]["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"][
        "nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "NotIn", "values": [worker_2_node]}]
    assert any(f"slow: {worker_2_node} (gate-worker-2); excluded: the elastic job runs on the other 2" in line
               for line in lines), lines
    assert result.preflight is not None and result.preflight.exit_code == 69 and len(result.attempts) == 1
    assert "excluded: the elastic job runs on the other 2 host(s)" in format_summary(result)


def _launcher_args(mpijob: dict) -> list[str]:
    return launcher_container(mpijob["manifest"])["args"]


def test_an_elastic_job_whose_preflight_job_meets_bad_input_fails_with_it(two_groups, dev_exports, tmp_path):  # noqa: F811
    fake, _ = two_groups
    fake.add_nodes("a10g-spot", 2, GPU_NODE)
    fake.plan(JobScript(log=["[0]<stderr>:train: error: no dataset at s3://d/x: index.json not found",
                             "Process 0 exit with status code 2."], exit_code=1))
    backend, _ = _backend(dev_exports, tmp_path, node_group="a10g-spot")
    job = JobSpec(name="gatebad", num_hosts=2, slots_per_host=4, elastic=True,
                  trainer=trainer_config(("--data", "s3://d/x", "--steps", "20")))
    result = run_job(backend, job, FlowOptions(progress_bar=False, dataset=None), out=lambda m: None)
    assert (result.succeeded, result.exit_code) == (False, 2)
    assert result.message.startswith("bad input: exit code 2: train: error: no dataset at s3://d/x: "
                                      "index.json not found")
    assert len(fake.mpijobs()) == 1   # the elastic job was never submitted
