"""EC2 vCPU quotas a stack needs at full scale (pure; the Service Quotas call is cluster/aws/stack.py's).

EC2 limits running On-Demand instances and Spot requests per region in vCPUs, one quota per instance
family group (EC2 user guide "Spot Instance limits" and "On-Demand Instance quotas"; awsdocs/
amazon-ec2-user-guide using-spot-limits.md): a node group whose maxSize x vCPUs exceeds its quota
never gets the nodes, and EKS reports it only as a failed scale-up minutes later. Quota codes (Service
Quotas, service code ec2; read 2026-12-06 from scripts and docs that call the API with them):

    Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances  L-1216C47A
    Running On-Demand G and VT instances                              L-DB2E81BA
    Running On-Demand P instances                                     L-417A185B
    All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests   L-34B43A08
    All G and VT Spot Instance Requests                               L-3819A6DF
    All P Spot Instance Requests                                      L-7212CCBC

Capacity Block groups are left out: their instances run in capacity bought with the block. Other
families (Inf, Trn, DL, F, X) are reported as not checked; the catalog holds none today.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

from infra.catalog import Catalog
from infra.config import Settings

QUOTAS = {
    ("ON_DEMAND", "standard"): ("L-1216C47A",
                                "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
    ("ON_DEMAND", "g"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("ON_DEMAND", "p"): ("L-417A185B", "Running On-Demand P instances"),
    ("SPOT", "standard"): ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
    ("SPOT", "g"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("SPOT", "p"): ("L-7212CCBC", "All P Spot Instance Requests"),
}


class QuotaError(Exception):
    """The account's quota is below what the stack needs; the message names the quota."""


class QuotaNeed(NamedTuple):
    code: str
    name: str
    vcpus: int
    groups: tuple[str, ...]


def quota_family(instance_type: str) -> str | None:
    """'standard', 'g' (G and VT) or 'p' for an instance type; None for families not checked here."""
    prefix = re.match(r"[a-z]+", instance_type.split(".")[0])
    letters = prefix.group(0) if prefix else ""
    if letters in ("vt",) or (letters[:1] == "g" and len(letters) <= 2 and letters != "gr"):
        return "g"
    if letters[:1] == "p" and len(letters) <= 2:
        return "p"
    if letters[:1] in tuple("acdhimrtz") and letters not in ("inf", "dl", "trn", "hpc"):
        return "standard"
    return None


def quota_needs(settings: Settings, catalog: Catalog) -> tuple[list[QuotaNeed], list[str]]:
    """vCPUs each quota must allow with every group at maxSize, and the groups not checked."""
    cfg = settings.stack
    system = cfg.cluster.system_nodes
    sized = [("system", [system.instance_type], "ON_DEMAND", system.max_size)]
    sized += [(g.name, list(g.instance_types), g.capacity_type, g.max_size) for g in cfg.node_groups
              if g.capacity_type != "CAPACITY_BLOCK"]
    totals: dict[tuple[str, str], tuple[int, list[str]]] = {}
    unchecked = []
    for group, types, capacity, max_size in sized:
        widest = max(types, key=lambda t: catalog[t].vcpus)
        family = quota_family(widest)
        if family is None:
            unchecked.append(f"{group} ({widest}: no quota mapping for its family)")
            continue
        vcpus, groups = totals.get((capacity, family), (0, []))
        totals[(capacity, family)] = (vcpus + max_size * catalog[widest].vcpus, [*groups, group])
    needs = [QuotaNeed(*QUOTAS[key], vcpus, tuple(groups)) for key, (vcpus, groups) in totals.items()]
    return needs, unchecked


def check_quota_values(needs: list[QuotaNeed], values: Mapping[str, float], region: str) -> None:
    """Raise one QuotaError naming every quota below what the stack needs (`values`: code -> vCPUs)."""
    short = [n for n in needs if n.code in values and values[n.code] < n.vcpus]
    if not short:
        return
    listed = "; ".join(f"{n.name} ({n.code}) is {values[n.code]:g} vCPUs in {region}, and node group(s) "
                       f"{', '.join(n.groups)} need {n.vcpus} at maxSize" for n in short)
    raise QuotaError(f"EC2 vCPU quota too low: {listed}. Request an increase (Service Quotas console, or "
                     f"`aws service-quotas request-service-quota-increase --service-code ec2 --quota-code "
                     f"{short[0].code} --desired-value {short[0].vcpus} --region {region}`) or lower maxSize")
