"""Capacity Blocks for ML (`capacityType: CAPACITY_BLOCK`): config rules, the check against AWS's record
of the block, what the program declares, and what the plan shows.

What EKS and EC2 require (EKS user guide, "Create a managed node group with Capacity Blocks for ML",
https://docs.aws.amazon.com/eks/latest/userguide/capacity-blocks-mng.html): a custom launch template
whose InstanceMarketOptions.MarketType is "capacity-block" and whose CapacityReservationSpecification
targets the block, and the node group's capacity type CAPACITY_BLOCK; "if the capacity type isn't set
to CAPACITY_BLOCK or any of the other required launch template values are missing, then the create
request will be rejected" (quoted in hashicorp/terraform-provider-aws#40876). The EKS API's
CapacityTypes enum is ON_DEMAND, SPOT, CAPACITY_BLOCK (botocore eks 2017-11-01 service model), which
terraform-provider-aws validates capacity_type against (internal/service/eks/node_group.go,
enum.Validate[types.CapacityTypes]). The block's instances exist only in its zone, so the group's
subnets must be that zone's (EC2 user guide, "Launch instances using Capacity Blocks", requirements;
aws-ia/terraform-aws-eks-blueprints, patterns/ml-capacity-block/eks.tf).
"""

from __future__ import annotations

import copy

import pulumi
import pytest

from cluster.aws.outputs import parse_outputs
from cluster.aws.plan import offline_plan, plan_to_table
from infra.config import CapacityBlock, ConfigError, check_capacity_blocks, parse_stack_config, raw_namespace
from infra.nodegroups import CAPACITY_BLOCK_MARKET_TYPE
from tests.infra.harness import (
    CAPACITY_BLOCK_INVOKE,
    COMMITTED_STACKS,
    engine_config,
    run_program,
    stack_config,
)

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
BLOCK_ID = "cr-02168da1478b509e0"
CB_GROUP = {"name": "h100-block", "instanceTypes": ["p5.48xlarge"], "capacityType": "CAPACITY_BLOCK",
            "capacityReservationId": BLOCK_ID, "minSize": 0, "maxSize": 2, "desiredSize": 0,
            "efa": True, "placementGroup": False, "rootVolumeGiB": 500}


def prod_with_block(**changes) -> dict:
    cfg = copy.deepcopy(stack_config("prod"))
    cfg["ringtrain:nodeGroups"] = [*cfg["ringtrain:nodeGroups"], {**CB_GROUP, **changes}]
    return cfg


def settings_of(cfg: dict):
    return parse_stack_config(raw_namespace(engine_config(cfg)), cfg["aws:region"])


def block(**changes) -> CapacityBlock:
    fields = {"reservation_id": BLOCK_ID, "availability_zone": "us-west-2b", "instance_type": "p5.48xlarge",
              "instance_count": 2, "state": "active", "start_date": "2026-12-07T11:30:00Z",
              "end_date": "2026-12-14T11:30:00Z"}
    return CapacityBlock(**{**fields, **changes})


# -- config rules that need no AWS -----------------------------------------------------------------


@pytest.mark.parametrize(("changes", "expected"), [
    ({"capacityReservationId": None},
     'ringtrain:nodeGroups[2].capacityReservationId: (missing) is invalid: the id (cr-...) of the Capacity '
     "Block the CAPACITY_BLOCK group launches into"),
    ({"instanceTypes": ["p5.48xlarge", "p5e.48xlarge"]},
     'ringtrain:nodeGroups[2].instanceTypes: ["p5.48xlarge", "p5e.48xlarge"] is invalid: exactly one '
     "instance type, the Capacity Block's, for a CAPACITY_BLOCK group"),
    ({"placementGroup": True},
     "ringtrain:nodeGroups[2].placementGroup: true is invalid: false with a capacityReservationId"),
    ({"capacityType": "BLOCK"},
     'ringtrain:nodeGroups[2].capacityType: "BLOCK" is invalid: ON_DEMAND, SPOT or CAPACITY_BLOCK'),
])
def test_capacity_block_config_is_validated_offline(changes, expected):
    cfg = prod_with_block(**changes)
    if changes.get("capacityReservationId", "") is None:
        del cfg["ringtrain:nodeGroups"][2]["capacityReservationId"]
    with pytest.raises(ConfigError) as info:
        settings_of(cfg)
    assert str(info.value).startswith(expected), str(info.value)


# -- the check against AWS's record of the block (pure: the lookup is passed in) ---------------------


