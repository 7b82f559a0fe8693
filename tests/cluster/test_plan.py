"""Offline plan: the committed stacks' resources, node groups and costs, checked against hand arithmetic.

The program runs under Pulumi mocks (no credentials, no CLI). Every expected figure below is written
out from infra/catalog.yaml's prices; the first test pins those prices so that a catalog change shows
up here as a deliberate update of the arithmetic, not as a silent drift.
"""

from __future__ import annotations

import json

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
from infra.catalog import load_catalog

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
    assert dev.resource_counts["aws:eks/nodeGroup:NodeGroup"] == 3
    assert dev.resource_counts["aws:ec2/natGateway:NatGateway"] == 1
    assert dev.resource_counts["aws:s3/bucket:Bucket"] == 2
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
    assert "aws:eks/cluster:Cluster" not in plan.resource_counts
    assert plan.resource_counts["aws:s3/bucket:Bucket"] == 2
    assert plan.cost.idle_usd_per_hour == 0 and plan.cost.full_scale_usd_per_hour == 0
    assert plan.notes[0].startswith("ringtrain:compute is false")


def _plan_with(**overrides):
    from infra.offline import stack_config

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
    assert doc["resourceTotal"] == sum(doc["resourceCounts"].values())


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
    with pytest.raises(PlanError, match=r"ringtrain:network.natGateways: \"many\" is invalid"):
        from infra.offline import stack_config

        cfg = stack_config("dev")
        cfg["ringtrain:network"] = {**cfg["ringtrain:network"], "natGateways": "many"}
        offline_plan("dev", HOURS, config=cfg)


def test_every_committed_stack_has_hand_checked_figures_here():
    """A new Pulumi.<stack>.yaml needs its own hand-computed test above; this fails until it has one."""
    from infra.offline import REPO_ROOT

    committed = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in REPO_ROOT.glob("Pulumi.*.yaml"))
    assert committed == ["dev", "prod"]
