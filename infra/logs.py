"""Log groups that AWS services write to under fixed names: declared with the data layer, so they outlive
`down` (compute off) and the next `up` finds them in the state instead of failing on them.

EKS delivers control-plane logs to /aws/eks/<cluster>/cluster for a while after the cluster is
deleted, and creates the group again if it is gone; the next create of that name then fails with
ResourceAlreadyExistsException ("The specified log group already exists"), since the group is no
longer in the state (terraform-aws-modules/terraform-aws-eks issues #920 and #2486, the latter's
CloudTrail record in #2763 shows the EKS service-linked role re-creating it; read 2026-12-06). A
deny on logs:CreateLogGroup in the cluster role does not stop it (#2446: the service-linked role
creates the group). The same race holds for the groups Fluent Bit and the CloudWatch agent of
amazon-cloudwatch-observability write to (auto_create_group true: aws-observability/helm-charts
fluent-bit-configmap.yaml) and for the cost guard's Lambda group (/aws/lambda/<function>; a last
invocation may still write after the function is gone).

So these groups are declared on every run, whether compute is on or off, under the same URNs, with a
retention so they expire. The aliases keep the URNs they had under the compute components
(EksCluster, CostGuard), so a stack deployed before this change moves them without a delete+create.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.cluster import (
    CONTAINER_INSIGHTS_LOG_GROUPS,
    CONTROL_PLANE_LOG_RETENTION_DAYS,
    cluster_name,
    container_insights_log_group,
)

LOG_GROUP_TYPE = "aws:cloudwatch/logGroup:LogGroup"
# The cost guard's Lambda log group keeps its events this long.
COST_GUARD_LOG_RETENTION_DAYS = 30


def cost_guard_function_name(cluster: str) -> str:
    """The scale-to-zero Lambda's name (at most 64 characters); its logs go to /aws/lambda/<name>."""
    return f"{cluster}-scale-to-zero"[:64]


@dataclass(frozen=True)
class ServiceLogGroup:
    """One log group an AWS service writes to: its logical name, its AWS name, and the type of the
    component that declared it before (for the alias)."""

    logical: str
    name: str
    retention_days: int
    old_parent_type: str


def service_log_groups(stack: str, container_log_retention_days: int) -> list[ServiceLogGroup]:
    """Every fixed-name log group an AWS service of the stack writes to (pure)."""
    cluster = cluster_name(stack)
    groups = [ServiceLogGroup("eks-logs", f"/aws/eks/{cluster}/cluster", CONTROL_PLANE_LOG_RETENTION_DAYS,
                              "ringtrain:compute:EksCluster")]
    groups += [ServiceLogGroup(f"eks-containerinsights-{kind}", container_insights_log_group(cluster, kind),
                               container_log_retention_days, "ringtrain:compute:EksCluster")
               for kind in CONTAINER_INSIGHTS_LOG_GROUPS]
    groups.append(ServiceLogGroup("costguard-logs", f"/aws/lambda/{cost_guard_function_name(cluster)}",
                                  COST_GUARD_LOG_RETENTION_DAYS, "ringtrain:compute:CostGuard"))
    return groups


def old_urn(project: str, stack: str, parent_type: str, child_type: str, child_name: str) -> str:
    """The URN of a child of a top-level component (Pulumi URN format: the parent's type chain, not
    its name: urn:pulumi:<stack>::<project>::<parent type>$<child type>::<child name>)."""
    return f"urn:pulumi:{stack}::{project}::{parent_type}${child_type}::{child_name}"


class ServiceLogGroups(pulumi.ComponentResource):
    """The log groups of service_log_groups(), kept with the data layer (same protection)."""

    def __init__(self, name: str, *, project: str, stack: str, container_log_retention_days: int,
                 protect: bool, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ringtrain:data:ServiceLogGroups", name, None, opts)
        self.groups: dict[str, aws.cloudwatch.LogGroup] = {}
        for group in service_log_groups(stack, container_log_retention_days):
            self.groups[group.name] = aws.cloudwatch.LogGroup(
                group.logical, name=group.name, retention_in_days=group.retention_days,
                opts=pulumi.ResourceOptions(
                    parent=self, protect=protect,
                    # A fixed name: a replacement must delete the old group first.
                    delete_before_replace=True,
                    aliases=[old_urn(project, stack, group.old_parent_type, LOG_GROUP_TYPE, group.logical)]))
        self.register_outputs({})

    def group(self, name: str) -> aws.cloudwatch.LogGroup:
        return self.groups[name]
