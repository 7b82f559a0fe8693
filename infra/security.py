"""Security groups: cluster (control plane), node, and a dedicated EFA group.

Names: `<name_prefix>-<role>-` plus the suffix AWS-side uniqueness needs (pulumi-aws `namePrefix`).
Never the logical name: pulumi-aws would autoname `sg-cluster-1a2b3c4` from a component called `sg`,
and EC2 refuses any group name that starts with `sg-` (CreateSecurityGroup GroupName: "Can't start
with sg-", https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateSecurityGroup.html;
pulumi/pulumi-awsx#328). tests/infra/test_aws_rules.py checks every group of every committed stack.

No rule anywhere admits traffic from 0.0.0.0/0. The EFA group allows ALL traffic from itself AND to
itself: an egress rule to 0.0.0.0/0 does not cover EFA's SRD traffic, and without the self egress rule
NCCL fails with "Unresponsive receiver" (docs/field-notes.md §1). Rules are separate resources
(aws.vpc.SecurityGroupIngressRule / EgressRule), so AWS's implicit allow-all egress is never relied on.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws


class SecurityGroups(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        *,
        vpc_id: pulumi.Input[str],
        vpc_cidr: str,
        name_prefix: str,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("ringtrain:security:SecurityGroups", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        def group(suffix: str, description: str) -> aws.ec2.SecurityGroup:
            return aws.ec2.SecurityGroup(
                f"{name}-{suffix}", name_prefix=f"{name_prefix}-{suffix}-", vpc_id=vpc_id,
                description=description, tags={"Name": f"{name_prefix}-{suffix}"}, opts=child)

        self.cluster_sg = group("cluster", "EKS control plane: API from nodes only")
        self.node_sg = group("node", "EKS nodes: node-to-node, control plane to kubelet, egress")
        self.efa_sg = group("efa", "EFA: all traffic to and from members of this group only")

        def ingress(rule: str, sg: aws.ec2.SecurityGroup, **kw) -> aws.vpc.SecurityGroupIngressRule:
            return aws.vpc.SecurityGroupIngressRule(f"{name}-{rule}", security_group_id=sg.id, **kw,
                                                    opts=pulumi.ResourceOptions(parent=sg))

        def egress(rule: str, sg: aws.ec2.SecurityGroup, **kw) -> aws.vpc.SecurityGroupEgressRule:
            return aws.vpc.SecurityGroupEgressRule(f"{name}-{rule}", security_group_id=sg.id, **kw,
                                                   opts=pulumi.ResourceOptions(parent=sg))

        # EFA: self in both directions, all protocols.
        ingress("efa-self-in", self.efa_sg, ip_protocol="-1", referenced_security_group_id=self.efa_sg.id,
                description="EFA: all traffic from this group")
        egress("efa-self-out", self.efa_sg, ip_protocol="-1", referenced_security_group_id=self.efa_sg.id,
               description="EFA: all traffic to this group (NCCL needs it)")

        # Nodes: each other (pods, CoreDNS, Horovod's TCP rendezvous), the control plane (kubelet,
        # webhooks, metrics), and outbound for images and AWS APIs (through NAT / the S3 endpoint).
        ingress("node-self-in", self.node_sg, ip_protocol="-1", referenced_security_group_id=self.node_sg.id,
                description="node to node")
        ingress("node-from-cluster-443", self.node_sg, ip_protocol="tcp", from_port=443, to_port=443,
                referenced_security_group_id=self.cluster_sg.id, description="control plane to webhooks")
        ingress("node-from-cluster-kubelet", self.node_sg, ip_protocol="tcp", from_port=10250, to_port=10250,
                referenced_security_group_id=self.cluster_sg.id, description="control plane to kubelet")
        ingress("node-from-cluster-high", self.node_sg, ip_protocol="tcp", from_port=1025, to_port=65535,
                referenced_security_group_id=self.cluster_sg.id, description="control plane to pods")
        egress("node-out", self.node_sg, ip_protocol="-1", cidr_ipv4="0.0.0.0/0",
               description="images, AWS APIs, S3")

        # Control plane: API from nodes; talks to nodes inside the VPC only.
        ingress("cluster-from-node-443", self.cluster_sg, ip_protocol="tcp", from_port=443, to_port=443,
                referenced_security_group_id=self.node_sg.id, description="nodes to the Kubernetes API")
        egress("cluster-to-vpc", self.cluster_sg, ip_protocol="-1", cidr_ipv4=vpc_cidr,
               description="control plane to nodes")

        self.register_outputs({
            "clusterSecurityGroupId": self.cluster_sg.id,
            "nodeSecurityGroupId": self.node_sg.id,
            "efaSecurityGroupId": self.efa_sg.id,
        })
