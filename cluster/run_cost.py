"""What a run cost on AWS: node-hours by node group and their price at the catalog's list prices (pure).

    costs = node_group_costs(result.attempts, load_catalog().instance_types)
    print(format_costs(costs))

Node-hours of an attempt are its nodes (one worker pod per node: the AWS backend scales the group to
the job's hosts) times its time from before submission (scaling up and waiting for Ready nodes
included) to the job's end. Node time outside the attempts (nodes still draining after the run, a
group scaled up by hand) is not seen here, so the figures are what the job itself held.

Pricing follows the offline plan's rules (cluster/aws/plan.py): a group with several instance types
at its most expensive type (the bill cannot exceed it), spot at the on-demand list price (an upper
bound: spot prices float below it), Capacity Block groups not priced by the hour (a block is paid up
front, when bought, for its whole duration). The EKS control plane and NAT gateways are priced by
`scripts/plan`, not here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cluster.flow import Attempt
from infra.catalog import InstanceType


@dataclass(frozen=True)
class NodeGroupCost:
    node_group: str
    capacity_type: str                 # ON_DEMAND | SPOT | CAPACITY_BLOCK
    priced_type: str | None            # the instance type whose list price is used
    node_hours: float
    usd_per_node_hour: float | None    # None: not priced by the hour (see note)
    note: str = ""

    @property
    def usd(self) -> float | None:
        return None if self.usd_per_node_hour is None else self.node_hours * self.usd_per_node_hour


def node_hours(attempt: Attempt) -> float:
    """Nodes times the attempt's duration in hours (0 for an attempt that has no times)."""
    return len(attempt.hosts) * max(0.0, attempt.ended_at - attempt.started_at) / 3600.0


def list_price(types: tuple[str, ...], capacity_type: str,
               catalog: Mapping[str, InstanceType]) -> tuple[str | None, float | None, str]:
    """(the type priced, its $/h per node, a note) for a node group; None where it is not priced."""
    if capacity_type == "CAPACITY_BLOCK":
        return None, None, "Capacity Block: paid up front for the block, not by the hour"
    unknown = [t for t in types if t not in catalog]
    if unknown or not types:
        return None, None, f"not in the catalog: {', '.join(unknown) or 'no instance type recorded'}"
    unpriced = [t for t in types if catalog[t].on_demand_usd_per_hour is None]
    if unpriced:
        return None, None, f"no list price for {', '.join(unpriced)}"
    priced = max(types, key=lambda t: catalog[t].on_demand_usd_per_hour or 0.0)
    notes = []
    if len(types) > 1:
        notes.append("priced at its most expensive type")
    if capacity_type == "SPOT":
        notes.append("spot at on-demand list price (upper bound)")
    return priced, catalog[priced].on_demand_usd_per_hour, "; ".join(notes)


def node_group_costs(attempts: Iterable[Attempt], catalog: Mapping[str, InstanceType]) -> list[NodeGroupCost]:
    """Node-hours and list-price cost per node group, in the order the groups were first used.
    Attempts that ran on no node group (the local backend) are left out."""
    hours: dict[tuple[str, tuple[str, ...], str], float] = {}
    for attempt in attempts:
        if attempt.node_group is None:
            continue
        key = (attempt.node_group, tuple(attempt.instance_types), attempt.capacity_type or "ON_DEMAND")
        hours[key] = hours.get(key, 0.0) + node_hours(attempt)
    costs = []
    for (group, types, capacity), total in hours.items():
        priced, each, note = list_price(types, capacity, catalog)
        costs.append(NodeGroupCost(group, capacity, priced, total, each, note))
    return costs


def total_usd(costs: Iterable[NodeGroupCost]) -> tuple[float, bool]:
    """The priced total, and whether every group was priced (False: the total is a lower bound)."""
    costs = list(costs)
    return sum(c.usd or 0.0 for c in costs), all(c.usd is not None for c in costs)


def format_costs(costs: list[NodeGroupCost]) -> str:
    """Lines for the run's summary (empty when no node group was used)."""
    lines = []
    for c in costs:
        price = (f"${c.usd:.2f} ({c.priced_type} at ${c.usd_per_node_hour:.2f}/h)"
                 if c.usd is not None and c.usd_per_node_hour is not None else "not priced")
        lines.append(f"  node group {c.node_group} ({c.capacity_type}): "
                     f"{c.node_hours:.2f} node-hours, {price}" + (f"; {c.note}" if c.note else ""))
    if costs:
        usd, complete = total_usd(costs)
        bound = "" if complete else " (a lower bound: some groups are not priced)"
        lines.append(f"  run cost           ${usd:.2f} at catalog list prices (infra/catalog.yaml){bound}")
    return "\n".join(lines)
