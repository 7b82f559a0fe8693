"""Cost guard Lambda: scale idle GPU node groups to zero. Standalone: stdlib + boto3 only.

Runs every few minutes (EventBridge schedule, infra/costguard.py). For each GPU node group of the
cluster that has nodes, it reads every running node's GPU utilisation from CloudWatch Container
Insights and decides with `idle_verdict` (pure). The group's desired size is set to its minimum (0:
config requires it for GPU groups) with eks:UpdateNodegroupConfig only on positive evidence of
idleness: every node is older than the idle window plus a start-up grace, every node reported GPU
utilisation for most of the window and up to its last minutes, and no GPU on any node reached the
threshold in it. The node group's desired size is ignored by `pulumi up` (infra/nodegroups.py), so
the next deployment does not bring the nodes back.

Never on absence of evidence. A node whose GPU telemetry is missing, covers less than
MIN_GPU_COVERAGE of the window, or stopped more than MAX_GPU_LAG_MINUTES ago keeps its group up,
however quiet it looks otherwise; once such a node is past the window plus grace, the guard
publishes one notice naming it to the stack's alert topic (SNS, e-mailed to
costGuard.notificationEmail) and tags the instance so the notice is not repeated every run. A job
may run there unwatched: an operator decides.

How the GPU metric is read. The CloudWatch agent (amazon-cloudwatch-observability add-on) publishes
`node_gpu_utilization` in namespace ContainerInsights under the dimension sets {ClusterName},
{ClusterName, NodeName, InstanceId} and {ClusterName, NodeName, InstanceId, InstanceType, GpuDevice}
(aws/amazon-cloudwatch-agent, translator/translate/otel/exporter/awsemf/kubernetes.go,
getGPUMetricDeclarations). The guard asks GetMetricData for the per-node series directly, with the
exact dimensions, instead of discovering series with ListMetrics: a new metric can take up to 15
minutes to appear in ListMetrics (CloudWatch API reference, ListMetrics), longer than a p5 takes to
boot and start a job. EMF writes every GPU's datapoint under each dimension set, so the 1-minute
Maximum of the per-node series is the busiest GPU of the node. NodeName is the Kubernetes node name,
which EKS AL2023 nodes take from the instance's EC2 PrivateDnsName (awslabs/amazon-eks-ami,
nodeadm/internal/kubelet/config.go, withCloudProvider). If that ever differs, the series is not
found, the node counts as unwatched and the guard notifies instead of scaling: the safe side.

CPU is evidence, not a signal. The guard logs each node's EC2 CPUUtilization peak (1-minute detailed
monitoring, set in the launch template) but does not decide on it. It could only ever turn an "idle"
into "busy" for a node whose GPUs sat below the threshold for the whole window, and no threshold is
defensible without a measurement: 8 busy ranks on a 192-vCPU p5 read ~4 %, a single busy rank 0.5 %,
and an idle node's agents have not been measured; too low a threshold keeps an idle p5 (~$55/h) up
forever. A job that keeps its GPUs idle longer than `costGuard.idleMinutes` (a long CPU-only
preprocessing step) needs a longer window. Anchors for the window: ParallelCluster ScaledownIdletime
10 min, SkyPilot autostop 5-10 min (docs/field-notes.md §4).

Every verdict is logged as one JSON line with its evidence per node: GPU peak, GPU minutes covered,
newest GPU datapoint's age, CPU peak, age.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

METRIC_NAMESPACE = "ContainerInsights"
GPU_METRIC = "node_gpu_utilization"
EC2_NAMESPACE = "AWS/EC2"
CPU_METRIC = "CPUUtilization"
# Node groups in these states can be scaled; others (CREATING, UPDATING, DELETING) are left alone.
SCALABLE_STATES = ("ACTIVE", "DEGRADED")
PERIOD_SECONDS = 60
# Share of the window's minutes that must carry a GPU datapoint before a quiet node counts as idle.
# Half leaves room for the newest minutes still in flight (EMF -> CloudWatch Logs -> metrics) and for
# a dropped datapoint; a node whose telemetry stopped for most of the window is unwatched.
MIN_GPU_COVERAGE = 0.5
# The newest GPU datapoint must be at most this old: telemetry that stopped mid-window says nothing
# about the minutes since (a job may have started then). EMF datapoints reach CloudWatch metrics
# within a minute or two of the agent's 60 s flush, so 5 minutes leaves room for a late one.
MAX_GPU_LAG_MINUTES = 5
# Tag set on an instance once its missing telemetry was notified (the guard keeps no other state).
NOTIFIED_TAG = "ringtrain:gpu-telemetry-notified"
MAX_QUERIES_PER_CALL = 500  # GetMetricData limit

log = logging.getLogger("ringtrain.scale_to_zero")
log.setLevel(logging.INFO)


@dataclass(frozen=True)
class GuardSettings:
    cluster_name: str
    node_groups: tuple[str, ...]
    idle_minutes: int
    idle_gpu_percent: float
    grace_minutes: int
    alert_topic_arn: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> GuardSettings:
        env = dict(os.environ if env is None else env)
        settings = cls(
            cluster_name=env["CLUSTER_NAME"],
            node_groups=tuple(json.loads(env["NODE_GROUPS"])),
            idle_minutes=int(env["IDLE_MINUTES"]),
            idle_gpu_percent=float(env["IDLE_GPU_PERCENT"]),
            grace_minutes=int(env.get("GRACE_MINUTES", "10")),
            alert_topic_arn=env.get("ALERT_TOPIC_ARN") or None,
        )
        if settings.idle_minutes < 1:
            raise ValueError(f"IDLE_MINUTES must be >= 1, got {settings.idle_minutes}")
        return settings


@dataclass(frozen=True)
class NodeActivity:
    """What CloudWatch and EC2 say about one running node over the idle window."""

    instance_id: str
    launched_at: datetime
    gpu_peak: float | None  # highest 1-minute Maximum GPU utilisation (%); None: no datapoint
    gpu_minutes: int = 0  # 1-minute periods of the window that carry a GPU datapoint
    gpu_newest: datetime | None = None  # time of the newest GPU datapoint
    cpu_peak: float | None = None  # highest EC2 CPU utilisation (%): logged, not decided on
    node_name: str = ""
    notified: bool = False  # its missing GPU telemetry was notified already


@dataclass(frozen=True)
class NodeFinding:
    instance_id: str
    state: str  # "starting", "busy", "unwatched" (GPU telemetry missing) or "idle"
    gpu_peak: float | None
    gpu_minutes: int
    gpu_lag_minutes: float | None  # age of the newest GPU datapoint
    cpu_peak: float | None
    age_minutes: float


@dataclass(frozen=True)
class Verdict:
    idle: bool  # scale the group down
    why: str
    nodes: tuple[NodeFinding, ...]  # per-node evidence, for the log
    notify: tuple[str, ...] = ()  # instance ids whose missing GPU telemetry is to be notified now

    def evidence(self) -> list[dict[str, Any]]:
        return [asdict(n) for n in self.nodes]


def _minutes(delta: timedelta) -> float:
    return round(delta.total_seconds() / 60, 1)


def required_gpu_minutes(idle_minutes: int) -> int:
    return max(1, math.ceil(idle_minutes * MIN_GPU_COVERAGE))


def idle_verdict(nodes: list[NodeActivity], now: datetime, idle_minutes: int, threshold: float,
                 grace_minutes: int) -> Verdict:
    """Scale one node group's running nodes down? Idle only on evidence from every node."""
    if not nodes:
        return Verdict(False, "no running nodes", ())
    settle = timedelta(minutes=idle_minutes + grace_minutes)
    needed = required_gpu_minutes(idle_minutes)
    lag_allowed = timedelta(minutes=MAX_GPU_LAG_MINUTES)
    findings: list[NodeFinding] = []
    reasons: list[str] = []
    notify: list[str] = []
    for node in nodes:
        age = now - node.launched_at
        if age < settle:
            state = "starting"
            reasons.append(f"{node.instance_id} started less than {idle_minutes}+{grace_minutes} min ago")
        elif node.gpu_peak is not None and node.gpu_peak >= threshold:
            state = "busy"
            reasons.append(f"{node.instance_id} GPU peaked at {node.gpu_peak:.1f}% (threshold {threshold}%)")
        elif node.gpu_peak is None or node.gpu_newest is None:
            state = "unwatched"
            reasons.append(f"{node.instance_id} has no GPU telemetry in the last {idle_minutes} min: "
                           "not judged idle")
        elif node.gpu_minutes < needed or now - node.gpu_newest > lag_allowed:
            state = "unwatched"
            reasons.append(f"{node.instance_id} has GPU telemetry for {node.gpu_minutes} of the last "
                           f"{idle_minutes} min, the newest {_minutes(now - node.gpu_newest):g} min old "
                           f"(needs {needed} min, the newest at most {MAX_GPU_LAG_MINUTES} min old): "
                           "not judged idle")
        else:
            state = "idle"
        if state == "unwatched" and not node.notified:
            notify.append(node.instance_id)
        lag = None if node.gpu_newest is None else _minutes(now - node.gpu_newest)
        findings.append(NodeFinding(node.instance_id, state, node.gpu_peak, node.gpu_minutes, lag,
                                    node.cpu_peak, _minutes(age)))
    if reasons:
        return Verdict(False, "; ".join(reasons), tuple(findings), tuple(notify))
    return Verdict(True, f"{len(nodes)} node(s) below {threshold}% GPU utilisation for {idle_minutes} min",
                   tuple(findings))


