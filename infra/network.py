"""VPC over >= 2 AZs: public and private subnets, a GPU subnet pinned to one AZ, NAT, S3 gateway endpoint,
optional flow logs. The subnet layout and the flow-log IAM documents are plain functions."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.config import NetworkConfig


@dataclass(frozen=True)
class SubnetPlan:
    public: dict[str, str]  # az -> cidr
    private: dict[str, str]  # az -> cidr
    gpu: str  # cidr, in the GPU AZ
    gpu_az: str


def subnet_layout(vpc_cidr: str, azs: list[str], gpu_az: str) -> SubnetPlan:
    """Carve the VPC into quarters: GPU subnet (1/4), private subnets (1/16 each), public (1/64 each).

    The GPU subnet gets the largest block because every EFA interface and (with the VPC CNI) every pod
    takes an address: a p5.48xlarge alone attaches 32 EFA interfaces. The last quarter stays free.
    """
    vpc = ipaddress.IPv4Network(vpc_cidr)
    if len(azs) > 4:
        raise ValueError("the layout has room for 4 availability zones")
    quarters = list(vpc.subnets(prefixlen_diff=2))
    private_blocks = list(quarters[1].subnets(prefixlen_diff=2))
    public_blocks = list(quarters[2].subnets(prefixlen_diff=4))
    return SubnetPlan(
        public={az: str(public_blocks[i]) for i, az in enumerate(azs)},
        private={az: str(private_blocks[i]) for i, az in enumerate(azs)},
        gpu=str(quarters[0]),
        gpu_az=gpu_az,
    )


def flow_log_trust_policy(account_id: str) -> dict:
    """Only the VPC flow-logs service, acting for this account, may assume the flow-log role."""
    return {
        "Version": "2012-10-17",
        "Statement": [{
            "Sid": "FlowLogsAssume",
            "Effect": "Allow",
            "Principal": {"Service": "vpc-flow-logs.amazonaws.com"},
            "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"aws:SourceAccount": account_id}},
        }],
    }


def flow_log_permissions_policy(log_group_arn: str) -> dict:
    """Write access to the one flow-log group (its streams), nothing else."""
    return {
        "Version": "2012-10-17",
        "Statement": [{
            "Sid": "WriteFlowLogs",
            "Effect": "Allow",
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            "Resource": [log_group_arn, f"{log_group_arn}:*"],
        }],
    }


def flow_log_source_conditions(account_id: str, region: str) -> dict:
    """Only log deliveries of this account and region (confused-deputy guard of the VPC user guide's
    flow-logs-s3 bucket and key policies)."""
    return {"StringEquals": {"aws:SourceAccount": account_id},
            "ArnLike": {"aws:SourceArn": f"arn:aws:logs:{region}:{account_id}:*"}}


def flow_log_bucket_policy(bucket_arn: str, account_id: str, region: str) -> dict:
    """The flow-log bucket: the log-delivery service writes (VPC user guide "Amazon S3 bucket
    permissions for flow logs": s3:PutObject with bucket-owner-full-control, s3:GetBucketAcl and
    s3:ListBucket), nothing arrives without TLS."""
    source = flow_log_source_conditions(account_id, region)
    delivery = {"Service": "delivery.logs.amazonaws.com"}
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "AWSLogDeliveryWrite", "Effect": "Allow", "Principal": delivery,
             "Action": "s3:PutObject", "Resource": f"{bucket_arn}/AWSLogs/{account_id}/*",
             "Condition": {**source, "StringEquals": {**source["StringEquals"],
                                                      "s3:x-amz-acl": "bucket-owner-full-control"}}},
            {"Sid": "AWSLogDeliveryCheck", "Effect": "Allow", "Principal": delivery,
             "Action": ["s3:GetBucketAcl", "s3:ListBucket"], "Resource": bucket_arn, "Condition": source},
            {"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
             "Resource": [bucket_arn, f"{bucket_arn}/*"],
             "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
        ],
    }


def flow_log_key_policy(account_id: str, region: str) -> dict:
    """The flow-log bucket's own KMS key: the account administers it (as AWS's default key policy
    does); the log-delivery service may use it for this account's deliveries only (VPC user guide
    flow-logs-s3: SSE-KMS with a customer managed key needs this key-policy statement)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "AccountAdministers", "Effect": "Allow",
             "Principal": {"AWS": f"arn:aws:iam::{account_id}:root"}, "Action": "kms:*", "Resource": "*"},
            {"Sid": "AllowLogDeliveryUse", "Effect": "Allow",
             "Principal": {"Service": "delivery.logs.amazonaws.com"},
             "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*",
                        "kms:DescribeKey"],
             "Resource": "*", "Condition": flow_log_source_conditions(account_id, region)},
        ],
    }


