"""The cost guard's scale-to-zero Lambda: the idle rule (pure) and the whole run against moto's AWS."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import boto3
import pytest
from moto import mock_aws

from infra.scale_to_zero import (
    GPU_METRIC,
    METRIC_NAMESPACE,
    NOTIFIED_TAG,
    GuardSettings,
    NodeActivity,
    idle_verdict,
    required_gpu_minutes,
    run,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(hours=2)
WINDOW, THRESHOLD, GRACE = 15, 5.0, 10


def node(iid="i-1", launched=OLD, peak=None, cpu=None, minutes=None, lag=1, notified=False):
    """A node's evidence; GPU data covers the whole window up to `lag` minutes ago unless told otherwise
    (peak None: no GPU data)."""
    if minutes is None:
        minutes = WINDOW if peak is not None else 0
    newest = NOW - timedelta(minutes=lag) if peak is not None else None
    return NodeActivity(instance_id=iid, launched_at=launched, gpu_peak=peak, gpu_minutes=minutes,
                        gpu_newest=newest, cpu_peak=cpu, notified=notified)


def verdict(nodes):
    return idle_verdict(nodes, NOW, WINDOW, THRESHOLD, GRACE)


# -- the four cases the guard must get right (issue 25, item 7) ------------------------------------


def test_busy_job_with_gpu_telemetry_missing_is_not_idle():
    # 8 Horovod ranks keep a p5 at ~4 % CPU: below the old shared 5 % threshold, which scaled it away.
    v = verdict([node("i-busy", peak=None, cpu=4.2)])
    assert not v.idle and v.why == "i-busy has no GPU telemetry in the last 15 min: not judged idle"
    assert v.notify == ("i-busy",)


def test_no_data_at_all_is_not_idle_and_is_notified():
    v = verdict([node("i-1", peak=None, cpu=None)])
    assert not v.idle and v.notify == ("i-1",)
    (finding,) = v.nodes
    assert finding.state == "unwatched" and finding.age_minutes == 120.0


def test_gpu_idle_for_the_window_is_idle():
    v = verdict([node("i-1", peak=2.0, cpu=60.0), node("i-2", peak=4.9)])
    assert v.idle and v.notify == () and "2 node(s) below 5.0% GPU utilisation for 15 min" in v.why
    assert [f.state for f in v.nodes] == ["idle", "idle"]


def test_one_busy_node_of_two_is_not_idle():
    v = verdict([node("i-1", peak=1.0), node("i-2", peak=97.0)])
    assert not v.idle and "i-2 GPU peaked at 97.0%" in v.why and "i-1" not in v.why
    assert [f.state for f in v.nodes] == ["idle", "busy"]


# -- the rest of the rule ---------------------------------------------------------------------------------


def test_gpu_data_for_less_than_half_the_window_is_not_evidence_of_idleness():
    assert required_gpu_minutes(WINDOW) == 8
    v = verdict([node("i-1", peak=0.0, minutes=7)])
    assert not v.idle and v.notify == ("i-1",)
    assert v.why == ("i-1 has GPU telemetry for 7 of the last 15 min, the newest 1 min old (needs 8 min, "
                     "the newest at most 5 min old): not judged idle")
    assert verdict([node("i-1", peak=0.0, minutes=8)]).idle


def test_gpu_telemetry_that_stopped_is_not_evidence_of_the_minutes_since():
    # Idle for the first 9 minutes, then silent: a job may have started when the agent stopped.
    v = verdict([node("i-1", peak=0.0, minutes=9, lag=6)])
    assert not v.idle and "the newest 6 min old" in v.why and v.notify == ("i-1",)
    assert v.nodes[0].gpu_lag_minutes == 6.0
    assert verdict([node("i-1", peak=0.0, minutes=9, lag=5)]).idle


def test_a_node_is_notified_once():
    v = verdict([node("i-1", peak=None, notified=True), node("i-2", peak=None)])
    assert not v.idle and v.notify == ("i-2",)


def test_not_idle_while_a_node_is_younger_than_window_plus_grace():
    young = node("i-new", launched=NOW - timedelta(minutes=24))  # 15 + 10 = 25 minutes needed
    v = verdict([node("i-1", peak=0.0), young])
    assert not v.idle and "i-new started less than" in v.why
    assert v.notify == ()  # a booting node without telemetry yet is not news


def test_evidence_names_gpu_peak_cpu_peak_and_age_per_node():
    v = verdict([node("i-1", peak=2.0, cpu=1.5)])
    assert v.evidence() == [{"instance_id": "i-1", "state": "idle", "gpu_peak": 2.0, "gpu_minutes": 15,
                             "gpu_lag_minutes": 1.0, "cpu_peak": 1.5, "age_minutes": 120.0}]


def test_no_nodes_is_nothing_to_do():
    v = verdict([])
    assert not v.idle and v.why == "no running nodes"


def test_settings_from_env_and_bad_idle_minutes():
    env = {"CLUSTER_NAME": "c", "NODE_GROUPS": '["c-a", "c-b"]', "IDLE_MINUTES": "15",
           "IDLE_GPU_PERCENT": "5", "ALERT_TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:t"}
    s = GuardSettings.from_env(env)
    assert s.node_groups == ("c-a", "c-b") and s.idle_minutes == 15 and s.grace_minutes == 10
    assert s.alert_topic_arn == "arn:aws:sns:us-east-1:123456789012:t"
    with pytest.raises(ValueError, match="IDLE_MINUTES must be >= 1"):
        GuardSettings.from_env({**env, "IDLE_MINUTES": "0"})


# --------------------------------------------------------------------------------------------
# The whole check against moto (in-process, no network): EKS node groups, EC2 instances tagged the
# way EKS tags managed-node-group instances, Container Insights GPU series in CloudWatch.
# --------------------------------------------------------------------------------------------

CLUSTER = "ringtrain-test"
REGION = "us-east-1"
MOTO_AMI = "ami-12c6146b"  # one of the AMIs moto knows without a lookup
# The dimension sets the CloudWatch agent publishes node_gpu_utilization under
# (aws/amazon-cloudwatch-agent, translator/translate/otel/exporter/awsemf/kubernetes.go,
# getGPUMetricDeclarations): the per-node set, and the per-GPU set with InstanceType and GpuDevice.
AGENT_NODE_DIMENSIONS = ("ClusterName", "NodeName", "InstanceId")
AGENT_GPU_DIMENSIONS = ("ClusterName", "NodeName", "InstanceId", "InstanceType", "GpuDevice")


@pytest.fixture
def aws(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        clients = {n: boto3.client(n, region_name=REGION)
                   for n in ("eks", "ec2", "cloudwatch", "iam", "sns", "sqs")}
        role = clients["iam"].create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        clients["eks"].create_cluster(name=CLUSTER, roleArn=role, resourcesVpcConfig={"subnetIds": []})
        clients["role"] = role
        # The alert topic, read back through an SQS subscription (what an e-mail subscriber would get).
        clients["topic"] = clients["sns"].create_topic(Name="alerts")["TopicArn"]
        queue = clients["sqs"].create_queue(QueueName="inbox")["QueueUrl"]
        queue_arn = clients["sqs"].get_queue_attributes(
            QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        clients["sns"].subscribe(TopicArn=clients["topic"], Protocol="sqs", Endpoint=queue_arn,
                                 Attributes={"RawMessageDelivery": "true"})
        clients["inbox"] = queue
        yield clients


def settings_for(aws, *groups):
    return GuardSettings(CLUSTER, tuple(f"{CLUSTER}-{g}" for g in groups), WINDOW, THRESHOLD, GRACE,
                         alert_topic_arn=aws["topic"])


def inbox(aws):
    out = aws["sqs"].receive_message(QueueUrl=aws["inbox"], MaxNumberOfMessages=10, WaitTimeSeconds=0)
    return [m["Body"] for m in out.get("Messages", [])]


def make_group(aws, name, desired, nodes):
    """A node group with `desired` size and `nodes` running instances; returns the instances."""
    aws["eks"].create_nodegroup(clusterName=CLUSTER, nodegroupName=name, nodeRole=aws["role"],
                                subnets=["subnet-1"],
                                scalingConfig={"minSize": 0, "maxSize": 4, "desiredSize": desired})
    if not nodes:
        return []
    out = aws["ec2"].run_instances(
        ImageId=MOTO_AMI, MinCount=nodes, MaxCount=nodes, InstanceType="g5.12xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": "eks:cluster-name", "Value": CLUSTER}, {"Key": "eks:nodegroup-name", "Value": name}]}])
    return out["Instances"]


def put_gpu(aws, instance, values, at, dimensions=AGENT_NODE_DIMENSIONS):
    """GPU utilisation datapoints, one per minute ending at `at`, under one of the agent's dimension sets."""
    known = {"ClusterName": CLUSTER, "NodeName": instance["PrivateDnsName"],
             "InstanceId": instance["InstanceId"], "InstanceType": instance["InstanceType"],
             "GpuDevice": "nvidia0"}
    dims = [{"Name": d, "Value": known[d]} for d in dimensions]
    data = [{"MetricName": GPU_METRIC, "Dimensions": dims, "Value": value,
             "Timestamp": at - timedelta(minutes=len(values) - 1 - k)} for k, value in enumerate(values)]
    aws["cloudwatch"].put_metric_data(Namespace=METRIC_NAMESPACE, MetricData=data)