# --------------------------------------------------------------------------------------------
# AWS reads and writes
# --------------------------------------------------------------------------------------------


def _running_instances(ec2, cluster: str, node_group: str) -> list[dict[str, Any]]:
    filters = [
        {"Name": "tag:eks:cluster-name", "Values": [cluster]},
        {"Name": "tag:eks:nodegroup-name", "Values": [node_group]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]},
    ]
    out: list[dict[str, Any]] = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page["Reservations"]:
            out.extend(reservation["Instances"])
    return out


def gpu_metric(cluster: str, instance: dict[str, Any]) -> dict[str, Any] | None:
    """The per-node GPU series of `instance`, named by the agent's exact dimensions (None while the
    instance has no private DNS name yet, hence no node name)."""
    node_name = instance.get("PrivateDnsName")
    if not node_name:
        return None
    return {"Namespace": METRIC_NAMESPACE, "MetricName": GPU_METRIC,
            "Dimensions": [{"Name": "ClusterName", "Value": cluster},
                           {"Name": "NodeName", "Value": node_name},
                           {"Name": "InstanceId", "Value": instance["InstanceId"]}]}


def cpu_metric(instance: dict[str, Any]) -> dict[str, Any]:
    return {"Namespace": EC2_NAMESPACE, "MetricName": CPU_METRIC,
            "Dimensions": [{"Name": "InstanceId", "Value": instance["InstanceId"]}]}


