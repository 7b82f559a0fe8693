"""Managed node groups: the on-demand CPU system group and the GPU groups from `ringtrain:nodeGroups`.

Every group gets its own launch template: IMDSv2 required, encrypted gp3 root volume, detailed
monitoring, instance/volume/ENI tags (the cost-allocation tag must reach what is billed; the
provider's default tags do not propagate to instances an Auto Scaling group launches).

GPU groups: AL2023 NVIDIA AMI, the `nvidia.com/gpu` NoSchedule taint, and labels the platform's
device plugins select on. EFA groups (docs/field-notes.md §1): one interface per network card laid out by
infra/efa.py, every interface in the node and EFA security groups, a `cluster` placement group
unless the group opts out (capacity reservations), and only the subnet of the single GPU AZ.
Non-EFA GPU groups also stay in the GPU AZ: an allreduce across AZs pays cross-AZ latency and
$0.01/GB each way on every gradient exchange.

Capacity Blocks for ML (`capacityType: CAPACITY_BLOCK`): the node group's capacity type is
CAPACITY_BLOCK and its launch template has market type `capacity-block` and targets the block's
reservation; EKS refuses the group otherwise (EKS user guide, "Create a managed node group with
Capacity Blocks for ML"; the EKS API's CapacityTypes enum lists CAPACITY_BLOCK, botocore eks
2017-11-01; terraform-provider-aws validates capacity_type against that enum, internal/service/eks/
node_group.go). The block's zone, instance type, size and state are checked against AWS before any
resource is declared (`lookup_capacity_block`, infra/config.py check_capacity_blocks).

The desired size belongs to whoever scales the group at run time (job submission, the cost guard's
scale-to-zero): `ignore_changes=["scalingConfig.desiredSize"]`, as terraform-aws-eks does
(docs/field-notes.md §3), so the next `pulumi up` does not undo it. Config desiredSize is the initial size.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra import iam
from infra.catalog import Catalog
from infra.cluster import EksCluster
from infra.config import CapacityBlock, NodeGroupConfig, SystemNodesConfig
from infra.efa import efa_interface_count, efa_interfaces
from train.contract import NODE_POOL_LABEL, SYSTEM_POOL  # (the MPIJob selects on them too)

GPU_AMI_TYPE = "AL2023_x86_64_NVIDIA"
CPU_AMI_TYPE = "AL2023_x86_64_STANDARD"
ROOT_DEVICE = "/dev/xvda"  # AL2023 EKS AMIs
SYSTEM_ROOT_VOLUME_GIB = 50
# IMDSv2 answers only within this many network hops. A pod in its own network namespace is one hop
# further than the node, so 1 keeps every such pod away from the node role's credentials; pods get
# AWS credentials from EKS Pod Identity instead. Everything that still needs IMDS runs with
# hostNetwork: aws-node (VPC CNI), kube-proxy, eks-pod-identity-agent, and the CloudWatch agent and
# Fluent Bit of amazon-cloudwatch-observability (aws-observability/helm-charts
# charts/amazon-cloudwatch-observability/templates/linux/fluent-bit-daemonset.yaml and
# cloudwatch-agent values: `hostNetwork: true`). EKS best practices: "Restrict access to the instance
# profile assigned to the worker node" (hop limit 1).
IMDS_HOP_LIMIT = 1

GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
# The label AWS's EFA device-plugin examples select on (aws-ia/terraform-aws-eks-blueprints patterns).
EFA_PRESENT_LABEL = "vpc.amazonaws.com/efa.present"
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU_TAINT_KEY, "value": "true", "effect": "NO_SCHEDULE"}
IGNORE_DESIRED_SIZE = ["scalingConfig.desiredSize"]
CAPACITY_BLOCK = "CAPACITY_BLOCK"
CAPACITY_BLOCK_MARKET_TYPE = "capacity-block"  # EC2 MarketType (botocore ec2 2016-11-15)


def node_group_name(cluster: str, group: str) -> str:
    """EKS node group name: <cluster>-<group> (at most 63 characters)."""
    name = f"{cluster}-{group}"
    if len(name) > 63:
        raise ValueError(
            f"node group name {name!r} is longer than 63 characters; shorten the stack or group name")
    return name


def gpu_node_labels(group: str, efa: bool) -> dict[str, str]:
    labels = {NODE_POOL_LABEL: group, GPU_PRESENT_LABEL: "true"}
    if efa:
        labels[EFA_PRESENT_LABEL] = "true"
    return labels


def placement_group_wanted(group: NodeGroupConfig) -> bool:
    return group.efa and group.placement_group


def lookup_capacity_block(reservation_id: str, provider: pulumi.ProviderResource) -> CapacityBlock:
    """AWS's record of a Capacity Block, read while the program runs (preview too), before any resource
    is declared; raises LookupError with the provider's reason (not found, not a Capacity Block, no
    permission for ec2:DescribeCapacityReservations)."""
    try:
        found = aws.ec2.get_capacity_block_reservation(
            id=reservation_id, opts=pulumi.InvokeOptions(provider=provider))
    except Exception as exc:  # the invoke's error text is the reason to show; its type says nothing
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise LookupError(reason) from None
    return CapacityBlock(
        reservation_id=reservation_id, availability_zone=str(found.availability_zone),
        instance_type=str(found.instance_type), instance_count=int(found.instance_count or 0),
        state=str(found.state), start_date=str(found.start_date), end_date=str(found.end_date))


def tag_specifications(tags: dict[str, str], name: str) -> list[aws.ec2.LaunchTemplateTagSpecificationArgs]:
    tagged = {**tags, "Name": name}
    return [aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=tagged)
            for kind in ("instance", "volume", "network-interface")]


@dataclass
class NodeGroupsInputs:
    cluster: EksCluster
    system: SystemNodesConfig
    groups: Sequence[NodeGroupConfig]
    catalog: Catalog
    private_subnet_ids: pulumi.Input[Sequence[str]]
    gpu_subnet_ids: pulumi.Input[Sequence[str]]
    node_security_group_id: pulumi.Input[str]
    efa_security_group_id: pulumi.Input[str]
    tags: dict[str, str]


class NodeGroups(pulumi.ComponentResource):
    """Node role, system node group, GPU node groups (launch templates, placement groups)."""

    def __init__(self, name: str, args: NodeGroupsInputs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ringtrain:compute:NodeGroups", name, None, opts)
        self._args = args
        self._name = name
        cluster = args.cluster
        child = pulumi.ResourceOptions(parent=self)

        self.role = aws.iam.Role(
            f"{name}-node-role",
            assume_role_policy=json.dumps(iam.service_trust_policy("ec2.amazonaws.com")),
            description=f"EKS nodes of {cluster.name}",
            opts=child,
        )
        # Access entries for this role are created by EKS itself for managed node groups (API mode).
        self.role_attachments = [
            aws.iam.RolePolicyAttachment(f"{name}-node-role-{arn.rsplit('/', 1)[-1]}", role=self.role.name,
                                         policy_arn=arn, opts=child)
            for arn in iam.NODE_ROLE_POLICIES
        ]

        system_lt = self._launch_template(
            f"{name}-{SYSTEM_POOL}", node_group_name(cluster.name, SYSTEM_POOL), SYSTEM_ROOT_VOLUME_GIB,
            security_group_ids=[args.node_security_group_id])
        self.system = self._node_group(
            SYSTEM_POOL, system_lt,
            instance_types=[args.system.instance_type], capacity_type="ON_DEMAND", ami_type=CPU_AMI_TYPE,
            subnet_ids=args.private_subnet_ids, labels={NODE_POOL_LABEL: SYSTEM_POOL}, taints=[],
            counts=args.system)

        self.launch_templates: dict[str, aws.ec2.LaunchTemplate] = {SYSTEM_POOL: system_lt}
        self.placement_groups: dict[str, aws.ec2.PlacementGroup] = {}
        self.gpu: dict[str, aws.eks.NodeGroup] = {}
        for group in args.groups:
            self.gpu[group.name] = self._gpu_group(group)

        self.register_outputs({})

    # -- pieces -------------------------------------------------------------------------------

    def _launch_template(self, resource_name: str, ng_name: str, root_gib: int, *,
                         security_group_ids: Sequence[pulumi.Input[str]] | None = None,
                         network_interfaces: list | None = None,
                         placement: aws.ec2.LaunchTemplatePlacementArgs | None = None,
                         reservation_id: str | None = None,
                         capacity_block: bool = False) -> aws.ec2.LaunchTemplate:
        reservation = market = None
        if reservation_id:
            reservation = aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
                capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                    capacity_reservation_id=reservation_id))
        if capacity_block:
            market = aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type=CAPACITY_BLOCK_MARKET_TYPE)
        lt = aws.ec2.LaunchTemplate(
            f"{resource_name}-lt",
            name_prefix=f"{ng_name}-",
            description=f"nodes of EKS node group {ng_name}",
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=IMDS_HOP_LIMIT),
            block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name=ROOT_DEVICE,
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    volume_size=root_gib, volume_type="gp3", encrypted="true", delete_on_termination="true"),
            )],
            # 1-minute EC2 metrics: the cost guard and operators see idle nodes sooner.
            monitoring=aws.ec2.LaunchTemplateMonitoringArgs(enabled=True),
            vpc_security_group_ids=security_group_ids,
            network_interfaces=network_interfaces,
            placement=placement,
            capacity_reservation_specification=reservation,
            instance_market_options=market,
            tag_specifications=tag_specifications(self._args.tags, ng_name),
            update_default_version=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        return lt

    def _node_group(self, key: str, lt: aws.ec2.LaunchTemplate, *, instance_types: list[str],
                    capacity_type: str, ami_type: str, subnet_ids, labels: dict[str, str], taints: list[dict],
                    counts) -> aws.eks.NodeGroup:
        cluster = self._args.cluster
        return aws.eks.NodeGroup(
            f"{self._name}-{key}",
            cluster_name=cluster.cluster.name,
            node_group_name=node_group_name(cluster.name, key),
            node_role_arn=self.role.arn,
            subnet_ids=subnet_ids,
            instance_types=instance_types,
            capacity_type=capacity_type,
            ami_type=ami_type,
            # Follow the control plane: after a `cluster.kubernetesVersion` change EKS rolls the
            # nodes to the same minor version (without it a group stays on its creation version).
            version=cluster.cluster.version,
            labels=labels,
            taints=[aws.eks.NodeGroupTaintArgs(**t) for t in taints],
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=counts.min_size, max_size=counts.max_size, desired_size=counts.desired_size),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=lt.id, version=lt.latest_version.apply(str)),
            opts=pulumi.ResourceOptions(
                parent=self,
                # The node add-ons (CNI first) outlive every node on destroy: see infra/cluster.py.
                depends_on=[*self.role_attachments, *cluster.node_addons],
                ignore_changes=IGNORE_DESIRED_SIZE,
                # The EKS name is fixed (the backend and the cost guard address it): a change that
                # forces a new node group (instance types, subnets) must delete the old one first.
                delete_before_replace=True,
            ),
        )

    def _gpu_group(self, group: NodeGroupConfig) -> aws.eks.NodeGroup:
        args = self._args
        ng_name = node_group_name(args.cluster.name, group.name)
        resource = f"{self._name}-{group.name}"
        placement = None
        if placement_group_wanted(group):
            pg = aws.ec2.PlacementGroup(
                f"{resource}-pg", name=ng_name, strategy="cluster",
                opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True))
            self.placement_groups[group.name] = pg
            placement = aws.ec2.LaunchTemplatePlacementArgs(group_name=pg.name)
        if group.efa:
            sgs = [args.node_security_group_id, args.efa_security_group_id]
            interfaces = [
                aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                    network_card_index=i.network_card_index, device_index=i.device_index,
                    interface_type=i.interface_type, security_groups=sgs, delete_on_termination="true")
                for i in efa_interfaces(args.catalog[group.instance_types[0]].network_cards)
            ]
            lt = self._launch_template(resource, ng_name, group.root_volume_gib,
                                       network_interfaces=interfaces, placement=placement,
                                       reservation_id=group.capacity_reservation_id,
                                       capacity_block=group.capacity_type == CAPACITY_BLOCK)
        else:
            lt = self._launch_template(resource, ng_name, group.root_volume_gib,
                                       security_group_ids=[args.node_security_group_id],
                                       reservation_id=group.capacity_reservation_id,
                                       capacity_block=group.capacity_type == CAPACITY_BLOCK)
        self.launch_templates[group.name] = lt
        return self._node_group(
            group.name, lt, instance_types=list(group.instance_types), capacity_type=group.capacity_type,
            ami_type=GPU_AMI_TYPE, subnet_ids=args.gpu_subnet_ids,
            labels=gpu_node_labels(group.name, group.efa),
            taints=[GPU_TAINT], counts=group)

    # -- exports ------------------------------------------------------------------------------

    def export(self) -> dict[str, dict]:
        """The `nodeGroups` stack output: name -> instance types, capacity type, EFA interfaces."""
        return {
            g.name: {
                "instanceTypes": list(g.instance_types),
                "capacityType": g.capacity_type,
                "efaInterfaces": efa_interface_count(g, self._args.catalog),
                "eksNodeGroupName": node_group_name(self._args.cluster.name, g.name),
            }
            for g in self._args.groups
        }