def put_cpu(aws, instance, values, at):
    dims = [{"Name": "InstanceId", "Value": instance["InstanceId"]}]
    data = [{"MetricName": "CPUUtilization", "Dimensions": dims,
             "Timestamp": at - timedelta(minutes=len(values) - 1 - k), "Value": v}
            for k, v in enumerate(values)]
    aws["cloudwatch"].put_metric_data(Namespace="AWS/EC2", MetricData=data)


def desired(aws, name):
    ng = aws["eks"].describe_nodegroup(clusterName=CLUSTER, nodegroupName=name)["nodegroup"]
    return ng["scalingConfig"]["desiredSize"]


def tags_of(aws, instance):
    (res,) = aws["ec2"].describe_instances(InstanceIds=[instance["InstanceId"]])["Reservations"]
    return {t["Key"]: t["Value"] for t in res["Instances"][0].get("Tags", [])}


# moto stamps LaunchTime with the real clock: evaluate "now" well after launch + window + grace.
def later():
    return datetime.now(UTC) + timedelta(minutes=40)


def test_run_scales_the_idle_group_to_zero_and_leaves_the_busy_one(aws):
    idle = make_group(aws, f"{CLUSTER}-idle", 2, 2)
    busy = make_group(aws, f"{CLUSTER}-busy", 1, 1)
    make_group(aws, f"{CLUSTER}-empty", 0, 0)
    now = later()
    for inst in idle:
        put_gpu(aws, inst, [0.0, 1.0, 3.0, 0.0] * 3, now - timedelta(minutes=1))
    # The busy node's GPU is busy per GPU device; the per-node series carries the same datapoints.
    put_gpu(aws, busy[0], [0.0] * 10 + [97.0, 99.0], now - timedelta(minutes=2))
    put_gpu(aws, busy[0], [99.0], now - timedelta(minutes=2), dimensions=AGENT_GPU_DIMENSIONS)

    results = {r["nodeGroup"]: r for r in run(aws, settings_for(aws, "idle", "busy", "empty"), now=now)}

    assert results[f"{CLUSTER}-idle"]["action"] == "desiredSize 2 -> 0"
    assert [n["gpu_peak"] for n in results[f"{CLUSTER}-idle"]["nodes"]] == [3.0, 3.0]
    busy_result = results[f"{CLUSTER}-busy"]
    assert busy_result["action"] == "none" and "peaked at 99.0%" in busy_result["why"]
    assert results[f"{CLUSTER}-empty"]["why"] == "already at its minimum size"
    assert desired(aws, f"{CLUSTER}-idle") == 0
    assert desired(aws, f"{CLUSTER}-busy") == 1
    assert inbox(aws) == []