def _series(cloudwatch, metrics: list[dict[str, Any]], start: datetime,
            end: datetime) -> list[list[tuple[datetime, float]]]:
    """The 1-minute Maximum datapoints (time, value) of each metric between start and end, in the
    order given."""
    points: list[list[tuple[datetime, float]]] = [[] for _ in metrics]
    for offset in range(0, len(metrics), MAX_QUERIES_PER_CALL):
        chunk = metrics[offset:offset + MAX_QUERIES_PER_CALL]
        queries = [{"Id": f"m{offset + i}", "ReturnData": True,
                    "MetricStat": {"Metric": m, "Period": PERIOD_SECONDS, "Stat": "Maximum"}}
                   for i, m in enumerate(chunk)]
        pages = cloudwatch.get_paginator("get_metric_data").paginate(
            MetricDataQueries=queries, StartTime=start, EndTime=end)
        for page in pages:  # the paginator follows NextToken until every query is complete
            for result in page["MetricDataResults"]:
                points[int(result["Id"][1:])].extend(
                    zip(result.get("Timestamps", []), result.get("Values", []), strict=True))
    return points


def node_activity(cloudwatch, cluster: str, instances: list[dict[str, Any]], start: datetime,
                  end: datetime) -> list[NodeActivity]:
    """GPU and CPU evidence for each instance (GetMetricData, up to 500 queries a call: two per node)."""
    metrics: list[dict[str, Any]] = []
    slots: list[tuple[int | None, int]] = []  # per instance: index of its GPU query (or None), CPU query
    for inst in instances:
        gpu = gpu_metric(cluster, inst)
        gpu_slot = None
        if gpu is not None:
            gpu_slot = len(metrics)
            metrics.append(gpu)
        metrics.append(cpu_metric(inst))
        slots.append((gpu_slot, len(metrics) - 1))
    series = _series(cloudwatch, metrics, start, end) if metrics else []
    out = []
    for inst, (gpu_slot, cpu_slot) in zip(instances, slots, strict=True):
        gpu = [] if gpu_slot is None else series[gpu_slot]
        cpu = [value for _, value in series[cpu_slot]]
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
        out.append(NodeActivity(
            instance_id=inst["InstanceId"], launched_at=inst["LaunchTime"],
            gpu_peak=max(v for _, v in gpu) if gpu else None, gpu_minutes=len(gpu),
            gpu_newest=max(t for t, _ in gpu) if gpu else None,
            cpu_peak=max(cpu) if cpu else None, node_name=inst.get("PrivateDnsName", ""),
            notified=NOTIFIED_TAG in tags))
    return out


