"""Capacity fallback: a job's node groups in order of preference, each tried until one has the job's
nodes Ready (the pure part; cluster/aws/backend.py scales and waits).

    ringtrain submit --stack dev --node-group a10g-spot,l4-spot,a10g-ondemand --capacity-timeout 600 ...

Why a timeout: when EC2 has no capacity for a group, nothing fails. Its Auto Scaling group retries the
launch until an instance becomes available, and the scheduler keeps the pods Pending meanwhile (AWS
re:Post, "EKS Insufficient capacity errors"; the node group only reports the health issue
AsgInstanceLaunchFailures, EKS API reference "Issue"). So the backend scales a group to the job's
hosts and waits up to the capacity timeout for the nodes the job needs (all its hosts; an elastic
job's minimum). If they do not come, it scales the group back to its size before, so a node that
arrives late is not billed idle, and tries the next group. Users of aws-parallelcluster (issues 3785,
2716) and SkyPilot (issue 1361) ask for this fallback.

What a fallback costs: the time waited on each group without capacity (up to its timeout), and the
nodes of such a group that did come up, billed until it is scaled back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cluster.run_cost import list_price
from cluster.usage import UsageError
from infra.catalog import InstanceType

from .outputs import NodeGroupOutput, OutputsError


class NodeGroupsError(OutputsError, UsageError):
    """--node-group names something the stack does not have, or is not a list of names: bad input
    (exit 2), and a backend error wherever the backend raises it."""


def parse_node_groups(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """`a,b,c` (or a sequence of names) -> ('a', 'b', 'c'); None or '' -> () (the stack's only group)."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(str(n).strip() for n in items)
    if value and any(not n for n in names):
        raise NodeGroupsError(f"--node-group {value!r}: an empty name; allowed is a comma-separated list "
                              "of node group names, e.g. a10g-spot,l4-spot")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise NodeGroupsError(f"--node-group {value!r}: {', '.join(repeated)} named twice; "
                              "name each group once, in the order to try them")
    return tuple(n for n in names if n)


def check_node_groups(names: Sequence[str], available: Sequence[str], where: str) -> None:
    """One message for every name not in `available` (the stack's GPU node groups)."""
    unknown = [n for n in names if n not in available]
    if unknown:
        noun = "node group" if len(unknown) == 1 else "node groups"
        verb = "is" if len(unknown) == 1 else "are"
        raise NodeGroupsError(f"{noun} {', '.join(unknown)} {verb} not in {where}: allowed are "
                              f"{', '.join(available) or '(none)'}")


def choose_groups(names: Sequence[str], groups: Sequence[NodeGroupOutput],
                  stack: str) -> tuple[NodeGroupOutput, ...]:
    """The groups to try, in the order named (pure); `names` empty: the stack's only GPU group."""
    if not names:
        if not groups:
            raise NodeGroupsError(f"stack {stack!r} exports no GPU node groups "
                                  "(ringtrain:nodeGroups is empty)")
        if len(groups) > 1:
            listed = ", ".join(g.name for g in groups)
            raise NodeGroupsError(f"stack {stack!r} has several GPU node groups ({listed}): name one with "
                                  "--node-group, or several in the order to try them (a,b,c)")
        return (groups[0],)
    check_node_groups(names, [g.name for g in groups], f"stack {stack!r}")
    by_name = {g.name: g for g in groups}
    return tuple(by_name[n] for n in names)


def node_wait_s(capacity_timeout_s: float | None, startup_timeout_s: float) -> float:
    """How long one group gets to have the job's nodes Ready: --capacity-timeout, else the startup
    timeout (which then also bounds the whole start on the group that has them)."""
    return startup_timeout_s if capacity_timeout_s is None else min(capacity_timeout_s, startup_timeout_s)


@dataclass(frozen=True)
class CapacityWait:
    """One group that did not have the job's nodes Ready in time."""

    node_group: str
    ready: int
    needed: int
    waited_s: float
    scaled_back_to: int | None   # the desired size restored; None: the backend had not changed it

    def describe(self) -> str:
        back = "" if self.scaled_back_to is None else f", scaled back to {self.scaled_back_to}"
        return f"{self.node_group} {self.ready}/{self.needed} nodes Ready after {self.waited_s:.0f} s{back}"


def price_text(group: NodeGroupOutput, nodes: int, catalog: Mapping[str, InstanceType]) -> str:
    """The group's price at the catalog's list prices, as the run's cost lines price it."""
    priced, each, note = list_price(group.instance_types, group.capacity_type, catalog)
    if each is None:
        return f"not priced ({note})"
    text = f"{priced} at ${each:.2f}/h per node, ${each * nodes:.2f}/h for {nodes}"
    return text + (f" ({note})" if note else "")


def running_message(group: NodeGroupOutput, nodes: int, waits: Sequence[CapacityWait],
                    catalog: Mapping[str, InstanceType]) -> str:
    """Where the job runs and at what price; which groups it passed over first."""
    text = (f"node group {group.name} ({', '.join(group.instance_types)}, {group.capacity_type}) has "
            f"the job's nodes: {price_text(group, nodes, catalog)}")
    if waits:
        text += "; passed over for want of capacity: " + "; ".join(w.describe() for w in waits)
    return text


def fallback_message(wait: CapacityWait, next_group: NodeGroupOutput,
                     catalog: Mapping[str, InstanceType], nodes: int) -> str:
    return (f"node group {wait.describe()} (no capacity?): trying node group {next_group.name} "
            f"({', '.join(next_group.instance_types)}, {next_group.capacity_type}; "
            f"{price_text(next_group, nodes, catalog)})")


def exhausted_message(waits: Sequence[CapacityWait]) -> str:
    tried = "; ".join(w.describe() for w in waits)
    return (f"no node group had the job's nodes Ready in time (spot capacity or quota?): {tried}; "
            "nothing was submitted")


def check_against_stack_config(names: Sequence[str], stack: str) -> None:
    """Before `run` stands anything up: the names against the GPU node groups of the stack's committed
    config (Pulumi.<stack>.yaml), where there is one; the backend checks them against the stack's
    outputs again once it is up."""
    from infra.config import ConfigError, settings_from_engine_config
    from infra.stacks import engine_config, stack_config, stack_file

    if not names or not stack_file(stack).exists():
        return
    try:
        settings = settings_from_engine_config(engine_config(stack_config(stack)))
    except ConfigError:
        return   # `up` stops with the config's own message
    check_node_groups(names, [g.name for g in settings.stack.node_groups],
                      f"stack {stack!r} (Pulumi.{stack}.yaml)")
