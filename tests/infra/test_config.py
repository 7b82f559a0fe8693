"""Stack config validation: committed stacks pass; each bad value yields ONE error naming key, value, rule."""

import copy

import pulumi
import pytest

from infra.config import ConfigError, parse_stack_config, raw_namespace
from tests.infra.harness import engine_config, run_program, stack_config


def raw(stack: str = "dev") -> tuple[dict, str]:
    cfg = stack_config(stack)
    return raw_namespace(engine_config(cfg)), cfg["aws:region"]


def parse(mutate, stack: str = "dev"):
    ns, region = raw(stack)
    ns = copy.deepcopy(ns)
    region = mutate(ns) or region
    return parse_stack_config(ns, region)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_committed_stacks_validate(stack):
    settings = parse(lambda ns: None, stack)
    assert settings.region == stack_config(stack)["aws:region"]
    assert settings.stack.node_groups


def test_dev_and_prod_shapes_as_documented():
    dev = parse(lambda ns: None, "dev").stack
    prod = parse(lambda ns: None, "prod").stack
    assert {g.capacity_type for g in dev.node_groups} == {"SPOT"}
    assert not any(g.efa for g in dev.node_groups)
    assert dev.network.nat_gateways == "single" and dev.network.flow_logs is False
    (ondemand,) = [g for g in prod.node_groups if g.capacity_type == "ON_DEMAND"]
    assert ondemand.instance_types == ["p5.48xlarge"] and ondemand.efa and ondemand.placement_group
    assert any(g.capacity_type == "SPOT" for g in prod.node_groups)
    assert prod.network.nat_gateways == "perAz" and prod.network.flow_logs is True


def _set(path: str, value):
    """Mutator setting ns[path] (dotted, [i] for list items); value None with del_=True deletes."""
    def mutate(ns):
        keys = []
        for part in path.split("."):
            while "[" in part:
                head, rest = part.split("[", 1)
                if head:
                    keys.append(head)
                keys.append(int(rest.split("]", 1)[0]))
                part = rest.split("]", 1)[1]
            if part:
                keys.append(part)
        node = ns
        for k in keys[:-1]:
            node = node[k]
        if value is _DELETE:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
    return mutate


_DELETE = object()

