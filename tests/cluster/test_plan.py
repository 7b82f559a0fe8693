"""Offline plan: the committed stacks' node groups and costs, checked against hand arithmetic, and the
plan (a pure function of the config and the catalog) checked against what the Pulumi program declares.

Every expected figure below is written out from infra/catalog.yaml's prices; the first test pins those
prices so that a catalog change shows up here as a deliberate update of the arithmetic, not as a silent
drift. The program runs under Pulumi mocks (tests/infra/harness.py) only in the tests that compare.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from cluster.aws.plan import (
    CostLine,
    NodeGroupPlan,
    PlanError,
    estimate_cost,
    gpus_at_full_scale,
    offline_plan,
    plan_to_dict,
    plan_to_json,
    plan_to_table,
)
from infra.catalog import Catalog, load_catalog
from infra.stacks import REPO_ROOT, stack_config, stack_names
from train.contract import NODE_POOL_LABEL

HOURS = 10


@pytest.fixture(scope="module")
def dev():
    return offline_plan("dev", HOURS)


@pytest.fixture(scope="module")
def prod():
    return offline_plan("prod", HOURS)


def test_catalog_prices_used_by_the_arithmetic():
    c = load_catalog()
    assert c.fixed_costs.eks_control_plane_usd_per_hour == 0.10
    assert c.fixed_costs.nat_gateway_usd_per_hour == 0.045
    assert c["m7i.large"].on_demand_usd_per_hour == 0.1008
    assert c["m7i.xlarge"].on_demand_usd_per_hour == 0.2016
    assert c["g5.12xlarge"].on_demand_usd_per_hour == 5.672
    assert c["g5.24xlarge"].on_demand_usd_per_hour == 8.144
    assert c["g6.12xlarge"].on_demand_usd_per_hour == 4.6016
    assert c["g6.24xlarge"].on_demand_usd_per_hour == 6.6752
    assert c["p5.48xlarge"].on_demand_usd_per_hour == 55.04


def test_dev_plan_and_cost(dev):
    # Pulumi.dev.yaml: one NAT (natGateways: single), 2 x m7i.large system nodes (desiredSize 2),
    # spot groups a10g-spot [g5.12xlarge, g5.24xlarge] and l4-spot [g6.12xlarge, g6.24xlarge], 0..4 each.
    assert dev.nat_gateways == 1 and dev.eks_clusters == 1
    assert len(dev.node_groups) == 3
    groups = {g.name: g for g in dev.node_groups}
    assert groups["system"] == NodeGroupPlan("system", "system", ("m7i.large",), "ON_DEMAND",
                                             1, 2, 3, 0, None, 0)
    assert groups["a10g-spot"] == NodeGroupPlan("a10g-spot", "gpu", ("g5.12xlarge", "g5.24xlarge"), "SPOT",
                                                0, 0, 4, 4, "A10G", 0)
    assert groups["l4-spot"] == NodeGroupPlan("l4-spot", "gpu", ("g6.12xlarge", "g6.24xlarge"), "SPOT",
                                              0, 0, 4, 4, "L4", 0)
    # idle: control plane + 1 NAT + 2 system nodes; GPU groups at minSize 0
    idle = 0.10 + 1 * 0.045 + 2 * 0.1008                      # = 0.3466
    # full scale: + 4 nodes of each spot group at its most expensive type's on-demand list price
    full = idle + 4 * 8.144 + 4 * 6.6752                      # = 0.3466 + 32.576 + 26.7008 = 59.6234
    assert dev.cost.idle_usd_per_hour == pytest.approx(0.3466)
    assert dev.cost.full_scale_usd_per_hour == pytest.approx(full) == pytest.approx(59.6234)
    assert dev.cost.run_usd == pytest.approx(596.23)         # 59.6234 x 10 h, to the cent
    assert gpus_at_full_scale(dev) == {"A10G": 4 * 4, "L4": 4 * 4}
    assert idle == pytest.approx(0.3466)


def test_prod_plan_and_cost(prod):
    # Pulumi.prod.yaml: NAT per AZ over 3 AZs, 2 x m7i.xlarge system nodes, two p5.48xlarge EFA groups 0..4.
    assert prod.nat_gateways == 3 and prod.eks_clusters == 1
    groups = {g.name: g for g in prod.node_groups}
    assert set(groups) == {"system", "h100-ondemand", "h100-spot"}
    for name, capacity in (("h100-ondemand", "ON_DEMAND"), ("h100-spot", "SPOT")):
        g = groups[name]
        assert (g.instance_types, g.capacity_type, g.gpus_per_node, g.gpu_model) == (
            ("p5.48xlarge",), capacity, 8, "H100")
        assert g.efa_interfaces == 32          # one per network card of p5.48xlarge
        assert (g.min_size, g.desired_size, g.max_size) == (0, 0, 4)
    assert (groups["system"].instance_types, groups["system"].desired_size) == (("m7i.xlarge",), 2)
    idle = 0.10 + 3 * 0.045 + 2 * 0.2016                      # = 0.6382
    full = idle + 4 * 55.04 + 4 * 55.04                       # = 0.6382 + 440.32 = 440.9582
    assert prod.cost.idle_usd_per_hour == pytest.approx(0.6382)
    assert prod.cost.full_scale_usd_per_hour == pytest.approx(full) == pytest.approx(440.9582)
    assert prod.cost.run_usd == pytest.approx(4409.58)       # 440.9582 x 10 h
    assert any("us-west-2 prices may differ" in n for n in prod.notes)
    assert gpus_at_full_scale(prod) == {"H100": (4 + 4) * 8}


def test_compute_off_leaves_only_the_data_layer_and_network():
    plan = _plan_with(compute=False)
    assert plan.compute is False
    assert plan.node_groups == () and plan.nat_gateways == 0 and plan.eks_clusters == 0
    assert plan.cost.idle_usd_per_hour == 0 and plan.cost.full_scale_usd_per_hour == 0
    assert plan.notes[0].startswith("ringtrain:compute is false")


def _plan_with(**overrides):
    cfg = stack_config("dev")
    for key, value in overrides.items():
        cfg[f"ringtrain:{key}"] = value
    return offline_plan("dev", HOURS, config=cfg)


def test_table_and_json_state_list_prices_and_their_date(dev):
    table = plan_to_table(dev)
    assert "Idle       $0.35/h" in table and "Full scale $59.62/h" in table
    assert "Run of 10 h at full scale: $596.23" in table
    assert "(2025-11)" in table and "list price" in table.lower()
    assert "spot at on-demand list price (upper bound)" in table
    assert "$0.045" in table and "$8.144" in table
    assert "GPUs at full scale: 16 x A10G, 16 x L4" in table
    doc = json.loads(plan_to_json(dev))
    assert doc == plan_to_dict(dev)
    assert doc["cost"]["fullScaleUsdPerHour"] == pytest.approx(59.6234)
    assert doc["cost"]["runUsd"] == pytest.approx(596.23)
    assert any("2025-11" in s for s in doc["cost"]["priceSources"])


def test_unpriced_types_are_named_and_totals_are_lower_bounds():
    catalog = load_catalog()
    group = NodeGroupPlan("h200", "gpu", ("p5e.48xlarge",), "ON_DEMAND", 0, 0, 2, 8, "H200", 32)
    cost = estimate_cost((group,), nat_gateways=1, eks_clusters=1, catalog=catalog, run_hours=2)
    assert cost.unpriced_types == ("p5e.48xlarge",)
    (line,) = [x for x in cost.full_scale if x.item.startswith("h200")]
    assert line.usd_per_hour is None and "no list price for p5e.48xlarge" in line.note
    assert cost.full_scale_usd_per_hour == pytest.approx(0.10 + 0.045)
    assert CostLine("x", 0, None).usd_per_hour == 0.0
    with pytest.raises(PlanError, match="run hours -1: expected a number >= 0"):
        estimate_cost((), 0, 0, catalog, -1)


def test_bad_stack_and_bad_config_are_one_clear_error():
    with pytest.raises(PlanError, match=r"stack 'nope' has no Pulumi.nope.yaml .*stacks are dev, prod"):
        offline_plan("nope", HOURS)
    with pytest.raises(PlanError, match=r"stack 'dev': ringtrain:network.natGateways: \"many\" is invalid"):
        cfg = stack_config("dev")
        cfg["ringtrain:network"] = {**cfg["ringtrain:network"], "natGateways": "many"}
        offline_plan("dev", HOURS, config=cfg)


def test_every_committed_stack_has_hand_checked_figures_here():
    """A new Pulumi.<stack>.yaml needs its own hand-computed test above; this fails until it has one."""
    assert stack_names() == ["dev", "prod"]


# ---------------------------------------------------------------------------------------------------
# The plan against the program: what the Pulumi program declares under mocks, read back from the
# captured resources, is what the plan derives from the config alone.
# ---------------------------------------------------------------------------------------------------

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
EFA_INTERFACE_TYPES = ("efa", "efa-only")


def declared_node_groups(resources, catalog: Catalog) -> set[NodeGroupPlan]:
    """The EKS managed node groups a program run declared, as plan records: the name from the node-pool
    label, sizes from scalingConfig, EFA interfaces counted in the group's launch template."""
    efa_by_template = {}
    for res in resources:
        if res.type == LAUNCH_TEMPLATE:
            nics = res.inputs.get("networkInterfaces") or []
            efa_by_template[res.id] = sum(nic.get("interfaceType") in EFA_INTERFACE_TYPES for nic in nics)
    groups = set()
    for res in resources:
        if res.type != NODE_GROUP:
            continue
        inputs, types = res.inputs, tuple(res.inputs["instanceTypes"])
        scaling = inputs["scalingConfig"]
        gpus = max(catalog[t].gpus for t in types)
        groups.add(NodeGroupPlan(
            name=inputs["labels"][NODE_POOL_LABEL], role="gpu" if gpus else "system", instance_types=types,
            capacity_type=inputs.get("capacityType") or "ON_DEMAND",
            min_size=int(scaling["minSize"]), desired_size=int(scaling["desiredSize"]),
            max_size=int(scaling["maxSize"]), gpus_per_node=gpus, gpu_model=catalog[types[0]].gpu_model,
            efa_interfaces=efa_by_template[inputs["launchTemplate"]["id"]]))
    return groups


