"""Cost guard that works while nobody watches: idle scale-to-zero of the GPU node groups.

Scale-to-zero: an EventBridge schedule runs infra/scale_to_zero.py (Lambda) every
CHECK_EVERY_MINUTES; it scales a GPU node group to zero once all its nodes' GPUs stayed below
`costGuard.idleGpuUtilizationPercent` for `costGuard.idleMinutes` (see that module for the rule).
Why a Lambda and not a CloudWatch alarm on the group's Auto Scaling group: GPU utilisation is
published per node (Container Insights has no node-group dimension), and a node group's CPU is a
poor idle signal (8 busy ranks on a 192-vCPU p5 read as ~4% CPU). The Lambda also goes through
the EKS API (UpdateNodegroupConfig), so EKS's view of the group never disagrees with its ASG.
A node without GPU telemetry is never scaled away: the guard e-mails `costGuard.notificationEmail`
through the alert topic, naming the node. If the guard itself fails, an alarm on its Errors
metric e-mails the same address.
The stack's monthly budget is infra/budget.py: it stays while compute is off.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws

from infra import iam
from infra.cluster import EksCluster
from infra.config import CostGuardConfig
from infra.logs import cost_guard_function_name
from infra.scale_to_zero import NOTIFIED_TAG

CHECK_EVERY_MINUTES = 5
GRACE_MINUTES = 10  # a new node's telemetry needs a few minutes before it reports GPU utilisation
LAMBDA_RUNTIME = "python3.12"
LAMBDA_SOURCE = Path(__file__).with_name("scale_to_zero.py")
LAMBDA_HANDLER = "scale_to_zero.handler"


def guard_environment(cluster: str, node_groups: Sequence[str], cfg: CostGuardConfig,
                      alert_topic_arn: pulumi.Input[str]) -> dict[str, pulumi.Input[str]]:
    return {
        "CLUSTER_NAME": cluster,
        "NODE_GROUPS": json.dumps(list(node_groups)),
        "IDLE_MINUTES": str(cfg.idle_minutes),
        "IDLE_GPU_PERCENT": str(cfg.idle_gpu_utilization_percent),
        "GRACE_MINUTES": str(GRACE_MINUTES),
        "ALERT_TOPIC_ARN": alert_topic_arn,
    }


@dataclass
class CostGuardInputs:
    cluster: EksCluster
    account_id: pulumi.Input[str]
    gpu_node_groups: Sequence[str]  # EKS node group names
    node_group_resources: Sequence[pulumi.Resource]
    config: CostGuardConfig
    log_group: aws.cloudwatch.LogGroup  # /aws/lambda/<function>, from infra/logs.py
    alert_topic: aws.sns.Topic  # the stack's alert topic, from infra/alerts.py


class CostGuard(pulumi.ComponentResource):
    def __init__(self, name: str, args: CostGuardInputs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ringtrain:compute:CostGuard", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        cluster = args.cluster
        function_name = cost_guard_function_name(cluster.name)

        # /aws/lambda/<function>, declared with the data layer (infra/logs.py): a last invocation may
        # write to it after the function is gone.
        self.log_group = args.log_group
        # Alerts to the stack's address: nodes the guard cannot judge (no GPU telemetry), and the
        # guard's own failures (the Errors alarm below). The topic and its confirmed e-mail
        # subscription live with the data layer (infra/alerts.py).
        self.topic = args.alert_topic
        self.role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=json.dumps(iam.service_trust_policy("lambda.amazonaws.com")),
            description=f"scale-to-zero cost guard of {cluster.name}", opts=child)
        self.policy = aws.iam.RolePolicy(
            f"{name}-policy",
            role=self.role.id,
            policy=pulumi.Output.all(args.account_id, self.log_group.arn, self.topic.arn).apply(
                lambda v: json.dumps(iam.scale_to_zero_policy(
                    cluster.region, v[0], cluster.name, list(args.gpu_node_groups), v[1], v[2],
                    NOTIFIED_TAG))),
            opts=child)
        self.function = aws.lambda_.Function(
            f"{name}-fn",
            name=function_name,
            runtime=LAMBDA_RUNTIME,
            handler=LAMBDA_HANDLER,
            role=self.role.arn,
            code=pulumi.AssetArchive({LAMBDA_SOURCE.name: pulumi.FileAsset(str(LAMBDA_SOURCE))}),
            timeout=120,
            memory_size=256,
            # No reserved concurrency: new accounts must keep 10 unreserved. Runs do not overlap anyway
            # (a check takes seconds; the schedule is every CHECK_EVERY_MINUTES).
            environment=aws.lambda_.FunctionEnvironmentArgs(
                variables=guard_environment(cluster.name, args.gpu_node_groups, args.config, self.topic.arn)),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.log_group, self.policy,
                                                                 *args.node_group_resources],
                                        delete_before_replace=True),
        )
        self.schedule = aws.cloudwatch.EventRule(
            f"{name}-schedule",
            description=f"check {cluster.name}'s GPU node groups for idleness",
            schedule_expression=f"rate({CHECK_EVERY_MINUTES} minutes)", opts=child)
        self.permission = aws.lambda_.Permission(
            f"{name}-invoke",
            action="lambda:InvokeFunction",
            function=self.function.name,
            principal="events.amazonaws.com",
            source_arn=self.schedule.arn,
            opts=child)
        self.target = aws.cloudwatch.EventTarget(
            f"{name}-target", rule=self.schedule.name, arn=self.function.arn,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.permission]))

        # The guard failing must not go unnoticed: e-mail on any error in 15 minutes.
        self.errors_alarm = aws.cloudwatch.MetricAlarm(
            f"{name}-errors",
            alarm_description=f"the scale-to-zero cost guard of {cluster.name} is failing",
            namespace="AWS/Lambda",
            metric_name="Errors",
            dimensions={"FunctionName": self.function.name},
            statistic="Sum",
            period=300,
            evaluation_periods=3,
            threshold=1,
            comparison_operator="GreaterThanOrEqualToThreshold",
            treat_missing_data="notBreaching",
            alarm_actions=[self.topic.arn], opts=child)

        self.register_outputs({"functionName": self.function.name})