def test_run_keeps_a_busy_job_without_gpu_telemetry_and_notifies_once(aws):
    """The defect: a p5 whose GPU series is missing was judged by CPU at the GPU threshold (8 busy ranks
    read ~4 %) or, with no CPU data either, counted as idle, and scaled away under a running job."""
    (blind,) = make_group(aws, f"{CLUSTER}-blind", 1, 1)
    (dark,) = make_group(aws, f"{CLUSTER}-dark", 1, 1)  # no data at all
    now = later()
    put_cpu(aws, blind, [4.0, 4.2, 3.9], now - timedelta(minutes=3))
    settings = settings_for(aws, "blind", "dark")

    results = {r["nodeGroup"]: r for r in run(aws, settings, now=now)}

    for group, inst in ((f"{CLUSTER}-blind", blind), (f"{CLUSTER}-dark", dark)):
        assert results[group]["action"] == "none" and desired(aws, group) == 1
        assert results[group]["notified"] == [inst["InstanceId"]]
        assert NOTIFIED_TAG in tags_of(aws, inst)
    (evidence,) = results[f"{CLUSTER}-blind"]["nodes"]
    assert evidence["state"] == "unwatched" and evidence["gpu_peak"] is None and evidence["cpu_peak"] == 4.2
    messages = inbox(aws)
    assert len(messages) == 2
    assert any(blind["InstanceId"] in m and blind["PrivateDnsName"] in m and "4.2%" in m for m in messages)
    assert any(dark["InstanceId"] in m and "CPU peaked at none" in m for m in messages)

    # The next run keeps both groups up again and does not repeat the notice.
    again = {r["nodeGroup"]: r for r in run(aws, settings, now=now + timedelta(minutes=5))}
    assert all(r["action"] == "none" and "notified" not in r for r in again.values())
    assert inbox(aws) == []