@pytest.mark.parametrize(("found", "group_changes", "expected"), [
    (block(availability_zone="us-west-2a"), {},
     f'ringtrain:nodeGroups[2].capacityReservationId: "{BLOCK_ID}" is invalid: a Capacity Block in '
     "network.gpuAvailabilityZone (us-west-2b), where GPU nodes launch; this one is in us-west-2a: set "
     "network.gpuAvailabilityZone to us-west-2a or use a block in us-west-2b"),
    (block(instance_type="p5e.48xlarge"), {},
     'ringtrain:nodeGroups[2].instanceTypes[0]: "p5.48xlarge" is invalid: p5e.48xlarge, the instance type '
     f"of Capacity Block {BLOCK_ID}"),
    (block(instance_count=1), {},
     f"ringtrain:nodeGroups[2].maxSize: 2 is invalid: at most 1, the instances Capacity Block {BLOCK_ID} "
     "holds"),
    (block(state="scheduled"), {"desiredSize": 1},
     f"ringtrain:nodeGroups[2].desiredSize: 1 is invalid: 0 until Capacity Block {BLOCK_ID} is active (it "
     "is scheduled, starts 2026-12-07T11:30:00Z)"),
    (block(state="expired"), {},
     f'ringtrain:nodeGroups[2].capacityReservationId: "{BLOCK_ID}" is invalid: a Capacity Block that is '
     "payment-pending, scheduled or active; this one is expired"),
])
def test_block_must_match_the_group(found, group_changes, expected):
    settings = settings_of(prod_with_block(**group_changes))
    with pytest.raises(ConfigError) as info:
        check_capacity_blocks(settings, lambda rid: found)
    assert str(info.value).startswith(expected), str(info.value)


def test_a_matching_block_passes_also_before_it_starts():
    settings = settings_of(prod_with_block())
    asked = []
    check_capacity_blocks(settings, lambda rid: asked.append(rid) or block(state="scheduled"))
    assert asked == [BLOCK_ID]


def test_a_block_aws_cannot_find_names_the_reason():
    def lookup(rid):
        raise LookupError("no EC2 Capacity Block Reservation found")
    with pytest.raises(ConfigError) as info:
        check_capacity_blocks(settings_of(prod_with_block()), lookup)
    assert str(info.value) == (
        f'ringtrain:nodeGroups[2].capacityReservationId: "{BLOCK_ID}" is invalid: a Capacity Block for ML '
        "of this account in aws:region us-west-2; looking it up failed: "
        "no EC2 Capacity Block Reservation found")


# -- the program -------------------------------------------------------------------------------------


def capacity_block_violations(result) -> list[str]:
    """EKS's Capacity Block rule over every node group a program declares (see the module docstring):
    CAPACITY_BLOCK <=> launch template market type capacity-block, which needs a reservation target,
    and the group's subnets are the GPU zone's only."""
    templates = {lt.outputs["id"]: lt for lt in result.of_type(LAUNCH_TEMPLATE)}
    gpu_subnets = result.exports.get("gpuSubnetIds")
    out = []
    for ng in result.of_type(NODE_GROUP):
        lt = templates[ng.inputs["launchTemplate"]["id"]]
        market = (lt.inputs.get("instanceMarketOptions") or {}).get("marketType")
        target = ((lt.inputs.get("capacityReservationSpecification") or {})
                  .get("capacityReservationTarget") or {}).get("capacityReservationId")
        is_block = ng.inputs.get("capacityType") == "CAPACITY_BLOCK"
        if is_block != (market == CAPACITY_BLOCK_MARKET_TYPE):
            out.append(f"{ng.name}: capacityType {ng.inputs.get('capacityType')} with market type {market}")
        if is_block and not target:
            out.append(f"{ng.name}: Capacity Block launch template {lt.name} targets no reservation")
        if is_block and ng.inputs["subnetIds"] != gpu_subnets:
            out.append(f"{ng.name}: subnets {ng.inputs['subnetIds']} are not the GPU zone's {gpu_subnets}")
    return out


@pytest.mark.parametrize("stack", COMMITTED_STACKS)
def test_committed_stacks_follow_the_capacity_block_rule(stack):
    assert capacity_block_violations(run_program(stack)) == []


