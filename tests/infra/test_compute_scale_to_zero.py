"""The cost guard's scale-to-zero Lambda: the idle rule (pure) and the whole run against moto's AWS."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import boto3
import pytest
from moto import mock_aws

from infra.scale_to_zero import GPU_METRIC, METRIC_NAMESPACE, GuardSettings, NodeActivity, idle_verdict, run

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(hours=2)


def node(iid="i-1", launched=OLD, peak=None, cpu=None):
    return NodeActivity(instance_id=iid, launched_at=launched, gpu_peak=peak, cpu_peak=cpu)


def test_idle_when_every_gpu_stayed_below_threshold():
    idle, why = idle_verdict([node("i-1", peak=2.0), node("i-2", peak=4.9)], NOW, 15, 5, 10)
    assert idle, why


def test_busy_when_any_gpu_reached_threshold():
    idle, why = idle_verdict([node("i-1", peak=1.0), node("i-2", peak=5.0)], NOW, 15, 5, 10)
    assert not idle and "i-2" in why


def test_not_idle_while_a_node_is_younger_than_window_plus_grace():
    young = node("i-new", launched=NOW - timedelta(minutes=24))  # 15 + 10 = 25 minutes needed
    idle, why = idle_verdict([node("i-1", peak=0.0), young], NOW, 15, 5, 10)
    assert not idle and "i-new" in why


def test_without_gpu_metrics_the_node_cpu_decides():
    idle, why = idle_verdict([node("i-1", peak=None, cpu=37.0)], NOW, 15, 5, 10)
    assert not idle and "no GPU metrics" in why
    assert idle_verdict([node("i-1", peak=None, cpu=1.5)], NOW, 15, 5, 10)[0]


def test_gpu_metrics_win_over_cpu():
    # Busy CPU (data loading) with idle GPUs for the whole window is still an idle GPU node.
    assert idle_verdict([node("i-1", peak=0.0, cpu=60.0)], NOW, 15, 5, 10)[0]


def test_no_datapoints_at_all_on_an_old_node_counts_as_idle():
    idle, _ = idle_verdict([node("i-1", peak=None, cpu=None)], NOW, 15, 5, 10)
    assert idle


def test_no_nodes_is_nothing_to_do():
    assert idle_verdict([], NOW, 15, 5, 10) == (False, "no running nodes")


def test_settings_from_env_and_bad_idle_minutes():
    env = {"CLUSTER_NAME": "c", "NODE_GROUPS": '["c-a", "c-b"]', "IDLE_MINUTES": "15",
           "IDLE_GPU_PERCENT": "5"}
    s = GuardSettings.from_env(env)
    assert s.node_groups == ("c-a", "c-b") and s.idle_minutes == 15 and s.grace_minutes == 10
    with pytest.raises(ValueError, match="IDLE_MINUTES must be >= 1"):
        GuardSettings.from_env({**env, "IDLE_MINUTES": "0"})


# --------------------------------------------------------------------------------------------
# The whole check against moto (in-process, no network): EKS node groups, EC2 instances tagged the
# way EKS tags managed-node-group instances, Container Insights GPU series in CloudWatch.
# --------------------------------------------------------------------------------------------

CLUSTER = "ringtrain-test"
REGION = "us-east-1"
MOTO_AMI = "ami-12c6146b"  # one of the AMIs moto knows without a lookup


@pytest.fixture
def aws(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        clients = {n: boto3.client(n, region_name=REGION) for n in ("eks", "ec2", "cloudwatch", "iam")}
        role = clients["iam"].create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        clients["eks"].create_cluster(name=CLUSTER, roleArn=role, resourcesVpcConfig={"subnetIds": []})
        clients["role"] = role
        yield clients


def make_group(aws, name, desired, nodes):
    """A node group with `desired` size and `nodes` running instances; returns their instance ids."""
    aws["eks"].create_nodegroup(clusterName=CLUSTER, nodegroupName=name, nodeRole=aws["role"],
                                subnets=["subnet-1"],
                                scalingConfig={"minSize": 0, "maxSize": 4, "desiredSize": desired})
    if not nodes:
        return []
    out = aws["ec2"].run_instances(
        ImageId=MOTO_AMI, MinCount=nodes, MaxCount=nodes, InstanceType="g5.12xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": "eks:cluster-name", "Value": CLUSTER}, {"Key": "eks:nodegroup-name", "Value": name}]}])
    return [i["InstanceId"] for i in out["Instances"]]


def put_gpu(aws, instance_id, values, at):
    """GPU utilisation datapoints, one per minute ending at `at`, per node and per GPU device."""
    data = []
    for k, value in enumerate(values):
        ts = at - timedelta(minutes=len(values) - 1 - k)
        base = [{"Name": "ClusterName", "Value": CLUSTER}, {"Name": "InstanceId", "Value": instance_id},
                {"Name": "NodeName", "Value": f"ip-{instance_id}.ec2.internal"}]
        data.append({"MetricName": GPU_METRIC, "Dimensions": base, "Timestamp": ts, "Value": value})
        per_gpu = [*base, {"Name": "GpuDevice", "Value": "nvidia0"}]
        data.append({"MetricName": GPU_METRIC, "Dimensions": per_gpu, "Timestamp": ts, "Value": value})
    aws["cloudwatch"].put_metric_data(Namespace=METRIC_NAMESPACE, MetricData=data)


def put_cpu(aws, instance_id, values, at):
    dims = [{"Name": "InstanceId", "Value": instance_id}]
    data = [{"MetricName": "CPUUtilization", "Dimensions": dims,
             "Timestamp": at - timedelta(minutes=len(values) - 1 - k), "Value": v}
            for k, v in enumerate(values)]
    aws["cloudwatch"].put_metric_data(Namespace="AWS/EC2", MetricData=data)


def desired(aws, name):
    ng = aws["eks"].describe_nodegroup(clusterName=CLUSTER, nodegroupName=name)["nodegroup"]
    return ng["scalingConfig"]["desiredSize"]


def test_run_scales_the_idle_group_to_zero_and_leaves_the_busy_one(aws):
    idle_ids = make_group(aws, f"{CLUSTER}-idle", 2, 2)
    busy_ids = make_group(aws, f"{CLUSTER}-busy", 1, 1)
    make_group(aws, f"{CLUSTER}-empty", 0, 0)
    blind_ids = make_group(aws, f"{CLUSTER}-blind", 1, 1)  # no GPU telemetry, CPU busy
    # moto stamps LaunchTime with the real clock: evaluate "now" well after launch + window + grace.
    now = datetime.now(UTC) + timedelta(minutes=40)
    for iid in idle_ids:
        put_gpu(aws, iid, [0.0, 1.0, 3.0, 0.0], now - timedelta(minutes=1))
    put_gpu(aws, busy_ids[0], [0.0, 97.0, 99.0], now - timedelta(minutes=2))
    put_cpu(aws, blind_ids[0], [40.0, 42.0], now - timedelta(minutes=3))
    groups = tuple(f"{CLUSTER}-{g}" for g in ("idle", "busy", "empty", "blind"))
    settings = GuardSettings(CLUSTER, groups, 15, 5.0, 10)

    results = {r["nodeGroup"]: r for r in run(aws, settings, now=now)}

    assert results[f"{CLUSTER}-idle"]["action"] == "desiredSize 2 -> 0"
    busy = results[f"{CLUSTER}-busy"]
    assert busy["action"] == "none" and "peaked at 99.0%" in busy["why"]
    assert results[f"{CLUSTER}-empty"]["why"] == "already at its minimum size"
    assert desired(aws, f"{CLUSTER}-idle") == 0
    assert desired(aws, f"{CLUSTER}-busy") == 1
    assert "no GPU metrics; its CPU peaked at 42.0%" in results[f"{CLUSTER}-blind"]["why"]
    assert desired(aws, f"{CLUSTER}-blind") == 1


def test_run_keeps_nodes_inside_their_start_up_grace(aws):
    make_group(aws, f"{CLUSTER}-new", 1, 1)
    settings = GuardSettings(CLUSTER, (f"{CLUSTER}-new",), 15, 5.0, 10)
    (result,) = run(aws, settings, now=datetime.now(UTC) + timedelta(minutes=5))
    assert result["action"] == "none" and "started less than" in result["why"]
    assert desired(aws, f"{CLUSTER}-new") == 1


def test_run_fails_loudly_when_a_group_cannot_be_checked(aws):
    make_group(aws, f"{CLUSTER}-ok", 0, 0)
    settings = GuardSettings(CLUSTER, (f"{CLUSTER}-missing", f"{CLUSTER}-ok"), 15, 5.0, 10)
    with pytest.raises(RuntimeError, match="scale-to-zero check failed") as info:
        run(aws, settings, now=datetime.now(UTC))
    # The healthy group was still checked.
    assert f"{CLUSTER}-ok" in str(info.value)


def test_lambda_source_is_standalone_and_packaged_alone():
    """The Lambda ships one file: it may import only the standard library and boto3."""
    import ast
    import sys

    from infra.costguard import LAMBDA_HANDLER, LAMBDA_SOURCE
    from tests.infra.harness import run_program

    tree = ast.parse(LAMBDA_SOURCE.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported - {"boto3"} <= set(sys.stdlib_module_names) | {"__future__"}, imported
    module, function = LAMBDA_HANDLER.split(".")
    assert LAMBDA_SOURCE.stem == module
    assert any(isinstance(n, ast.FunctionDef) and n.name == function for n in tree.body)

    fn = run_program("dev").one("aws:lambda/function:Function")
    assets = fn.inputs["code"].assets
    assert list(assets) == [LAMBDA_SOURCE.name]
    assert assets[LAMBDA_SOURCE.name].path == str(LAMBDA_SOURCE)