def notify_unwatched(clients: dict[str, Any], settings: GuardSettings, node_group: str,
                     nodes: list[NodeActivity], verdict: Verdict) -> list[str]:
    """Publish one notice per newly unwatched node and tag it; returns the instance ids notified."""
    if not verdict.notify:
        return []
    if not settings.alert_topic_arn:
        raise RuntimeError("ALERT_TOPIC_ARN is not set: cannot notify nodes without GPU telemetry "
                           f"({', '.join(verdict.notify)})")
    by_id = {n.instance_id: n for n in nodes}
    findings = {f.instance_id: f for f in verdict.nodes}
    for instance_id in verdict.notify:
        node, finding = by_id[instance_id], findings[instance_id]
        cpu = "none" if node.cpu_peak is None else f"{node.cpu_peak:.1f}%"
        newest = "none" if finding.gpu_lag_minutes is None else f"{finding.gpu_lag_minutes:g} min ago"
        clients["sns"].publish(
            TopicArn=settings.alert_topic_arn,
            Subject=f"ringtrain cost guard: no GPU telemetry from {instance_id}"[:100],
            Message=(
                f"Node {node.node_name or '?'} ({instance_id}) of node group {node_group} in cluster "
                f"{settings.cluster_name} has been up {finding.age_minutes:.0f} min and reported GPU "
                f"utilisation (CloudWatch {METRIC_NAMESPACE}/{GPU_METRIC}) for {node.gpu_minutes} of the "
                f"last {settings.idle_minutes} min, newest datapoint: {newest}; its CPU peaked at {cpu}.\n"
                "The cost guard does not scale a group down without GPU evidence, so this node keeps "
                "running and billing until someone looks. Check the amazon-cloudwatch-observability "
                "pods (CloudWatch agent, DCGM exporter) on that node, or scale the group down if no job "
                "runs there. This notice is sent once per instance."),
        )
        clients["ec2"].create_tags(Resources=[instance_id],
                                   Tags=[{"Key": NOTIFIED_TAG, "Value": datetime.now(UTC).isoformat()}])
    return list(verdict.notify)


def check_group(clients: dict[str, Any], settings: GuardSettings, node_group: str,
                now: datetime) -> dict[str, Any]:
    eks, ec2, cloudwatch = clients["eks"], clients["ec2"], clients["cloudwatch"]
    group = eks.describe_nodegroup(clusterName=settings.cluster_name, nodegroupName=node_group)["nodegroup"]
    scaling = group["scalingConfig"]
    if group.get("status") not in SCALABLE_STATES:
        return {"nodeGroup": node_group, "action": "none", "why": f"status {group.get('status')}"}
    if scaling["desiredSize"] <= scaling["minSize"]:
        return {"nodeGroup": node_group, "action": "none", "why": "already at its minimum size"}
    start = now - timedelta(minutes=settings.idle_minutes)
    instances = _running_instances(ec2, settings.cluster_name, node_group)
    nodes = node_activity(cloudwatch, settings.cluster_name, instances, start, now)
    verdict = idle_verdict(nodes, now, settings.idle_minutes, settings.idle_gpu_percent,
                           settings.grace_minutes)
    result = {"nodeGroup": node_group, "action": "none", "why": verdict.why, "nodes": verdict.evidence()}
    notified = notify_unwatched(clients, settings, node_group, nodes, verdict)
    if notified:
        result["notified"] = notified
    if not verdict.idle:
        return result
    eks.update_nodegroup_config(
        clusterName=settings.cluster_name,
        nodegroupName=node_group,
        scalingConfig={"minSize": scaling["minSize"], "maxSize": scaling["maxSize"],
                       "desiredSize": scaling["minSize"]},
    )
    result["action"] = f"desiredSize {scaling['desiredSize']} -> {scaling['minSize']}"
    return result


def run(clients: dict[str, Any], settings: GuardSettings,
        now: datetime | None = None) -> list[dict[str, Any]]:
    now = now or datetime.now(UTC)
    results = []
    for node_group in settings.node_groups:
        try:
            result = check_group(clients, settings, node_group, now)
        except Exception as exc:  # one broken group must not stop the others from being checked
            log.exception("checking %s failed", node_group)
            result = {"nodeGroup": node_group, "action": "error", "why": f"{type(exc).__name__}: {exc}"}
        log.info(json.dumps(result, default=str))
        results.append(result)
    if any(r["action"] == "error" for r in results):
        # Fail the invocation so the Lambda Errors metric (and its alarm) shows the guard is broken.
        raise RuntimeError(f"scale-to-zero check failed: {json.dumps(results, default=str)}")
    return results


def handler(event: dict, context: Any) -> list[dict[str, Any]]:  # Lambda entry point
    import boto3

    clients = {name: boto3.client(name) for name in ("eks", "ec2", "cloudwatch", "sns")}
    return run(clients, GuardSettings.from_env())