BAD = [
    # (id, mutator, exact message prefix or fragments that must all appear)
    ("unknown top-level key", _set("colour", "blue"),
     ['ringtrain:colour: "blue" is invalid: unknown key; allowed keys here: owner, costCenter']),
    ("unknown nested key", _set("network.subnets", []),
     ["ringtrain:network.subnets: [] is invalid: unknown key", "availabilityZones"]),
    ("missing section", _set("data", _DELETE),
     ["ringtrain:data: (missing) is invalid: required: a mapping with keys bucketPrefix, "
      "checkpointNoncurrentDays"]),
    ("missing field", _set("network.flowLogs", _DELETE),
     ["ringtrain:network.flowLogs: (missing) is invalid: required: true or false"]),
    ("wrong type ttl", _set("ttlHours", "soon"),
     ['ringtrain:ttlHours: "soon" is invalid: an integer 1..8760']),
    ("wrong type count", _set("nodeGroups[0].maxSize", "four"),
     ['ringtrain:nodeGroups[0].maxSize: "four" is invalid: an integer 1..450']),
    ("bool as string", _set("compute", "yes"), ['ringtrain:compute: "yes" is invalid: true']),
    ("cidr host bits", _set("network.cidr", "10.20.0.1/16"),
     ['ringtrain:network.cidr: "10.20.0.1/16" is invalid: an IPv4 CIDR with no host bits set']),
    ("cidr garbage", _set("network.cidr", "10.300.0.0/16"),
     ['ringtrain:network.cidr: "10.300.0.0/16" is invalid']),
    ("cidr public", _set("network.cidr", "8.8.0.0/16"), ["ringtrain:network.cidr", "private (RFC 1918)"]),
    ("cidr too small", _set("network.cidr", "10.20.0.0/24"), ["ringtrain:network.cidr", "/16 to /20"]),
    ("service cidr overlaps vpc", _set("network.kubernetesServiceCidr", "10.20.128.0/17"),
     ['ringtrain:network.kubernetesServiceCidr: "10.20.128.0/17" is invalid: a CIDR that does not overlap '
      "network.cidr (10.20.0.0/16)"]),
    ("public cidrs overlap", _set("cluster.publicAccessCidrs", ["52.94.0.0/22", "52.94.2.0/24"]),
     ['ringtrain:cluster.publicAccessCidrs[1]: "52.94.2.0/24" is invalid: a CIDR that does not overlap '
      "cluster.publicAccessCidrs[0]"]),
    # RFC 5737 documentation and RFC 1918 private ranges: no caller of a public endpoint comes from them.
    *[(f"public cidr {cidr}", _set("cluster.publicAccessCidrs", ["52.94.0.0/22", cidr]),
       [f'ringtrain:cluster.publicAccessCidrs[1]: "{cidr}" is invalid: your public egress CIDR',
        "RFC 1918", "RFC 5737"])
      for cidr in ("203.0.113.0/24", "198.51.100.7/32", "192.0.2.0/24", "10.0.0.0/8", "172.16.5.0/24",
                   "192.168.1.10/32")],
    ("public cidr world", _set("cluster.publicAccessCidrs", ["0.0.0.0/0"]),
     ['ringtrain:cluster.publicAccessCidrs[0]: "0.0.0.0/0" is invalid: a specific CIDR (never 0.0.0.0/0']),
    ("gpu az outside region", _set("network.gpuAvailabilityZone", "us-west-2a"),
     ['ringtrain:network.gpuAvailabilityZone: "us-west-2a" is invalid: a zone of aws:region us-east-1']),
    ("gpu az not listed", _set("network.gpuAvailabilityZone", "us-east-1c"),
     ['ringtrain:network.gpuAvailabilityZone: "us-east-1c" is invalid: one of network.availabilityZones']),
    ("az outside region", _set("network.availabilityZones", ["us-east-1a", "eu-west-1b"]),
     ['ringtrain:network.availabilityZones[1]: "eu-west-1b" is invalid: a zone of aws:region us-east-1']),
    ("one az", _set("network.availabilityZones", ["us-east-1a"]),
     ["ringtrain:network.availabilityZones", "2 to 4"]),
    ("duplicate az", _set("network.availabilityZones", ["us-east-1a", "us-east-1a"]),
     ["ringtrain:network.availabilityZones", "DISTINCT"]),
    ("nat mode", _set("network.natGateways", "two"),
     ['ringtrain:network.natGateways: "two" is invalid: single (one shared NAT, cheap) or perAz']),
    ("efa on non-efa type", lambda ns: ns["nodeGroups"][0].update(instanceTypes=["g6e.12xlarge"], efa=True),
     ['ringtrain:nodeGroups[0].instanceTypes[0]: "g6e.12xlarge" is invalid: an EFA-capable type while efa is '
      "true", "p5.48xlarge"]),
    ("spot mixes shapes", _set("nodeGroups[0].instanceTypes", ["g5.12xlarge", "g6.12xlarge"]),
     ['ringtrain:nodeGroups[0].instanceTypes[1]: "g6.12xlarge" is invalid: a type of the spot pool\'s GPU '
      "shape 4 x A10G 24 GiB", "it is 4 x L4 24 GiB"]),
    ("gpu count differs", lambda ns: ns["nodeGroups"][0].update(
        instanceTypes=["g5.12xlarge", "g5.48xlarge"], capacityType="ON_DEMAND"),
     ['ringtrain:nodeGroups[0].instanceTypes[1]: "g5.48xlarge" is invalid: a type with 4 GPUs like '
      "g5.12xlarge"]),
    ("unknown instance type", _set("nodeGroups[1].instanceTypes", ["p9.96xlarge"]),
     ['ringtrain:nodeGroups[1].instanceTypes[0]: "p9.96xlarge" is invalid: a GPU instance type from '
      "infra/catalog.yaml"]),
    ("cpu type in gpu group", _set("nodeGroups[1].instanceTypes", ["m7i.large"]),
     ['ringtrain:nodeGroups[1].instanceTypes[0]: "m7i.large" is invalid: a GPU instance type']),
    ("gpu type as system node", _set("cluster.systemNodes.instanceType", "g5.12xlarge"),
     ['ringtrain:cluster.systemNodes.instanceType: "g5.12xlarge" is invalid: a CPU instance type']),
    ("min above max", lambda ns: ns["nodeGroups"][0].update(minSize=0, maxSize=2, desiredSize=3),
     ["ringtrain:nodeGroups[0].desiredSize: 3 is invalid: between minSize (0) and maxSize (2)"]),
    ("max out of range", _set("nodeGroups[0].maxSize", 1000),
     ["ringtrain:nodeGroups[0].maxSize: 1000 is invalid: an integer 1..450"]),
    ("negative", _set("nodeGroups[0].desiredSize", -1),
     ["ringtrain:nodeGroups[0].desiredSize: -1 is invalid: an integer 0..450"]),
    ("system min zero", _set("cluster.systemNodes.minSize", 0),
     ["ringtrain:cluster.systemNodes.minSize: 0 is invalid: at least 1"]),
    ("system max below min",
     lambda ns: ns["cluster"]["systemNodes"].update(minSize=3, desiredSize=3, maxSize=2),
     ["ringtrain:cluster.systemNodes.minSize: 3 is invalid: at most maxSize (2)"]),
    ("duplicate group name", _set("nodeGroups[1].name", "a10g-spot"),
     ['ringtrain:nodeGroups[1].name: "a10g-spot" is invalid: a name no other node group uses']),
    ("reservation on spot", _set("nodeGroups[0].capacityReservationId", "cr-0123456789abcdef0"),
     ['ringtrain:nodeGroups[0].capacityReservationId: "cr-0123456789abcdef0" is invalid: '
      "null for SPOT groups"]),
    ("bad reservation id", _set("nodeGroups[0].capacityReservationId", "reservation-1"),
     ['ringtrain:nodeGroups[0].capacityReservationId: "reservation-1" is invalid: '
      "null or a capacity reservation"]),
    ("kubernetes version unquoted", _set("cluster.kubernetesVersion", 1.36),
     ["ringtrain:cluster.kubernetesVersion: 1.36 is invalid: "
      "one of 1.35, 1.36 (a quoted string; older versions are past EKS standard support"]),
    ("kubernetes version unsupported", _set("cluster.kubernetesVersion", "1.20"),
     ['ringtrain:cluster.kubernetesVersion: "1.20" is invalid: one of 1.35']),
    # 1.34 left EKS standard support on 2026-12-02 (EKS Kubernetes release calendar).
    ("kubernetes version past standard support", _set("cluster.kubernetesVersion", "1.34"),
     ['ringtrain:cluster.kubernetesVersion: "1.34" is invalid: one of 1.35, 1.36',
      "docs/ARCHITECTURE.md 'Upgrading Kubernetes'"]),
    # CloudWatch Logs PutRetentionPolicy accepts only its listed day counts (2 is not one).
    ("flow log retention", _set("network.flowLogRetentionDays", 2),
     ["ringtrain:network.flowLogRetentionDays: 2 is invalid: one of 1, 3, 5, 7, 14, 30,"]),
    ("container log retention", _set("cluster.containerLogRetentionDays", 10),
     ["ringtrain:cluster.containerLogRetentionDays: 10 is invalid: one of 1, 3, 5, 7, 14, 30,"]),
    ("support type", _set("cluster.supportType", "NONE"),
     ['ringtrain:cluster.supportType: "NONE" is invalid: STANDARD (EKS upgrades the cluster']),
    ("bucket prefix", _set("data.bucketPrefix", "Acme_Data"),
     ['ringtrain:data.bucketPrefix: "Acme_Data" is invalid: 3 to 50 characters of lowercase letters']),
    ("section not a mapping", _set("network", "10.0.0.0/16"),
     ['ringtrain:network: "10.0.0.0/16" is invalid: a mapping of keys; allowed keys: cidr']),
    ("no gpu groups", _set("nodeGroups", []),
     ["ringtrain:nodeGroups: [] is invalid: at least one GPU node group while compute is true"]),
    ("budget", _set("costGuard.monthlyBudgetUsd", 0),
     ["ringtrain:costGuard.monthlyBudgetUsd: 0.0 is invalid: a positive amount of US dollars"]),
    ("email", _set("costGuard.notificationEmail", "ops"),
     ['ringtrain:costGuard.notificationEmail: "ops" is invalid: an e-mail address']),
]


