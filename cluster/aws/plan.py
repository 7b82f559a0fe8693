"""Offline plan: what a stack's billed-by-the-hour resources are and what they cost, with no AWS
credentials, no Pulumi CLI and no Pulumi runtime.

A pure function of the stack's validated config (infra/config.py, the same validation the program runs
first) and the catalog (infra/catalog.yaml): the EKS managed node groups (instance types, GPUs, EFA
interfaces per node, capacity type, sizes), the NAT gateways and the control plane, by the rules the
program declares them with (infra/network.py, infra/nodegroups.py; tests/cluster/test_plan.py checks
the plan against what the program declares under mocks, for every committed stack and variants).
Everything else the program declares (network, data layer, IAM, add-ons) is not billed by the hour;
`pulumi preview` lists it. Costs come from the catalog's list prices:

- idle $/h:       EKS control plane + NAT gateways + system nodes at desiredSize + GPU groups at minSize
                  (what runs when no job does; the cost guard scales GPU groups down to minSize);
- full scale $/h: the same with every GPU group at maxSize;
- a run:          full scale $/h x hours.

A group with several instance types is priced at its most expensive type (the bill cannot exceed it).
Spot groups are priced at the on-demand list price, an upper bound: spot prices float below it.
Capacity Block groups are shown but not priced by the hour: a block is paid up front, when bought, for
its whole duration (its price comes with the offering, EC2 DescribeCapacityBlockOfferings), whether its
nodes run or not; the totals leave it out. The data layer (S3, KMS, ECR) and traffic (NAT data
processing, S3 requests) are not included.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import date
from typing import Any

from cluster.mpijob import SYSTEM_POOL
from infra.catalog import Catalog, load_catalog
from infra.config import ConfigError, Settings, settings_from_engine_config
from infra.efa import efa_interface_count
from infra.stacks import REPO_ROOT, StackFileError, engine_config, stack_config, stack_file, stack_names
from infra.versions import support_notice

PRICE_REGION = "us-east-1"  # the region of the catalog's list prices
CAPACITY_BLOCK = "CAPACITY_BLOCK"
CAPACITY_BLOCK_NOTE = "Capacity Block: paid up front for the whole block; not in the totals"


class PlanError(Exception):
    """The plan cannot be made (unknown stack, bad config, a type missing from the catalog)."""


@dataclass(frozen=True)
class NodeGroupPlan:
    name: str
    role: str                         # "system" (CPU) or "gpu"
    instance_types: tuple[str, ...]
    capacity_type: str                # ON_DEMAND | SPOT | CAPACITY_BLOCK
    min_size: int
    desired_size: int
    max_size: int
    gpus_per_node: int
    gpu_model: str | None
    efa_interfaces: int               # per node, from the launch template's network interfaces


@dataclass(frozen=True)
class CostLine:
    item: str
    quantity: int
    usd_per_hour_each: float | None   # None: the catalog has no list price for this type
    note: str = ""

    @property
    def usd_per_hour(self) -> float | None:
        if self.quantity == 0:
            return 0.0
        return None if self.usd_per_hour_each is None else self.quantity * self.usd_per_hour_each


@dataclass(frozen=True)
class CostEstimate:
    idle: tuple[CostLine, ...]
    full_scale: tuple[CostLine, ...]
    run_hours: float
    price_sources: tuple[str, ...]      # "<source> (<date>)" for every price used
    unpriced_types: tuple[str, ...]     # types without a list price: totals are then lower bounds

    @staticmethod
    def _total(lines: tuple[CostLine, ...]) -> float:
        return round(sum(line.usd_per_hour or 0.0 for line in lines), 4)

    @property
    def idle_usd_per_hour(self) -> float:
        return self._total(self.idle)

    @property
    def full_scale_usd_per_hour(self) -> float:
        return self._total(self.full_scale)

    @property
    def run_usd(self) -> float:
        return round(self.full_scale_usd_per_hour * self.run_hours, 2)


@dataclass(frozen=True)
class Plan:
    stack: str
    region: str
    compute: bool
    node_groups: tuple[NodeGroupPlan, ...]
    nat_gateways: int
    eks_clusters: int
    cost: CostEstimate
    notes: tuple[str, ...] = field(default_factory=tuple)


def node_groups_from_settings(settings: Settings, catalog: Catalog) -> tuple[NodeGroupPlan, ...]:
    """The managed node groups the program declares for this config (none while compute is off): the
    on-demand system group, then the GPU groups, each named by its config name."""
    cfg = settings.stack
    if not cfg.compute:
        return ()
    system = cfg.cluster.system_nodes
    declared = [(SYSTEM_POOL, "system", (system.instance_type,), "ON_DEMAND", system, 0)]
    declared += [(g.name, "gpu", tuple(g.instance_types), g.capacity_type, g, efa_interface_count(g, catalog))
                 for g in cfg.node_groups]
    groups = []
    for name, role, types, capacity_type, sizes, efa in declared:
        records = [catalog[t] for t in types]  # config validation checked every type is in the catalog
        groups.append(NodeGroupPlan(
            name=name, role=role, instance_types=types, capacity_type=capacity_type,
            min_size=sizes.min_size, desired_size=sizes.desired_size, max_size=sizes.max_size,
            gpus_per_node=max(r.gpus for r in records), gpu_model=records[0].gpu_model, efa_interfaces=efa))
    return tuple(sorted(groups, key=lambda g: (g.role != "system", g.name)))


def nat_gateway_count(settings: Settings) -> int:
    """NAT gateways exist only while compute is up (infra/network.py)."""
    return len(settings.stack.network.nat_gateway_azs) if settings.stack.compute else 0


def _group_price(group: NodeGroupPlan, catalog: Catalog) -> tuple[float | None, str]:
    """Per-node $/h for a group: its most expensive type; None when a type has no list price or the
    group runs on a Capacity Block (paid up front, not by the hour)."""
    if group.capacity_type == CAPACITY_BLOCK:
        return None, CAPACITY_BLOCK_NOTE
    prices = {t: catalog[t].on_demand_usd_per_hour for t in group.instance_types}
    notes = []
    if len(prices) > 1:
        notes.append("priced at its most expensive type")
    if group.capacity_type == "SPOT":
        notes.append("spot at on-demand list price (upper bound)")
    missing = [t for t, p in prices.items() if p is None]
    if missing:
        notes.append(f"no list price for {', '.join(missing)}")
        return None, "; ".join(notes)
    return max(p for p in prices.values() if p is not None), "; ".join(notes)


def estimate_cost(node_groups: tuple[NodeGroupPlan, ...], nat_gateways: int, eks_clusters: int,
                  catalog: Catalog, run_hours: float) -> CostEstimate:
    """The cost arithmetic (see the module docstring for what each figure includes)."""
    if not run_hours >= 0:
        raise PlanError(f"run hours {run_hours!r}: expected a number >= 0")
    fixed = catalog.fixed_costs
    base = [
        CostLine("EKS control plane", eks_clusters, fixed.eks_control_plane_usd_per_hour),
        CostLine("NAT gateway", nat_gateways, fixed.nat_gateway_usd_per_hour,
                 "plus data processing, not included"),
    ]
    idle, full = list(base), list(base)
    sources = {f"{fixed.price_source} ({fixed.price_date})"} if (eks_clusters or nat_gateways) else set()
    unpriced: set[str] = set()
    for group in node_groups:
        each, note = _group_price(group, catalog)
        label = f"{group.name} ({', '.join(group.instance_types)}, {group.capacity_type})"
        if group.role == "system":
            idle.append(CostLine(label, group.desired_size, each, note))
            full.append(CostLine(label, group.desired_size, each, note))
        else:
            idle.append(CostLine(label, group.min_size, each, note))
            full.append(CostLine(label, group.max_size, each, note))
        if group.capacity_type == CAPACITY_BLOCK:
            continue  # no list price used
        for t in group.instance_types:
            rec = catalog[t]
            if rec.on_demand_usd_per_hour is None:
                unpriced.add(t)
            else:
                sources.add(f"{rec.price_source} ({rec.price_date})")
    return CostEstimate(idle=tuple(idle), full_scale=tuple(full), run_hours=float(run_hours),
                        price_sources=tuple(sorted(sources)), unpriced_types=tuple(sorted(unpriced)))


def plan_from_settings(stack: str, settings: Settings, catalog: Catalog, run_hours: float,
                       today: date | None = None) -> Plan:
    """The plan of a validated stack config (pure but for `today`, the date support notices are for)."""
    cfg = settings.stack
    groups = node_groups_from_settings(settings, catalog)
    nats = nat_gateway_count(settings)
    clusters = 1 if cfg.compute else 0
    notes = [
        "List prices (on-demand, Linux, us-east-1 unless stated) from infra/catalog.yaml; they drift: "
        "check them before quoting.",
        "Spot groups are shown at the on-demand list price: an upper bound, spot prices float below it.",
        "Not included: data layer (S3 storage and requests, KMS, ECR), NAT data processing, EBS volumes.",
        f"Priced from Pulumi.{stack}.yaml and the catalog; `pulumi preview --stack {stack}` lists every "
        "resource the stack declares.",
        f"The budget counts only spend tagged project=ringtrain AND stack={stack}, and only once both are "
        "active cost-allocation tags, from activation on: `up` activates them where the account may (a "
        "standalone or management account; billing sees a new tag key up to 24 h after first use).",
    ]
    blocks = [g.name for g in groups if g.capacity_type == CAPACITY_BLOCK]
    if blocks:
        notes.append(f"Capacity Block groups ({', '.join(blocks)}) are paid up front, when the block is "
                     "bought, for its whole duration (price: EC2 DescribeCapacityBlockOfferings); the "
                     "$/h totals leave them out. Offline the block is assumed to match the config; "
                     "`pulumi preview`/`up` check it against AWS.")
    support = support_notice(cfg.cluster.kubernetes_version, cfg.cluster.support_type, today or date.today())
    if support:
        notes.insert(0, support)
    if not cfg.compute:
        notes.insert(0, "ringtrain:compute is false: compute is down, only the data layer exists.")
    if settings.region != PRICE_REGION:
        notes.insert(0, f"The catalog's prices are {PRICE_REGION} list prices; {settings.region} prices "
                        "may differ.")
    cost = estimate_cost(groups, nats, clusters, catalog, run_hours)
    if cost.unpriced_types:
        notes.append(f"No list price for {', '.join(cost.unpriced_types)}: totals leave them out and are "
                     "lower bounds.")
    return Plan(stack=stack, region=settings.region, compute=cfg.compute, node_groups=groups,
                nat_gateways=nats, eks_clusters=clusters, cost=cost, notes=tuple(notes))


def offline_plan(stack: str, run_hours: float, *, config: Mapping[str, Any] | None = None) -> Plan:
    """Plan `stack` from its Pulumi.<stack>.yaml (or `config`, a whole config mapping of Python values)."""
    if config is None:
        if not stack_file(stack).exists():
            raise PlanError(f"stack {stack!r} has no Pulumi.{stack}.yaml in {REPO_ROOT}: "
                            f"committed stacks are {', '.join(stack_names()) or '(none)'}")
        try:
            config = stack_config(stack)
        except StackFileError as exc:
            raise PlanError(f"stack {stack!r}: {exc}") from None
    catalog = load_catalog()
    try:
        settings = settings_from_engine_config(engine_config(config))
    except ConfigError as exc:  # the message the program itself would stop with
        raise PlanError(f"stack {stack!r}: {exc}") from None
    return plan_from_settings(stack, settings, catalog, run_hours)


# ---------------------------------------------------------------------------------------------
# Presentation
# ---------------------------------------------------------------------------------------------


def _money(value: float | None) -> str:
    return "n/a" if value is None else f"${value:,.2f}"


def _rate(value: float | None) -> str:
    """A unit price with the catalog's precision ($0.045, $0.1008, $55.04)."""
    if value is None:
        return "n/a"
    text = f"{value:,.4f}".rstrip("0")
    return "$" + (text + "0" if len(text.split(".")[1]) < 2 else text)