def test_run_keeps_nodes_inside_their_start_up_grace(aws):
    make_group(aws, f"{CLUSTER}-new", 1, 1)
    (result,) = run(aws, settings_for(aws, "new"), now=datetime.now(UTC) + timedelta(minutes=5))
    assert result["action"] == "none" and "started less than" in result["why"]
    assert desired(aws, f"{CLUSTER}-new") == 1 and inbox(aws) == []


def test_run_fails_loudly_when_a_group_cannot_be_checked(aws):
    make_group(aws, f"{CLUSTER}-ok", 0, 0)
    settings = GuardSettings(CLUSTER, (f"{CLUSTER}-missing", f"{CLUSTER}-ok"), 15, 5.0, 10)
    with pytest.raises(RuntimeError, match="scale-to-zero check failed") as info:
        run(aws, settings, now=datetime.now(UTC))
    # The healthy group was still checked.
    assert f"{CLUSTER}-ok" in str(info.value)


def test_gpu_series_is_read_by_its_exact_dimensions_without_list_metrics(aws):
    """GetMetricData on the agent's per-node dimension set, straight away: ListMetrics can take up to
    15 minutes to list a new series (CloudWatch API reference, ListMetrics). A botocore Stubber
    refuses any call it was not told to expect, ListMetrics included."""
    from botocore.stub import Stubber

    (inst,) = make_group(aws, f"{CLUSTER}-p5", 1, 1)
    now = later()
    cloudwatch = boto3.client("cloudwatch", region_name=REGION)
    start = now - timedelta(minutes=WINDOW)
    gpu_dims = [{"Name": "ClusterName", "Value": CLUSTER},
                {"Name": "NodeName", "Value": inst["PrivateDnsName"]},
                {"Name": "InstanceId", "Value": inst["InstanceId"]}]
    assert tuple(d["Name"] for d in gpu_dims) == AGENT_NODE_DIMENSIONS
    queries = [
        {"Id": "m0", "ReturnData": True, "MetricStat": {
            "Metric": {"Namespace": METRIC_NAMESPACE, "MetricName": GPU_METRIC, "Dimensions": gpu_dims},
            "Period": 60, "Stat": "Maximum"}},
        {"Id": "m1", "ReturnData": True, "MetricStat": {
            "Metric": {"Namespace": "AWS/EC2", "MetricName": "CPUUtilization",
                       "Dimensions": [{"Name": "InstanceId", "Value": inst["InstanceId"]}]},
            "Period": 60, "Stat": "Maximum"}},
    ]
    minutes = [now - timedelta(minutes=k) for k in range(WINDOW)]
    response = {"MetricDataResults": [
        {"Id": "m0", "StatusCode": "Complete", "Timestamps": minutes, "Values": [0.0] * WINDOW},
        {"Id": "m1", "StatusCode": "Complete", "Timestamps": minutes[:3], "Values": [1.0, 2.0, 1.5]}]}
    with Stubber(cloudwatch) as stub:
        stub.add_response("get_metric_data", response,
                          {"MetricDataQueries": queries, "StartTime": start, "EndTime": now})
        (result,) = run({**aws, "cloudwatch": cloudwatch}, settings_for(aws, "p5"), now=now)
        stub.assert_no_pending_responses()
    assert result["action"] == "desiredSize 1 -> 0"
    assert result["nodes"][0]["gpu_minutes"] == WINDOW and result["nodes"][0]["cpu_peak"] == 2.0


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