@pytest.mark.parametrize(("mutate", "fragments"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_config_gives_one_clear_error(mutate, fragments):
    with pytest.raises(ConfigError) as info:
        parse(mutate)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(fragments[0]), message
    for fragment in fragments[1:]:
        assert fragment in message, message


def test_on_demand_group_may_mix_models_of_one_gpu_count():
    # Only spot pools must keep one GPU shape; on-demand groups need one GPU count.
    settings = parse(lambda ns: ns["nodeGroups"][0].update(
        instanceTypes=["g5.12xlarge", "g6.12xlarge"], capacityType="ON_DEMAND"))
    assert settings.stack.node_groups[0].instance_types == ["g5.12xlarge", "g6.12xlarge"]


def test_spot_pool_of_one_shape_with_different_hosts_is_fine():
    settings = parse(_set("nodeGroups[0].instanceTypes", ["g5.12xlarge", "g5.24xlarge"]))
    assert settings.stack.node_groups[0].capacity_type == "SPOT"


def test_efa_group_types_must_share_network_cards():
    expected = (r"nodeGroups\[0\].instanceTypes\[1\]: \"p5en.48xlarge\" is invalid: "
                r"a type with 32 network cards")
    with pytest.raises(ConfigError, match=expected):
        parse(lambda ns: ns["nodeGroups"][0].update(
            instanceTypes=["p5e.48xlarge", "p5en.48xlarge"], efa=True, capacityType="ON_DEMAND"), "prod")


@pytest.mark.parametrize(("region", "shown"), [(None, "(missing)"), ("useast1", '"useast1"')])
def test_region_missing_or_malformed(region, shown):
    ns, _ = raw()
    with pytest.raises(ConfigError) as info:
        parse_stack_config(ns, region)
    assert str(info.value).startswith(f"aws:region: {shown} is invalid: an AWS region like us-east-1")


def test_several_problems_report_the_first_and_count_the_rest():
    def mutate(ns):
        ns["ttlHours"] = "soon"
        ns["owner"] = ""
    with pytest.raises(ConfigError, match=r"\(and 1 more problem\(s\) after fixing this one\)$"):
        parse(mutate)


def test_program_fails_cleanly_before_declaring_anything():
    """Through the real program: one RunError (printed without traceback by Pulumi), no resource."""
    cfg = stack_config("dev")
    cfg["ringtrain:nodeGroups"] = copy.deepcopy(cfg["ringtrain:nodeGroups"])
    cfg["ringtrain:nodeGroups"][0]["instanceTypes"] = ["g5.12xlarge", "g6.12xlarge"]
    with pytest.raises(pulumi.RunError) as info:
        run_program("dev", config=cfg)
    assert str(info.value).startswith('ringtrain:nodeGroups[0].instanceTypes[1]: "g6.12xlarge" is invalid')
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert info.value.harness_resources == []


def test_program_rejects_unknown_key_from_the_engine():
    with pytest.raises(pulumi.RunError, match=r"^ringtrain:nodeGroup: .* unknown key"):
        run_program("dev", overrides={"ringtrain:nodeGroup": []})