def test_capacity_block_group_is_declared_as_eks_requires():
    result = run_program("prod", config=prod_with_block())
    assert capacity_block_violations(result) == []
    ng = result.one(NODE_GROUP, "nodes-h100-block")
    assert ng.inputs["capacityType"] == "CAPACITY_BLOCK"
    assert ng.inputs["instanceTypes"] == ["p5.48xlarge"]
    lt = result.one(LAUNCH_TEMPLATE, "nodes-h100-block-lt")
    assert lt.inputs["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert lt.inputs["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": BLOCK_ID}}
    # p5.48xlarge: an EFA-only interface on each of its 32 cards (infra/efa.py), no placement group.
    efa = [n for n in lt.inputs["networkInterfaces"] if n["interfaceType"] in ("efa", "efa-only")]
    assert len(efa) == 32 and not lt.inputs.get("placement")
    # The other groups stay as they were: no market options on on-demand or spot templates.
    assert not result.one(LAUNCH_TEMPLATE, "nodes-h100-ondemand-lt").inputs.get("instanceMarketOptions")
    # The AWS backend reads the group back from the stack outputs (job submission scales it).
    assert parse_outputs("prod", result.exports).node_group("h100-block").capacity_type == "CAPACITY_BLOCK"


def test_a_block_in_another_zone_stops_the_program_before_anything_is_declared():
    def elsewhere(args, region):
        return {"id": args["id"], "availabilityZone": "us-west-2a", "instanceType": "p5.48xlarge",
                "instanceCount": 2, "state": "active", "startDate": "s", "endDate": "e"}
    with pytest.raises(pulumi.RunError) as info:
        run_program("prod", config=prod_with_block(), invokes={CAPACITY_BLOCK_INVOKE: elsewhere})
    assert str(info.value).startswith(f'ringtrain:nodeGroups[2].capacityReservationId: "{BLOCK_ID}" is '
                                      "invalid: a Capacity Block in network.gpuAvailabilityZone (us-west-2b)")
    # Only the AWS provider the lookup goes through was registered; it creates nothing in AWS.
    assert {r.type for r in info.value.harness_resources} <= {"pulumi:providers:aws"}


def test_plan_shows_the_block_and_keeps_it_out_of_the_hourly_totals():
    plan = offline_plan("prod", 24, config=prod_with_block())
    (group,) = [g for g in plan.node_groups if g.name == "h100-block"]
    assert group.capacity_type == "CAPACITY_BLOCK" and group.max_size == 2
    (line,) = [line for line in plan.cost.full_scale if line.item.startswith("h100-block")]
    assert line.usd_per_hour_each is None and "Capacity Block" in line.note
    without = offline_plan("prod", 24)
    assert plan.cost.full_scale_usd_per_hour == without.cost.full_scale_usd_per_hour
    table = plan_to_table(plan)
    assert "CAPACITY_BLOCK" in table and "paid up front" in table


def test_the_cost_guard_never_scales_a_capacity_block_group():
    """A block is paid up front for its whole duration and EC2 cannot cancel it ("You can't modify or
    cancel a Capacity Block": EC2 API reference CancelCapacityReservation, read 2026-12-06): scaling its
    group to zero saves nothing and only ends the job."""
    import json

    result = run_program("prod", config=prod_with_block())
    (fn,) = result.of_type("aws:lambda/function:Function")
    watched = json.loads(fn.inputs["environment"]["variables"]["NODE_GROUPS"])
    assert "ringtrain-prod-h100-block" not in watched
    assert watched == ["ringtrain-prod-h100-ondemand", "ringtrain-prod-h100-spot"]
    policy = json.loads(result.one("aws:iam/rolePolicy:RolePolicy", "costguard-policy").inputs["policy"])
    (scale,) = [s for s in policy["Statement"] if "eks:UpdateNodegroupConfig" in s["Action"]]
    assert not any("/h100-block/" in arn or "-h100-block/" in arn for arn in scale["Resource"])


def test_a_stack_of_capacity_blocks_only_has_no_idle_guard():
    cfg = prod_with_block()
    cfg["ringtrain:nodeGroups"] = [CB_GROUP]
    result = run_program("prod", config=cfg)
    assert result.of_type("aws:lambda/function:Function") == []
    assert result.of_type("aws:sns/topic:Topic")  # alerts (and the budget) stay


def test_down_says_a_block_cannot_be_cancelled_and_until_when_it_is_yours(tmp_path):
    from datetime import UTC, datetime

    from cluster.aws import stack as stack_mod

    now = datetime(2026, 12, 10, 11, 30, tzinfo=UTC)
    found = {BLOCK_ID: {"CapacityReservationId": BLOCK_ID, "InstanceType": "p5.48xlarge", "InstanceCount": 2,
                        "State": "active", "EndDate": datetime(2026, 12, 14, 11, 30, tzinfo=UTC)}}
    (note,) = stack_mod.capacity_block_notes([("h100-block", BLOCK_ID)], found, now)
    assert note.startswith(f"Capacity Block {BLOCK_ID} (node group h100-block, 2 x p5.48xlarge, active): "
                           "paid up front and cannot be cancelled; it stays yours until "
                           "2026-12-14T11:30:00+00:00 (96 h from now). `down` saves nothing on it and "
                           "refunds nothing")
    (missing,) = stack_mod.capacity_block_notes([("h100-block", BLOCK_ID)], {}, now)
    assert "not found in this account and region" in missing

    # stack_down reads the stack's block groups from its file and prints the notes after the update.
    import yaml
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump({"config": prod_with_block()}))
    assert stack_mod.capacity_block_groups("prod", tmp_path) == [("h100-block", BLOCK_ID)]
    assert stack_mod.capacity_block_groups("prod") == []  # the committed prod has none
