"""Node-hours by node group and their cost at the catalog's list prices (cluster/run_cost.py, pure)."""

from __future__ import annotations

import pytest

from cluster.flow import Attempt
from cluster.run_cost import format_costs, node_group_costs, node_hours, total_usd
from infra.catalog import load_catalog

CATALOG = load_catalog().instance_types


def attempt(group, types, capacity, hosts, hours, start=0.0):
    return Attempt(0, None, [f"w-{i}" for i in range(hosts)], started_at=start, ended_at=start + hours * 3600,
                   node_group=group, instance_types=tuple(types), capacity_type=capacity)


def test_node_hours_are_nodes_times_the_attempts_duration():
    assert node_hours(attempt("g", ["p5.48xlarge"], "ON_DEMAND", 2, 1.5)) == pytest.approx(3.0)
    assert node_hours(Attempt(0, None, ["a"])) == 0.0   # no times recorded: nothing counted


def test_costs_add_up_per_group_at_list_price():
    p5 = CATALOG["p5.48xlarge"].on_demand_usd_per_hour
    costs = node_group_costs([
        attempt("h100-spot", ["p5.48xlarge"], "SPOT", 2, 0.5),          # reclaimed half-way
        attempt("h100-spot", ["p5.48xlarge"], "SPOT", 2, 0.25, start=4000),  # the resume
    ], CATALOG)
    assert len(costs) == 1
    c = costs[0]
    assert c.node_group == "h100-spot" and c.node_hours == pytest.approx(1.5)
    assert c.usd == pytest.approx(1.5 * p5) and "upper bound" in c.note
    assert total_usd(costs) == (pytest.approx(1.5 * p5), True)
    text = format_costs(costs)
    assert "node group h100-spot (SPOT): 1.50 node-hours" in text
    assert f"run cost           ${1.5 * p5:.2f}" in text


def test_a_group_of_several_types_is_priced_at_its_most_expensive():
    types = ["p4d.24xlarge", "p5.48xlarge"]
    [c] = node_group_costs([attempt("mixed", types, "ON_DEMAND", 1, 1.0)], CATALOG)
    assert c.priced_type == "p5.48xlarge" and "most expensive" in c.note


def test_unpriced_groups_make_the_total_a_lower_bound():
    costs = node_group_costs([
        attempt("block", ["p5.48xlarge"], "CAPACITY_BLOCK", 2, 1.0),
        attempt("h200", ["p5e.48xlarge"], "ON_DEMAND", 1, 1.0),       # no public list price
        attempt("a100", ["p4d.24xlarge"], "ON_DEMAND", 1, 2.0),
    ], CATALOG)
    assert [c.node_group for c in costs] == ["block", "h200", "a100"]
    assert costs[0].usd is None and "paid up front" in costs[0].note
    assert costs[1].usd is None and "no list price" in costs[1].note
    usd, complete = total_usd(costs)
    assert usd == pytest.approx(2 * CATALOG["p4d.24xlarge"].on_demand_usd_per_hour) and not complete
    assert "lower bound" in format_costs(costs)


def test_local_attempts_have_no_node_group_and_cost_nothing():
    assert node_group_costs([Attempt(0, None, ["host-0"], started_at=0, ended_at=3600)], CATALOG) == []
    assert format_costs([]) == ""