def _variant(stack: str, **changes) -> dict:
    cfg = copy.deepcopy(stack_config(stack))
    for key, value in changes.items():
        cfg[f"ringtrain:{key}"] = value
    return cfg


def _dev_per_az_nat() -> dict:
    cfg = _variant("dev")
    cfg["ringtrain:network"] = {**cfg["ringtrain:network"], "natGateways": "perAz"}
    return cfg


def _prod_with_block_and_single_nat() -> dict:
    cfg = _variant("prod")
    cfg["ringtrain:network"] = {**cfg["ringtrain:network"], "natGateways": "single"}
    cfg["ringtrain:nodeGroups"] = [*cfg["ringtrain:nodeGroups"], {
        "name": "h100-block", "instanceTypes": ["p5.48xlarge"], "capacityType": "CAPACITY_BLOCK",
        "capacityReservationId": "cr-02168da1478b509e0", "minSize": 0, "maxSize": 2, "desiredSize": 0,
        "efa": True, "placementGroup": False}]
    return cfg


CONFIGS = {  # every committed stack, and variants that change what the plan reads
    **{stack: (lambda stack=stack: stack_config(stack)) for stack in stack_names()},
    "dev-compute-off": lambda: _variant("dev", compute=False),
    "dev-nat-per-az": _dev_per_az_nat,
    "prod-block-single-nat": _prod_with_block_and_single_nat,
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_plan_is_what_the_program_declares(name):
    from tests.infra.harness import run_program

    config = CONFIGS[name]()
    stack = name.split("-")[0]
    plan = offline_plan(stack, HOURS, config=config)
    result = run_program(stack, config)
    counts = Counter(r.type for r in result.resources)
    assert set(plan.node_groups) == declared_node_groups(result.resources, load_catalog())
    assert len(plan.node_groups) == counts[NODE_GROUP]
    assert plan.nat_gateways == counts["aws:ec2/natGateway:NatGateway"]
    assert plan.eks_clusters == counts["aws:eks/cluster:Cluster"]
    assert plan.compute == (counts["aws:eks/cluster:Cluster"] == 1)
    assert plan.region == config["aws:region"]


def test_the_variants_differ_where_the_plan_must_follow():
    """Test premise: the variants above change what the plan reads (NAT count, a Capacity Block group)."""
    per_az = offline_plan("dev", HOURS, config=_dev_per_az_nat())
    assert per_az.nat_gateways == 2 > offline_plan("dev", HOURS).nat_gateways
    block = offline_plan("prod", HOURS, config=_prod_with_block_and_single_nat())
    assert block.nat_gateways == 1 and "CAPACITY_BLOCK" in {g.capacity_type for g in block.node_groups}


def test_the_plan_runs_without_the_pulumi_runtime():
    """scripts/plan needs no Pulumi: the plan imports neither pulumi nor the program."""
    code = ("import sys\nfrom cluster.aws.plan import offline_plan, plan_to_table\n"
            "plan_to_table(offline_plan('prod', 1))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pulumi', 'pulumi_aws', 'tests')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_plan_says_when_the_budget_starts_seeing_spend():
    """AWS Budgets filters on cost-allocation tags, which count only once active, from then on."""
    notes = offline_plan("dev", 1.0).notes
    (note,) = [n for n in notes if "cost-allocation tags" in n]
    assert "project=ringtrain AND stack=dev" in note and "from activation on" in note
