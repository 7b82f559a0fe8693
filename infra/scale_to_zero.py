"""Cost guard Lambda: scale idle GPU node groups to zero. Standalone: stdlib + boto3 only.

Runs every few minutes (EventBridge schedule, infra/costguard.py). For each GPU node group of the
cluster that has nodes, it looks at every running node's GPU utilisation in CloudWatch Container
Insights (metric `node_gpu_utilization`, published by the amazon-cloudwatch-observability add-on's
DCGM exporter; every per-node and per-GPU series of that instance counts). When every node has been
up longer than the idle window plus a start-up grace and no GPU on any of them reached the threshold
during the idle window, the group's desired size is set to its minimum (0: config requires it for
GPU groups) with eks:UpdateNodegroupConfig. The node group's desired size is ignored by `pulumi up`
(infra/nodegroups.py), so the next deployment does not bring the nodes back.

A node without any GPU datapoint over the window (telemetry not running there) is judged by its
EC2 CPUUtilization instead (1-minute detailed monitoring, set in its launch template), with the
same threshold: a running Horovod job keeps several cores busy, an idle node's agents stay near 1%.
A node with neither signal for the whole window counts as idle: the guard then errs on the side of
the bill (a resumable job loses at most the work since its checkpoint; an unwatched p5 costs
~$55/h). Anchors: ParallelCluster ScaledownIdletime 10 min, SkyPilot autostop 5-10 min
(FIELD_NOTES §4).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

METRIC_NAMESPACE = "ContainerInsights"
GPU_METRIC = "node_gpu_utilization"
EC2_NAMESPACE = "AWS/EC2"
CPU_METRIC = "CPUUtilization"
# Node groups in these states can be scaled; others (CREATING, UPDATING, DELETING) are left alone.
SCALABLE_STATES = ("ACTIVE", "DEGRADED")
PERIOD_SECONDS = 60

log = logging.getLogger("ringtrain.scale_to_zero")
log.setLevel(logging.INFO)


@dataclass(frozen=True)
class GuardSettings:
    cluster_name: str
    node_groups: tuple[str, ...]
    idle_minutes: int
    idle_gpu_percent: float
    grace_minutes: int

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> GuardSettings:
        env = dict(os.environ if env is None else env)
        settings = cls(
            cluster_name=env["CLUSTER_NAME"],
            node_groups=tuple(json.loads(env["NODE_GROUPS"])),
            idle_minutes=int(env["IDLE_MINUTES"]),
            idle_gpu_percent=float(env["IDLE_GPU_PERCENT"]),
            grace_minutes=int(env.get("GRACE_MINUTES", "10")),
        )
        if settings.idle_minutes < 1:
            raise ValueError(f"IDLE_MINUTES must be >= 1, got {settings.idle_minutes}")
        return settings


@dataclass(frozen=True)
class NodeActivity:
    instance_id: str
    launched_at: datetime
    gpu_peak: float | None  # highest GPU utilisation (%) in the idle window; None: no datapoint
    cpu_peak: float | None = None  # highest EC2 CPU utilisation (%): the fallback signal


def idle_verdict(nodes: list[NodeActivity], now: datetime, idle_minutes: int, threshold: float,
                 grace_minutes: int) -> tuple[bool, str]:
    """(scale down?, why) for one node group's running nodes."""
    if not nodes:
        return False, "no running nodes"
    settle = timedelta(minutes=idle_minutes + grace_minutes)
    for node in nodes:
        if now - node.launched_at < settle:
            return False, f"{node.instance_id} started less than {idle_minutes}+{grace_minutes} min ago"
        if node.gpu_peak is not None:
            if node.gpu_peak >= threshold:
                return False, (f"{node.instance_id} GPU peaked at {node.gpu_peak:.1f}% "
                               f"(threshold {threshold}%)")
        elif node.cpu_peak is not None and node.cpu_peak >= threshold:
            return False, (f"{node.instance_id} has no GPU metrics; its CPU peaked at {node.cpu_peak:.1f}% "
                           f"(threshold {threshold}%)")
    return True, f"{len(nodes)} node(s) below {threshold}% utilisation for {idle_minutes} min"


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


def _gpu_peak(cloudwatch, cluster: str, instance_id: str, start: datetime, end: datetime) -> float | None:
    metrics: list[dict[str, Any]] = []
    for page in cloudwatch.get_paginator("list_metrics").paginate(
        Namespace=METRIC_NAMESPACE, MetricName=GPU_METRIC,
        Dimensions=[{"Name": "ClusterName", "Value": cluster}, {"Name": "InstanceId", "Value": instance_id}],
    ):
        metrics.extend(page["Metrics"])
    return _peak(cloudwatch, metrics, start, end)


def _cpu_peak(cloudwatch, instance_id: str, start: datetime, end: datetime) -> float | None:
    metric = {"Namespace": EC2_NAMESPACE, "MetricName": CPU_METRIC,
              "Dimensions": [{"Name": "InstanceId", "Value": instance_id}]}
    return _peak(cloudwatch, [metric], start, end)


def _peak(cloudwatch, metrics: list[dict[str, Any]], start: datetime, end: datetime) -> float | None:
    """Highest 1-minute Maximum of any of `metrics` between start and end (None: no datapoint)."""
    peak: float | None = None
    # GetMetricData takes up to 500 queries per call; a node has one series per GPU plus a node series.
    for offset in range(0, len(metrics), 500):
        queries = [
            {"Id": f"m{i}", "MetricStat": {"Metric": m, "Period": PERIOD_SECONDS, "Stat": "Maximum"},
             "ReturnData": True}
            for i, m in enumerate(metrics[offset:offset + 500])
        ]
        result = cloudwatch.get_metric_data(MetricDataQueries=queries, StartTime=start, EndTime=end)
        for series in result["MetricDataResults"]:
            for value in series.get("Values", []):
                peak = value if peak is None else max(peak, value)
    return peak


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
    nodes = []
    for inst in _running_instances(ec2, settings.cluster_name, node_group):
        gpu = _gpu_peak(cloudwatch, settings.cluster_name, inst["InstanceId"], start, now)
        cpu = _cpu_peak(cloudwatch, inst["InstanceId"], start, now) if gpu is None else None
        nodes.append(NodeActivity(inst["InstanceId"], inst["LaunchTime"], gpu, cpu))
    idle, why = idle_verdict(nodes, now, settings.idle_minutes, settings.idle_gpu_percent,
                             settings.grace_minutes)
    if not idle:
        return {"nodeGroup": node_group, "action": "none", "why": why}
    eks.update_nodegroup_config(
        clusterName=settings.cluster_name,
        nodegroupName=node_group,
        scalingConfig={"minSize": scaling["minSize"], "maxSize": scaling["maxSize"],
                       "desiredSize": scaling["minSize"]},
    )
    action = f"desiredSize {scaling['desiredSize']} -> {scaling['minSize']}"
    return {"nodeGroup": node_group, "action": action, "why": why}


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
        log.info(json.dumps(result))
        results.append(result)
    if any(r["action"] == "error" for r in results):
        # Fail the invocation so the Lambda Errors metric (and its alarm) shows the guard is broken.
        raise RuntimeError(f"scale-to-zero check failed: {json.dumps(results)}")
    return results


def handler(event: dict, context: Any) -> list[dict[str, Any]]:  # Lambda entry point
    import boto3

    clients = {name: boto3.client(name) for name in ("eks", "ec2", "cloudwatch")}
    return run(clients, GuardSettings.from_env())