def gpus_at_full_scale(plan: Plan) -> dict[str, int]:
    """GPU model -> GPUs with every GPU group at maxSize."""
    out: dict[str, int] = {}
    for g in plan.node_groups:
        if g.role == "gpu" and g.gpu_model:
            out[g.gpu_model] = out.get(g.gpu_model, 0) + g.max_size * g.gpus_per_node
    return out


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    cost = plan.cost

    def lines(ls: tuple[CostLine, ...]) -> list[dict[str, Any]]:
        return [{**asdict(line), "usd_per_hour": line.usd_per_hour} for line in ls]

    return {
        "stack": plan.stack,
        "region": plan.region,
        "compute": plan.compute,
        "nodeGroups": [asdict(g) | {"instance_types": list(g.instance_types)} for g in plan.node_groups],
        "gpusAtFullScale": gpus_at_full_scale(plan),
        "natGateways": plan.nat_gateways,
        "eksClusters": plan.eks_clusters,
        "cost": {
            "idleUsdPerHour": cost.idle_usd_per_hour,
            "fullScaleUsdPerHour": cost.full_scale_usd_per_hour,
            "runHours": cost.run_hours,
            "runUsd": cost.run_usd,
            "idle": lines(cost.idle),
            "fullScale": lines(cost.full_scale),
            "priceBasis": "on-demand list prices; spot at list price as an upper bound",
            "priceSources": list(cost.price_sources),
            "unpricedTypes": list(cost.unpriced_types),
        },
        "notes": list(plan.notes),
    }


