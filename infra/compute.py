"""The compute layer in one call (declared only while `ringtrain:compute` is true).

Dependency order, which is also the teardown order in reverse (pulumi-eks#1226: a destroy fails
with DependencyViolation when ENIs still sit on a security group):

    security groups, KMS key  <-  cluster  <-  node add-ons (vpc-cni, kube-proxy, pod identity)
        <-  node groups (+ launch templates, placement groups)  <-  coredns, telemetry add-ons
        <-  Kubernetes platform (provider, device plugins, MPI operator, training identity)
        <-  cost guard

On `pulumi destroy` (or `up` with compute false) Pulumi removes the platform first while nodes and
the API server are still there, then the node groups: EKS drains and terminates every instance and
waits for its Auto Scaling group to go, while the VPC CNI that attached the pod ENIs is still
running (node groups depend on it), and every launch-template ENI is delete-on-termination. Only
then go the add-ons, the cluster (whose control-plane ENIs EKS removes with it) and, last, the
security groups, whose rules are separate resources (infra/security.py), so no group is held by
another group's rule; the AWS provider additionally retries a security-group delete that still
meets a DependencyViolation for its delete timeout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.catalog import load_catalog
from infra.cluster import ClusterInputs, EksCluster
from infra.config import NodeGroupConfig, Settings
from infra.costguard import CostGuard, CostGuardInputs
from infra.logs import ServiceLogGroups, service_log_groups
from infra.nodegroups import NodeGroups, NodeGroupsInputs, node_group_name
from infra.platform import TRAINING_NAMESPACE, TRAINING_SERVICE_ACCOUNT, Platform, PlatformInputs


@dataclass
class Compute:
    cluster: EksCluster
    node_groups: NodeGroups
    platform: Platform
    cost_guard: CostGuard | None  # None when every GPU group runs on a Capacity Block

    def exports(self) -> dict[str, Any]:
        return {
            "clusterName": self.cluster.cluster.name,
            "kubeconfig": self.cluster.kubeconfig,  # secret
            "trainingNamespace": TRAINING_NAMESPACE,
            "trainingServiceAccount": TRAINING_SERVICE_ACCOUNT,
            "trainingRoleArn": self.platform.training_role.arn,
            "nodeGroups": self.node_groups.export(),
        }


def guarded_node_groups(groups: Sequence[NodeGroupConfig]) -> list[NodeGroupConfig]:
    """The GPU groups the idle guard scales to zero: all but Capacity Block groups (paid up front)."""
    return [g for g in groups if g.capacity_type != "CAPACITY_BLOCK"]


def deploying_principal(provider: pulumi.ProviderResource) -> str:
    """The IAM role or user running this `pulumi up`: an assumed-role session's issuer role (with its
    path), or the caller itself (aws.iam.get_session_context passes non-role ARNs through)."""
    invoke = pulumi.InvokeOptions(provider=provider)
    caller = aws.get_caller_identity(opts=invoke).arn
    return aws.iam.get_session_context(arn=caller, opts=invoke).issuer_arn


def declare_compute(settings: Settings, *, stack: str, account_id: pulumi.Input[str], network, security, data,
                    service_logs: ServiceLogGroups, alert_topic: aws.sns.Topic, tags: dict[str, str],
                    opts: pulumi.ResourceOptions) -> Compute:
    cfg = settings.stack
    catalog = load_catalog()
    cluster_logs = service_log_groups(stack, cfg.cluster.container_log_retention_days)
    by_kind = {g.logical: service_logs.group(g.name) for g in cluster_logs}
    cluster = EksCluster("eks", ClusterInputs(
        stack=stack,
        region=settings.region,
        kubernetes_version=cfg.cluster.kubernetes_version,
        support_type=cfg.cluster.support_type,
        public_access_cidrs=cfg.cluster.public_access_cidrs,
        service_cidr=cfg.network.kubernetes_service_cidr,
        subnet_ids=network.private_subnet_ids,
        cluster_security_group_id=security.cluster_sg.id,
        kms_key_arn=data.kms_key.arn,
        admin_principal_arns=cfg.cluster.admin_principal_arns,
        log_group=by_kind["eks-logs"],
    ), opts=opts)
    nodes = NodeGroups("nodes", NodeGroupsInputs(
        cluster=cluster,
        system=cfg.cluster.system_nodes,
        groups=cfg.node_groups,
        catalog=catalog,
        private_subnet_ids=network.private_subnet_ids,
        gpu_subnet_ids=network.gpu_subnet_ids,
        node_security_group_id=security.node_sg.id,
        efa_security_group_id=security.efa_sg.id,
        tags=tags,
    ), opts=opts)
    workload_addons = cluster.add_workload_addons(
        "eks", nodes.system,
        container_log_groups=[g for key, g in by_kind.items() if key.startswith("eks-containerinsights-")])
    platform = Platform("platform", PlatformInputs(
        cluster=cluster,
        datasets_bucket_arn=data.datasets_bucket.arn,
        checkpoints_bucket_arn=data.checkpoints_bucket.arn,
        kms_key_arn=data.kms_key.arn,
        # ... and the access entries the Kubernetes provider authenticates through.
        depends_on=[nodes.system, *nodes.gpu.values(), *workload_addons, *cluster.admin_policies],
    ), opts=opts)
    # Capacity Block groups are paid up front for the whole block (EC2 cannot cancel or modify one:
    # CancelCapacityReservation API reference, read 2026-12-06): scaling one down saves nothing and only
    # ends its job, so the guard does not watch them.
    guarded = guarded_node_groups(cfg.node_groups)
    guard = None
    if guarded:
        guard = CostGuard("costguard", CostGuardInputs(
            cluster=cluster,
            account_id=account_id,
            gpu_node_groups=[node_group_name(cluster.name, g.name) for g in guarded],
            node_group_resources=[nodes.gpu[g.name] for g in guarded],
            config=cfg.cost_guard,
            log_group=by_kind["costguard-logs"],
            alert_topic=alert_topic,
        ), opts=opts)
    return Compute(cluster=cluster, node_groups=nodes, platform=platform, cost_guard=guard)
