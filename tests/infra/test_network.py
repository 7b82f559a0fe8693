"""Network: subnet layout (pure), VPC over >= 2 AZs, NAT modes, S3 gateway endpoint, flow logs, GPU AZ."""

import ipaddress
import json

import pytest

from infra.network import subnet_layout
from tests.infra.harness import run_program

SUBNET = "aws:ec2/subnet:Subnet"
NAT = "aws:ec2/natGateway:NatGateway"
ROUTE = "aws:ec2/route:Route"


@pytest.mark.parametrize(("cidr", "azs"), [
    ("10.0.0.0/16", ["a1a", "a1b"]),
    ("10.40.0.0/16", ["x1a", "x1b", "x1c"]),
    ("192.168.16.0/20", list("abcd")),
])
def test_layout_fits_the_vpc_without_overlap(cidr, azs):
    plan = subnet_layout(cidr, azs, azs[-1])
    vpc = ipaddress.IPv4Network(cidr)
    nets = [ipaddress.IPv4Network(c) for c in [plan.gpu, *plan.public.values(), *plan.private.values()]]
    assert all(n.subnet_of(vpc) for n in nets)
    assert not any(a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])
    assert set(plan.public) == set(plan.private) == set(azs) and plan.gpu_az == azs[-1]
    # The GPU subnet is the largest: EFA interfaces and pods each take an address.
    assert ipaddress.IPv4Network(plan.gpu).num_addresses == vpc.num_addresses // 4


def subnets(result):
    out = {"public": {}, "private": {}, "gpu": {}}
    for s in result.of_type(SUBNET):
        kind = s.name.split("-")[1]
        out[kind][s.inputs["availabilityZone"]] = s
    return out


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_vpc_spans_the_configured_zones_with_gpu_subnet_in_one(committed, stack):
    result = committed(stack)
    net_cfg = result.config["ringtrain:network"]
    vpc = result.one("aws:ec2/vpc:Vpc")
    assert vpc.inputs["cidrBlock"] == net_cfg["cidr"]
    assert vpc.inputs["enableDnsHostnames"] is True and vpc.inputs["enableDnsSupport"] is True
    s = subnets(result)
    assert sorted(s["public"]) == sorted(s["private"]) == sorted(net_cfg["availabilityZones"])
    assert len(net_cfg["availabilityZones"]) >= 2
    assert list(s["gpu"]) == [net_cfg["gpuAvailabilityZone"]]
    assert all(sub.inputs["mapPublicIpOnLaunch"] is False for sub in s["public"].values())
    assert result.exports["gpuSubnetIds"] == [s["gpu"][net_cfg["gpuAvailabilityZone"]].id]
    assert sorted(result.exports["privateSubnetIds"]) == sorted(x.id for x in s["private"].values())


def test_dev_has_one_shared_nat_in_the_gpu_zone(committed):
    result = committed("dev")
    (nat,) = result.of_type(NAT)
    gpu_az = result.config["ringtrain:network"]["gpuAvailabilityZone"]
    assert nat.inputs["subnetId"] == subnets(result)["public"][gpu_az].id
    defaults = [r for r in result.of_type(ROUTE) if "natGatewayId" in r.inputs]
    assert len(defaults) == 2 and {r.inputs["natGatewayId"] for r in defaults} == {nat.id}


def test_prod_has_one_nat_per_zone_routing_its_own_zone(committed):
    result = committed("prod")
    nats = {n.inputs["subnetId"]: n for n in result.of_type(NAT)}
    public = subnets(result)["public"]
    assert set(nats) == {s.id for s in public.values()}
    tables = {t.name: t for t in result.of_type("aws:ec2/routeTable:RouteTable")}
    for az, sub in public.items():
        (route,) = [r for r in result.of_type(ROUTE)
                    if r.inputs.get("routeTableId") == tables[f"net-private-{az}"].id]
        assert route.inputs["natGatewayId"] == nats[sub.id].id
        assert route.inputs["destinationCidrBlock"] == "0.0.0.0/0"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_s3_gateway_endpoint_serves_every_private_route_table(committed, stack):
    result = committed(stack)
    ep = result.one("aws:ec2/vpcEndpoint:VpcEndpoint")
    assert ep.inputs["vpcEndpointType"] == "Gateway"
    assert ep.inputs["serviceName"] == f"com.amazonaws.{result.config['aws:region']}.s3"
    private_tables = {t.id for t in result.of_type("aws:ec2/routeTable:RouteTable") if "-private-" in t.name}
    assert set(ep.inputs["routeTableIds"]) == private_tables and len(private_tables) >= 2
    # The GPU subnet routes through its zone's private table, hence through the endpoint too.
    gpu = result.one(SUBNET, next(s.name for s in result.of_type(SUBNET) if "-gpu-" in s.name))
    (assoc,) = [a for a in result.of_type("aws:ec2/routeTableAssociation:RouteTableAssociation")
                if a.inputs["subnetId"] == gpu.id]
    assert assoc.inputs["routeTableId"] in private_tables