class Network(pulumi.ComponentResource):
    """VPC, subnets, routing, NAT (only while compute is up), S3 gateway endpoint, flow logs."""

    def __init__(
        self,
        name: str,
        cfg: NetworkConfig,
        *,
        compute: bool,
        account_id: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("ringtrain:network:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        plan = subnet_layout(cfg.cidr, cfg.availability_zones, cfg.gpu_availability_zone)
        self.plan = plan

        self.vpc = aws.ec2.Vpc(
            f"{name}-vpc", cidr_block=cfg.cidr, enable_dns_hostnames=True, enable_dns_support=True,
            tags={"Name": f"{name}-vpc"}, opts=child)
        vpc_child = pulumi.ResourceOptions(parent=self.vpc)
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=self.vpc.id, tags={"Name": f"{name}-igw"},
                                      opts=vpc_child)

        # Public subnets: NAT gateways and internet-facing load balancers only; nothing gets a public IP
        # by default.
        public_rt = aws.ec2.RouteTable(f"{name}-public", vpc_id=self.vpc.id, tags={"Name": f"{name}-public"},
                                       opts=vpc_child)
        aws.ec2.Route(f"{name}-public-default", route_table_id=public_rt.id,
                      destination_cidr_block="0.0.0.0/0",
                      gateway_id=igw.id, opts=pulumi.ResourceOptions(parent=public_rt))
        self.public_subnets: dict[str, aws.ec2.Subnet] = {}
        for az, cidr in plan.public.items():
            subnet = aws.ec2.Subnet(
                f"{name}-public-{az}", vpc_id=self.vpc.id, cidr_block=cidr, availability_zone=az,
                map_public_ip_on_launch=False,
                tags={"Name": f"{name}-public-{az}", "kubernetes.io/role/elb": "1"}, opts=vpc_child)
            aws.ec2.RouteTableAssociation(f"{name}-public-{az}", subnet_id=subnet.id,
                                          route_table_id=public_rt.id,
                                          opts=pulumi.ResourceOptions(parent=subnet))
            self.public_subnets[az] = subnet

        # One private route table per AZ, so NAT can be per AZ or shared without re-plumbing subnets.
        self.private_route_tables: dict[str, aws.ec2.RouteTable] = {}
        self.private_subnets: dict[str, aws.ec2.Subnet] = {}
        for az, cidr in plan.private.items():
            rt = aws.ec2.RouteTable(f"{name}-private-{az}", vpc_id=self.vpc.id,
                                    tags={"Name": f"{name}-private-{az}"}, opts=vpc_child)
            subnet = aws.ec2.Subnet(
                f"{name}-private-{az}", vpc_id=self.vpc.id, cidr_block=cidr, availability_zone=az,
                tags={"Name": f"{name}-private-{az}", "kubernetes.io/role/internal-elb": "1"}, opts=vpc_child)
            aws.ec2.RouteTableAssociation(f"{name}-private-{az}", subnet_id=subnet.id, route_table_id=rt.id,
                                          opts=pulumi.ResourceOptions(parent=subnet))
            self.private_route_tables[az] = rt
            self.private_subnets[az] = subnet

        # GPU subnet: one explicitly named AZ (EFA groups cannot span AZs; a computed AZ drifts).
        self.gpu_subnet = aws.ec2.Subnet(
            f"{name}-gpu-{plan.gpu_az}", vpc_id=self.vpc.id, cidr_block=plan.gpu,
            availability_zone=plan.gpu_az,
            tags={"Name": f"{name}-gpu-{plan.gpu_az}", "ringtrain/role": "gpu"}, opts=vpc_child)
        aws.ec2.RouteTableAssociation(f"{name}-gpu-{plan.gpu_az}", subnet_id=self.gpu_subnet.id,
                                      route_table_id=self.private_route_tables[plan.gpu_az].id,
                                      opts=pulumi.ResourceOptions(parent=self.gpu_subnet))

        # NAT exists only while compute is up (it bills by the hour).
        self.nat_gateways: dict[str, aws.ec2.NatGateway] = {}
        if compute:
            for az in cfg.nat_gateway_azs:
                eip = aws.ec2.Eip(f"{name}-nat-{az}", domain="vpc", tags={"Name": f"{name}-nat-{az}"},
                                  opts=child)
                nat = aws.ec2.NatGateway(
                    f"{name}-nat-{az}", allocation_id=eip.id, subnet_id=self.public_subnets[az].id,
                    tags={"Name": f"{name}-nat-{az}"},
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]))
                self.nat_gateways[az] = nat
            for az, rt in self.private_route_tables.items():
                nat = self.nat_gateways.get(az) or self.nat_gateways[plan.gpu_az]
                aws.ec2.Route(f"{name}-private-{az}-default", route_table_id=rt.id,
                              destination_cidr_block="0.0.0.0/0", nat_gateway_id=nat.id,
                              opts=pulumi.ResourceOptions(parent=rt))

        # S3 gateway endpoint: dataset and checkpoint traffic stays off NAT (free, and faster).
        self.s3_endpoint = aws.ec2.VpcEndpoint(
            f"{name}-s3", vpc_id=self.vpc.id, service_name=f"com.amazonaws.{_region_of(cfg)}.s3",
            vpc_endpoint_type="Gateway", route_table_ids=[rt.id for rt in self.private_route_tables.values()],
            tags={"Name": f"{name}-s3"}, opts=vpc_child)

        self.flow_log: aws.ec2.FlowLog | None = None
        if cfg.flow_logs:
            self.flow_log = self._flow_logs(name, cfg, account_id)

        self.private_subnet_ids = pulumi.Output.all(*[s.id for s in self.private_subnets.values()])
        self.public_subnet_ids = pulumi.Output.all(*[s.id for s in self.public_subnets.values()])
        self.gpu_subnet_ids = pulumi.Output.all(self.gpu_subnet.id)
        self.register_outputs({
            "vpcId": self.vpc.id,
            "privateSubnetIds": self.private_subnet_ids,
            "publicSubnetIds": self.public_subnet_ids,
            "gpuSubnetIds": self.gpu_subnet_ids,
        })

    def _flow_logs(self, name: str, cfg: NetworkConfig, account_id: pulumi.Input[str]) -> aws.ec2.FlowLog:
        if cfg.flow_log_destination == "s3":
            return self._flow_logs_to_s3(name, cfg, account_id)
        child = pulumi.ResourceOptions(parent=self)
        # CloudWatch Logs encrypts log data at rest itself; a customer key would need a key policy
        # granting the logs service, which the data key deliberately does not have.
        # A prefix, not a fixed name: a replacement creates the new group before deleting the old one.
        group = aws.cloudwatch.LogGroup(
            f"{name}-flow-logs", name_prefix=f"/ringtrain/{pulumi.get_stack()}/vpc-flow-logs-",
            retention_in_days=cfg.flow_log_retention_days, opts=child)
        role = aws.iam.Role(
            f"{name}-flow-logs",
            assume_role_policy=pulumi.Output.from_input(account_id).apply(
                lambda acct: json.dumps(flow_log_trust_policy(acct))),
            opts=child)
        aws.iam.RolePolicy(
            f"{name}-flow-logs", role=role.id,
            policy=group.arn.apply(lambda arn: json.dumps(flow_log_permissions_policy(arn))),
            opts=pulumi.ResourceOptions(parent=role))
        return aws.ec2.FlowLog(
            f"{name}-flow-logs", vpc_id=self.vpc.id, traffic_type="ALL",
            log_destination_type="cloud-watch-logs",
            log_destination=group.arn, iam_role_arn=role.arn, max_aggregation_interval=60, opts=child)


    def _flow_logs_to_s3(self, name: str, cfg: NetworkConfig,
                         account_id: pulumi.Input[str]) -> aws.ec2.FlowLog:
        """Flow logs as S3 objects: vended-log delivery costs $0.25/GB to S3 against $0.50/GB to
        CloudWatch Logs (first 10 TB a month, plus storage; Amazon CloudWatch pricing, "Vended logs",
        as tabulated in aws-samples/sample-cfm-tips-mcp services/cloudwatch_service_vended_log.py),
        for logs that are read rarely. The
        bucket has its own key (the data key keeps AWS's default key policy, which does not let the
        log-delivery service encrypt), blocks public access, takes TLS only, and expires objects after
        flowLogRetentionDays. It holds only disposable logs, so destroy may empty it."""
        child = pulumi.ResourceOptions(parent=self)
        region = _region_of(cfg)
        stack = pulumi.get_stack().lower()
        key = aws.kms.Key(
            f"{name}-flow-logs", description=f"ringtrain {stack}: VPC flow logs bucket",
            enable_key_rotation=True, deletion_window_in_days=7,
            policy=pulumi.Output.from_input(account_id).apply(
                lambda acct: json.dumps(flow_log_key_policy(acct, region))),
            opts=child)
        bucket = aws.s3.Bucket(f"{name}-flow-logs", bucket_prefix=f"ringtrain-{stack}-flow-logs-"[:37],
                               force_destroy=True, opts=child)
        in_bucket = pulumi.ResourceOptions(parent=bucket)
        owner = aws.s3.BucketOwnershipControls(
            f"{name}-flow-logs", bucket=bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=in_bucket)
        block = aws.s3.BucketPublicAccessBlock(
            f"{name}-flow-logs", bucket=bucket.id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=in_bucket)
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-flow-logs", bucket=bucket.id,
            rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                apply_server_side_encryption_by_default=aws.s3.
                BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                    sse_algorithm="aws:kms", kms_master_key_id=key.arn),
                bucket_key_enabled=True)],
            opts=in_bucket)
        policy = aws.s3.BucketPolicy(
            f"{name}-flow-logs", bucket=bucket.id,
            policy=pulumi.Output.all(bucket.arn, account_id).apply(
                lambda v: json.dumps(flow_log_bucket_policy(v[0], v[1], region))),
            opts=pulumi.ResourceOptions(parent=bucket, depends_on=[block, owner]))
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-flow-logs", bucket=bucket.id,
            rules=[aws.s3.BucketLifecycleConfigurationRuleArgs(
                id="expire-flow-logs", status="Enabled",
                filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(
                    days=cfg.flow_log_retention_days))],
            opts=in_bucket)
        return aws.ec2.FlowLog(
            f"{name}-flow-logs", vpc_id=self.vpc.id, traffic_type="ALL", log_destination_type="s3",
            log_destination=bucket.arn, max_aggregation_interval=60,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[policy]))


def _region_of(cfg: NetworkConfig) -> str:
    # Every AZ was validated to be <region><letter>.
    return cfg.availability_zones[0][:-1]