def plan_to_json(plan: Plan) -> str:
    return json.dumps(plan_to_dict(plan), indent=2, sort_keys=False)


def plan_to_table(plan: Plan) -> str:
    from tabulate import tabulate

    cost = plan.cost
    out = [f"Stack {plan.stack} ({plan.region}); compute {'on' if plan.compute else 'OFF'}", ""]
    if plan.node_groups:
        rows = [[g.name, g.role, ", ".join(g.instance_types), g.gpus_per_node, g.gpu_model or "-",
                 g.efa_interfaces, g.capacity_type, g.min_size, g.desired_size, g.max_size]
                for g in plan.node_groups]
        out.append(tabulate(rows, headers=["node group", "role", "instance types", "GPUs/node", "GPU",
                                           "EFA/node", "capacity", "min", "desired", "max"]))
        gpus = gpus_at_full_scale(plan)
        if gpus:
            listed = ", ".join(f"{n} x {model}" for model, n in sorted(gpus.items()))
            out.append(f"GPUs at full scale: {listed}")
        out.append("")
    rows = [[line.item, line.quantity, _rate(line.usd_per_hour_each), _money(line.usd_per_hour), line.note]
            for line in cost.full_scale]
    out.append("Full scale (GPU groups at maxSize):")
    out.append(tabulate(rows, headers=["item", "count", "$/h each", "$/h", "note"]))
    out.append("")
    out.append(f"Idle       {_money(cost.idle_usd_per_hour)}/h   (control plane, NAT, system nodes, "
               "GPU groups at minSize)")
    out.append(f"Full scale {_money(cost.full_scale_usd_per_hour)}/h")
    out.append(f"Run of {cost.run_hours:g} h at full scale: {_money(cost.run_usd)}")
    out.append("")
    out.append("Prices: " + ("; ".join(cost.price_sources) or "none used"))
    out.extend(f"Note: {n}" for n in plan.notes)
    return "\n".join(out)