def test_flow_logs_follow_config(committed):
    assert committed("dev").of_type("aws:ec2/flowLog:FlowLog") == []
    network = {**committed("prod").config["ringtrain:network"], "flowLogDestination": "cloudWatchLogs"}
    prod = run_program("prod", overrides={"ringtrain:network": network})
    flow = prod.one("aws:ec2/flowLog:FlowLog")
    group = prod.one("aws:cloudwatch/logGroup:LogGroup", "net-flow-logs")
    role = prod.one("aws:iam/role:Role", "net-flow-logs")
    assert flow.inputs["trafficType"] == "ALL" and flow.inputs["vpcId"] == prod.one("aws:ec2/vpc:Vpc").id
    assert flow.inputs["logDestination"] == group.outputs["arn"]
    assert flow.inputs["iamRoleArn"] == role.outputs["arn"]
    assert group.inputs["retentionInDays"] == 90
    trust = json.loads(role.inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "vpc-flow-logs.amazonaws.com"}
    perms = json.loads(prod.one("aws:iam/rolePolicy:RolePolicy", "net-flow-logs").inputs["policy"])
    assert set(perms["Statement"][0]["Resource"]) == {group.outputs["arn"], group.outputs["arn"] + ":*"}


def test_prod_flow_logs_go_to_an_encrypted_expiring_bucket_of_their_own(committed):
    """VPC user guide flow-logs-s3: the log-delivery service writes with bucket-owner-full-control
    and, with SSE-KMS, needs the customer key's policy to let it encrypt (the data key keeps AWS's
    default key policy, so the bucket gets its own key)."""
    prod = committed("prod")
    flow = prod.one("aws:ec2/flowLog:FlowLog")
    bucket = prod.one("aws:s3/bucket:Bucket", "net-flow-logs")
    assert flow.inputs["logDestinationType"] == "s3"
    assert flow.inputs["logDestination"] == bucket.outputs["arn"]
    assert "iamRoleArn" not in flow.inputs
    assert prod.of_type("aws:cloudwatch/logGroup:LogGroup") and not [
        g for g in prod.of_type("aws:cloudwatch/logGroup:LogGroup") if g.name == "net-flow-logs"]
    key = prod.one("aws:kms/key:Key", "net-flow-logs")
    (sse,) = [r for r in prod.of_type("aws:s3/bucketServerSideEncryptionConfiguration:"
                                      "BucketServerSideEncryptionConfiguration") if r.name == "net-flow-logs"]
    default = sse.inputs["rules"][0]["applyServerSideEncryptionByDefault"]
    assert default["kmsMasterKeyId"] == key.outputs["arn"]
    delivery = [st for st in json.loads(key.inputs["policy"])["Statement"]
                if st["Principal"] == {"Service": "delivery.logs.amazonaws.com"}]
    assert delivery and "kms:GenerateDataKey*" in delivery[0]["Action"]
    policy = json.loads(prod.one("aws:s3/bucketPolicy:BucketPolicy", "net-flow-logs").inputs["policy"])
    write = next(st for st in policy["Statement"] if st["Action"] == "s3:PutObject")
    assert write["Condition"]["StringEquals"]["s3:x-amz-acl"] == "bucket-owner-full-control"
    assert write["Condition"]["StringEquals"]["aws:SourceAccount"] == "123456789012"
    lifecycles = prod.of_type("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    (lifecycle,) = [r for r in lifecycles if r.name == "net-flow-logs"]
    assert lifecycle.inputs["rules"][0]["expiration"]["days"] == 90


def test_compute_off_removes_nat_but_keeps_the_network():
    result = run_program("dev", overrides={"ringtrain:compute": False})
    assert result.of_type(NAT) == [] and result.of_type("aws:ec2/eip:Eip") == []
    assert not [r for r in result.of_type(ROUTE) if "natGatewayId" in r.inputs]
    assert len(result.of_type(SUBNET)) == 5 and result.of_type("aws:ec2/vpcEndpoint:VpcEndpoint")
