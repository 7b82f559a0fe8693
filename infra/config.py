"""Typed stack configuration (namespace `ringtrain:` of Pulumi.<stack>.yaml), validated before any resource.

`load_stack_config()` reads the running program's config; `parse_stack_config(raw, region)` is the pure
part tests call directly. Every problem becomes ONE ConfigError whose message is
    ringtrain:<key path>: <value> is invalid: <what is allowed>
and the program turns it into a clean Pulumi error (no traceback).

GPU shape (see catalog.GpuShape): GPU count per instance + GPU model + memory per GPU. Every node group
needs one GPU count (a pod's `nvidia.com/gpu` request must fit every node of the group); a SPOT group
must also keep one GPU shape so that a job landing on any mix of its types runs at one speed. Hence
g5 (A10G) and g6 (L4) go into separate spot groups even though both are 4 x 24 GiB.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from infra.catalog import Catalog, load_catalog

NAMESPACE = "ringtrain"
REGION_KEY = "aws:region"
REGION_RE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
# Upper bound of an EKS managed node group (service quota "nodes per managed node group": 450).
MAX_GROUP_NODES = 450
# Kubernetes versions in EKS standard support (14 months from release) on 2026-12-06 with add-on
# versions pinned in infra/cluster.py ADDON_VERSIONS. 1.31-1.34 left standard support (1.34 on
# 2026-12-02; EKS user guide kubernetes-versions, release calendar) and would bill extended support.
SUPPORTED_KUBERNETES = ("1.35", "1.36")
# CloudWatch Logs PutRetentionPolicy retentionInDays: "Valid values are: 1, 3, 5, 7, 14, 30, 60, 90,
# 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, and 3653" (CloudWatch Logs
# API reference); any other number fails at `pulumi up` with InvalidParameterException.
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192,
                      2557, 2922, 3288, 3653)
_RETENTION_HELP = "one of " + ", ".join(map(str, LOG_RETENTION_DAYS)) + " (days CloudWatch Logs accepts)"


def _retention(value: int) -> int:
    if value not in LOG_RETENTION_DAYS:
        raise ValueError(_RETENTION_HELP)
    return value


class ConfigError(Exception):
    """A stack config value is wrong; the message names the key, the value and what is allowed."""


def _problem(path: str, value: Any, allowed: str) -> ConfigError:
    shown = "(missing)" if value is _MISSING else json.dumps(value, default=str)
    return ConfigError(f"{NAMESPACE}:{path}: {shown} is invalid: {allowed}")


_MISSING = object()


# --------------------------------------------------------------------------------------------
# Schema (shapes and single-field rules). Cross-field rules live in check_semantics().
# --------------------------------------------------------------------------------------------


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=False, frozen=True,
                              strict=True)


def _cidr(value: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"an IPv4 CIDR with no host bits set, like 10.0.0.0/16 ({exc})") from None


class NetworkConfig(_Section):
    cidr: str = Field(description="a private (RFC 1918) IPv4 CIDR from /16 to /20, like 10.0.0.0/16")
    availability_zones: list[str] = Field(
        min_length=2, max_length=4,
        description="2 to 4 distinct availability zones of aws:region, like [us-east-1a, us-east-1b]")
    gpu_availability_zone: str = Field(
        description="one of availabilityZones (EFA node groups live in one AZ)")
    nat_gateways: Literal["single", "perAz"] = Field(description="single (one shared NAT, cheap) or perAz")
    flow_logs: bool = Field(description="true or false (VPC flow logs)")
    flow_log_destination: Literal["cloudWatchLogs", "s3"] = Field(
        default="cloudWatchLogs",
        description="cloudWatchLogs (queryable at once) or s3 (cheaper per GB; an encrypted bucket of "
                    "the stack's own)")
    flow_log_retention_days: int = Field(default=30, description="days to keep flow logs: " + _RETENTION_HELP)
    kubernetes_service_cidr: str = Field(
        default="172.20.0.0/16",
        description="an IPv4 CIDR for Kubernetes services that does not overlap the VPC cidr")

    @property
    def nat_gateway_azs(self) -> list[str]:
        """Where the NAT gateways go (while compute is up): one per AZ, or a single one in the GPU AZ so
        that the heaviest egress does not cross AZs."""
        return list(self.availability_zones) if self.nat_gateways == "perAz" else [self.gpu_availability_zone]

    @field_validator("cidr")
    @classmethod
    def _vpc_cidr(cls, value: str) -> str:
        net = _cidr(value)
        if not net.is_private:
            raise ValueError("a private (RFC 1918) IPv4 CIDR, like 10.0.0.0/16")
        if not 16 <= net.prefixlen <= 20:
            raise ValueError("a prefix length from /16 to /20 (the subnet layout needs room)")
        return value

    @field_validator("flow_log_retention_days")
    @classmethod
    def _flow_retention(cls, value: int) -> int:
        return _retention(value)

    @field_validator("kubernetes_service_cidr")
    @classmethod
    def _service_cidr(cls, value: str) -> str:
        _cidr(value)
        return value

    @field_validator("availability_zones")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("2 to 4 DISTINCT availability zones (a zone is listed twice)")
        return value


class DataConfig(_Section):
    bucket_prefix: str = Field(
        pattern=r"^[a-z0-9][a-z0-9-]{1,48}[a-z0-9]$",
        description="3 to 50 characters of lowercase letters, digits and hyphens, starting and ending with "
                    "a letter or digit (buckets are <prefix>-datasets and <prefix>-checkpoints)")
    checkpoint_noncurrent_days: int = Field(
        ge=1, le=3650, description="days to keep overwritten checkpoint versions, 1..3650")
    # Versioned buckets keep every overwritten or deleted object as a noncurrent version, billed like
    # the current one, until a lifecycle rule expires it.
    dataset_noncurrent_days: int = Field(
        default=30, ge=1, le=3650, description="days to keep overwritten dataset versions, 1..3650")
    abort_incomplete_upload_days: int = Field(
        default=7, ge=1, le=365, description="days before incomplete multipart uploads are aborted, 1..365")
    image_keep_count: int = Field(
        default=30, ge=1, le=1000, description="tagged training images ECR keeps, 1..1000")


class NodeCounts(_Section):
    min_size: int = Field(ge=0, le=MAX_GROUP_NODES, description=f"an integer 0..{MAX_GROUP_NODES}")
    max_size: int = Field(ge=1, le=MAX_GROUP_NODES, description=f"an integer 1..{MAX_GROUP_NODES}")
    desired_size: int = Field(ge=0, le=MAX_GROUP_NODES, description=f"an integer 0..{MAX_GROUP_NODES}")


class SystemNodesConfig(NodeCounts):
    instance_type: str = Field(description="a CPU instance type from infra/catalog.yaml")


_VERSION_HELP = (f"one of {', '.join(SUPPORTED_KUBERNETES)} (a quoted string; older versions are past EKS "
                 "standard support; docs/ARCHITECTURE.md 'Upgrading Kubernetes' says how to move a stack)")


class ClusterConfig(_Section):
    kubernetes_version: str = Field(description=_VERSION_HELP)
    # EKS UpgradePolicyRequest.supportType: "The default value is EXTENDED"; a version past standard
    # support then bills $0.60/h per cluster instead of $0.10/h. STANDARD makes EKS upgrade the
    # control plane at the end of standard support instead.
    support_type: Literal["STANDARD", "EXTENDED"] = Field(
        default="STANDARD",
        description="STANDARD (EKS upgrades the cluster when standard support ends) or EXTENDED "
                    "(keeps the version, billed at the extended-support rate)")
    public_access_cidrs: list[str] = Field(
        default_factory=list,
        description="IPv4 CIDRs allowed to reach the public API endpoint; [] = private endpoint only; "
                    "never 0.0.0.0/0")
    system_nodes: SystemNodesConfig
    # Container Insights writes container, node and performance logs into
    # /aws/containerinsights/<cluster>/{application,dataplane,host,performance}; the stack creates
    # these groups with this retention so they expire and go with the cluster.
    container_log_retention_days: int = Field(
        default=30, description="days to keep container, node and performance logs: " + _RETENTION_HELP)
    # The cluster's administrators as EKS access entries: everyone who runs `up` or `submit`. Only these
    # get entries, so the state is the same whoever runs `up` (before, the caller got an entry of its
    # own, and the next operator's `up` deleted it).
    admin_principal_arns: list[str] = Field(
        default_factory=list, max_length=20,
        description="IAM role or user ARNs (arn:aws:iam::<account>:role/<name> or :user/<name>) of "
                    "ringtrain:accountId that get cluster-admin access entries: everyone who runs `up`")

    @field_validator("admin_principal_arns")
    @classmethod
    def _admins(cls, value: list[str]) -> list[str]:
        for arn in value:
            if not re.fullmatch(r"arn:aws(-[a-z]+)*:iam::\d{12}:(role|user)/[\w+=,.@/-]+", arn):
                raise ValueError(
                    f"{arn!r} is not an IAM role or user ARN like arn:aws:iam::123456789012:role/admin")
        if len(set(value)) != len(value):
            raise ValueError("distinct ARNs (one is listed twice)")
        return value

    @field_validator("container_log_retention_days")
    @classmethod
    def _container_retention(cls, value: int) -> int:
        return _retention(value)

    @field_validator("kubernetes_version")
    @classmethod
    def _version(cls, value: str) -> str:
        if value not in SUPPORTED_KUBERNETES:
            raise ValueError(_VERSION_HELP)
        return value


class NodeGroupConfig(NodeCounts):
    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,30}[a-z0-9]$",
                      description="2 to 32 lowercase letters, digits and hyphens, starting with a letter")
    instance_types: list[str] = Field(min_length=1, max_length=8,
                                      description="1 to 8 GPU instance types from infra/catalog.yaml")
    capacity_type: Literal["ON_DEMAND", "SPOT", "CAPACITY_BLOCK"] = Field(
        description="ON_DEMAND, SPOT or CAPACITY_BLOCK (an EC2 Capacity Block for ML, named by "
                    "capacityReservationId)")
    efa: bool = Field(description="true or false")
    placement_group: bool = Field(default=True, description="true or false")
    root_volume_gib: int = Field(default=200, alias="rootVolumeGiB", ge=50, le=16384,
                                 description="an integer 50..16384 (GiB)")
    capacity_reservation_id: str | None = Field(
        default=None, pattern=r"^cr-[0-9a-f]{8,17}$",
        description="null or a capacity reservation id cr-... (a Capacity Block's id with CAPACITY_BLOCK)")


class CostGuardConfig(_Section):
    idle_minutes: int = Field(ge=1, le=1440, description="an integer 1..1440")
    idle_gpu_utilization_percent: int = Field(ge=0, le=100, description="an integer 0..100")
    monthly_budget_usd: float = Field(gt=0, le=10_000_000, description="a positive amount of US dollars")
    notification_email: str = Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", description="an e-mail address")

    @field_validator("monthly_budget_usd", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        # JSON has one number type: accept 500 as well as 500.0 (strict mode would refuse the int).
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


# AWS account ids are 12 digits (IAM user guide, "Your AWS account ID and its alias").
ACCOUNT_ID_HELP = ("the 12-digit id of the AWS account the stack lives in, quoted (e.g. \"111122223333\"); "
                   "the AWS provider refuses credentials of any other account (allowedAccountIds)")


class StackConfig(_Section):
    owner: str = Field(pattern=r"^[A-Za-z0-9_.:/=+\-@ ]+$", min_length=1, max_length=256,
                       description="a tag value: 1 to 256 letters, digits, spaces and _.:/=+-@")
    cost_center: str = Field(pattern=r"^[A-Za-z0-9_.:/=+\-@ ]+$", min_length=1, max_length=256,
                             description="a tag value: 1 to 256 letters, digits, spaces and _.:/=+-@")
    # The AWS provider refuses to run with credentials of another account (pulumi-aws `allowedAccountIds`,
    # terraform-provider-aws: "AWS account ID not allowed: <id>"). Without it, `up --refresh` under a
    # wrong profile reads every resource as gone and empties the state.
    account_id: str = Field(pattern=r"^\d{12}$", description=ACCOUNT_ID_HELP)
    ttl_hours: int = Field(default=72, ge=1, le=8760, description="an integer 1..8760")
    compute: bool = Field(default=True, description="true (cluster up) or false (compute removed, data kept)")
    data_protection: bool = Field(
        default=True, description="true (data layer protected) or false (only to delete the data layer)")
    network: NetworkConfig
    data: DataConfig
    cluster: ClusterConfig
    node_groups: list[NodeGroupConfig] = Field(max_length=16, description="a list of up to 16 node groups")
    cost_guard: CostGuardConfig


class Settings(BaseModel):
    """The validated config plus the region it applies to."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    region: str
    stack: StackConfig


# --------------------------------------------------------------------------------------------
# Error translation
# --------------------------------------------------------------------------------------------


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _field_at(loc: tuple) -> tuple[type[BaseModel] | None, FieldInfo | None]:
    """The model class and field a pydantic error location points at (aliases, list indexes skipped)."""
    model: Any = StackConfig
    info: FieldInfo | None = None
    owner: type[BaseModel] | None = None
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return owner, info
        by_alias = {(f.alias or n): f for n, f in model.model_fields.items()}
        if part not in by_alias:
            return model, None
        owner, info = model, by_alias[part]
        ann = info.annotation
        args = getattr(ann, "__args__", ())
        model = args[0] if getattr(ann, "__origin__", None) is list and args else ann
    return owner, info


def _allowed_keys(model: type[BaseModel] | None) -> str:
    if model is None:
        return ""
    return ", ".join((f.alias or n) for n, f in model.model_fields.items())


def _translate(err: dict) -> ConfigError:
    loc = tuple(err.get("loc", ()))
    path = _path(loc)
    kind = err.get("type", "")
    value = err.get("input", _MISSING)
    if kind == "extra_forbidden":
        parent_model = _nested_model(loc[:-1])
        return _problem(path, value, f"unknown key; allowed keys here: {_allowed_keys(parent_model)}")
    _, info = _field_at(loc)
    described = info.description if info is not None and info.description else None
    if kind == "missing":
        section = _nested_model(loc)
        if section is not None:
            return _problem(path, _MISSING, "required: a mapping with keys " + _allowed_keys(section))
        return _problem(path, _MISSING, "required: " + (described or err.get("msg", "")))
    if kind == "value_error":
        reason = str(err.get("ctx", {}).get("error", err.get("msg", "")))
        return _problem(path, value, reason)
    if kind.startswith("model_type") or kind.startswith("dict_type"):
        return _problem(path, value, "a mapping of keys; allowed keys: " + _allowed_keys(_nested_model(loc)))
    return _problem(path, value, described or err.get("msg", "invalid"))


def _nested_model(loc: tuple) -> type[BaseModel] | None:
    model: Any = StackConfig
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        fields = {(f.alias or n): f for n, f in model.model_fields.items()}
        if part not in fields:
            return None
        ann = fields[part].annotation
        args = getattr(ann, "__args__", ())
        model = args[0] if getattr(ann, "__origin__", None) is list and args else ann
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


# --------------------------------------------------------------------------------------------
# Cross-field rules
# --------------------------------------------------------------------------------------------


def _check_counts(path: str, counts: NodeCounts, min_floor: int = 0) -> None:
    if counts.min_size < min_floor:
        raise _problem(f"{path}.minSize", counts.min_size, f"at least {min_floor} (system pods need a node)")
    if counts.min_size > counts.max_size:
        raise _problem(f"{path}.minSize", counts.min_size, f"at most maxSize ({counts.max_size})")
    if not counts.min_size <= counts.desired_size <= counts.max_size:
        raise _problem(f"{path}.desiredSize", counts.desired_size,
                       f"between minSize ({counts.min_size}) and maxSize ({counts.max_size})")


def check_semantics(cfg: StackConfig, region: str, catalog: Catalog) -> None:
    """Rules that span fields or need the catalog, one section at a time. Raises the first ConfigError."""
    check_network(cfg.network, region)
    check_cluster(cfg.cluster, catalog)
    check_admins(cfg)
    check_node_groups(cfg.node_groups, cfg.compute, catalog)


def check_network(net: NetworkConfig, region: str) -> None:
    """network: zones of the stack's region, the GPU zone among them, a service CIDR that collides with
    neither the VPC nor Docker's bridge."""
    vpc = ipaddress.IPv4Network(net.cidr)
    for i, az in enumerate(net.availability_zones):
        if not re.fullmatch(re.escape(region) + r"[a-z]", az):
            raise _problem(f"network.availabilityZones[{i}]", az,
                           f"a zone of aws:region {region} ({region}a, {region}b, ...)")
    if not re.fullmatch(re.escape(region) + r"[a-z]", net.gpu_availability_zone):
        raise _problem("network.gpuAvailabilityZone", net.gpu_availability_zone,
                       f"a zone of aws:region {region} listed in network.availabilityZones "
                       f"({', '.join(net.availability_zones)})")
    if net.gpu_availability_zone not in net.availability_zones:
        raise _problem("network.gpuAvailabilityZone", net.gpu_availability_zone,
                       f"one of network.availabilityZones ({', '.join(net.availability_zones)})")
    service = ipaddress.IPv4Network(net.kubernetes_service_cidr)
    if service.overlaps(vpc):
        raise _problem("network.kubernetesServiceCidr", net.kubernetes_service_cidr,
                       f"a CIDR that does not overlap network.cidr ({net.cidr})")
    if service.overlaps(ipaddress.IPv4Network("172.17.0.0/16")):
        raise _problem("network.kubernetesServiceCidr", net.kubernetes_service_cidr,
                       "a CIDR outside 172.17.0.0/16 (the Docker bridge range)")


# The public endpoint sees a caller's public (post-NAT) source address, so a private range (RFC 1918:
# 10/8, 172.16/12, 192.168/16) never matches anyone, and the documentation ranges (RFC 5737:
# 192.0.2/24, 198.51.100/24, 203.0.113/24, "SHOULD NOT be used on the public Internet") are examples
# that were never replaced. Python's ipaddress marks both, and the other IANA special-purpose ranges,
# as not global.
PUBLIC_CIDR_HELP = ("your public egress CIDR, e.g. the /32 of the address https://checkip.amazonaws.com "
                    "shows; not a private (RFC 1918: 10/8, 172.16/12, 192.168/16), documentation (RFC 5737: "
                    "192.0.2/24, 198.51.100/24, 203.0.113/24) or other reserved range, which no caller of "
                    "the public endpoint comes from; [] keeps the endpoint private")


def check_cluster(cluster: ClusterConfig, catalog: Catalog) -> None:
    """cluster: distinct, specific public endpoint CIDRs; a CPU system node type with sane counts."""
    seen_public: list[tuple[int, ipaddress.IPv4Network]] = []
    for i, raw in enumerate(cluster.public_access_cidrs):
        key = f"cluster.publicAccessCidrs[{i}]"
        try:
            net_i = _cidr(raw)
        except ValueError as exc:
            raise _problem(key, raw, str(exc)) from None
        if net_i.prefixlen == 0:
            raise _problem(key, raw, "a specific CIDR (never 0.0.0.0/0; [] keeps the endpoint private)")
        if not net_i.is_global:
            raise _problem(key, raw, PUBLIC_CIDR_HELP)
        for j, other in seen_public:
            if net_i.overlaps(other):
                raise _problem(key, raw,
                               f"a CIDR that does not overlap cluster.publicAccessCidrs[{j}] ({other})")
        seen_public.append((i, net_i))

    system = cluster.system_nodes
    sys_type = catalog.get(system.instance_type)
    if sys_type is None or sys_type.gpus:
        raise _problem("cluster.systemNodes.instanceType", system.instance_type,
                       f"a CPU instance type from infra/catalog.yaml: {', '.join(catalog.cpu_types())}")
    _check_counts("cluster.systemNodes", system, min_floor=1)


ADMINS_KEY = "cluster.adminPrincipalArns"


def check_admins(cfg: StackConfig) -> None:
    """cluster.adminPrincipalArns: at least one while compute is on, each of the stack's account."""
    admins = cfg.cluster.admin_principal_arns
    if cfg.compute and not admins:
        raise _problem(ADMINS_KEY, [], "at least one IAM role or user ARN: everyone who runs `up` (the "
                                       "Kubernetes provider authenticates as the caller)")
    for i, arn in enumerate(admins):
        if arn.split(":")[4] != cfg.account_id:
            raise _problem(f"{ADMINS_KEY}[{i}]", arn,
                           f"a principal of ringtrain:accountId {cfg.account_id}")


def check_deployer_is_admin(settings: Settings, deployer: str) -> None:
    """The principal running `up` (an assumed role's issuer role, or the IAM user) must be listed: the
    Kubernetes provider authenticates as it, and only listed principals get access entries."""
    cfg = settings.stack
    if not cfg.compute or deployer in cfg.cluster.admin_principal_arns:
        return
    raise _problem(ADMINS_KEY, list(cfg.cluster.admin_principal_arns),
                   f"a list that includes {deployer}, the principal running this `up`, which installs "
                   "the Kubernetes platform as itself: add it to Pulumi.<stack>.yaml and commit, or run "
                   "`up` as one of the listed principals")


def check_node_groups(node_groups: Sequence[NodeGroupConfig], compute: bool, catalog: Catalog) -> None:
    """nodeGroups: at least one while compute is on, unique names, then each group by itself."""
    if compute and not node_groups:
        raise _problem("nodeGroups", [], "at least one GPU node group while compute is true")
    names: set[str] = set()
    for i, group in enumerate(node_groups):
        base = f"nodeGroups[{i}]"
        if group.name in names:
            raise _problem(f"{base}.name", group.name, "a name no other node group uses")
        names.add(group.name)
        check_node_group(base, group, catalog)


def check_node_group(base: str, group: NodeGroupConfig, catalog: Catalog) -> None:
    """One GPU node group (`base` is its path, nodeGroups[i]): catalog GPU types of one GPU count (one
    shape for spot), EFA-capable with one interface layout when efa is on, the capacity type's rules,
    minSize 0."""
    if len(set(group.instance_types)) != len(group.instance_types):
        raise _problem(f"{base}.instanceTypes", group.instance_types, "distinct instance types")
    types = []
    for j, name in enumerate(group.instance_types):
        rec = catalog.get(name)
        if rec is None or rec.gpus == 0:
            raise _problem(f"{base}.instanceTypes[{j}]", name,
                           "a GPU instance type from infra/catalog.yaml: "
                           + ", ".join(catalog.gpu_types()))
        types.append(rec)
    first = types[0]
    for j, rec in enumerate(types[1:], start=1):
        if rec.gpus != first.gpus:
            raise _problem(f"{base}.instanceTypes[{j}]", rec.name,
                           f"a type with {first.gpus} GPUs like {first.name} (one group, one GPU count)")
        if group.capacity_type == "SPOT" and rec.shape != first.shape:
            raise _problem(f"{base}.instanceTypes[{j}]", rec.name,
                           f"a type of the spot pool's GPU shape {first.shape.describe()} "
                           f"like {first.name} "
                           f"(it is {rec.shape.describe()}; put other shapes in their own group)")
    if group.efa:
        for j, rec in enumerate(types):
            if not rec.efa:
                raise _problem(f"{base}.instanceTypes[{j}]", rec.name,
                               f"an EFA-capable type while efa is true: {', '.join(catalog.efa_types())}")
            if rec.network_cards != first.network_cards:
                raise _problem(f"{base}.instanceTypes[{j}]", rec.name,
                               f"a type with {first.network_cards} network cards like {first.name} "
                               "(one launch template, one EFA interface layout)")
    if group.capacity_type == "CAPACITY_BLOCK":
        if group.capacity_reservation_id is None:
            raise _problem(f"{base}.capacityReservationId", _MISSING,
                           "the id (cr-...) of the Capacity Block the CAPACITY_BLOCK group launches into")
        if len(group.instance_types) != 1:
            raise _problem(f"{base}.instanceTypes", group.instance_types,
                           "exactly one instance type, the Capacity Block's, for a CAPACITY_BLOCK group")
    if group.capacity_reservation_id is not None:
        if group.capacity_type == "SPOT":
            raise _problem(f"{base}.capacityReservationId", group.capacity_reservation_id,
                           "null for SPOT groups (reservations are on-demand capacity)")
        if len(group.instance_types) != 1:
            raise _problem(f"{base}.capacityReservationId", group.capacity_reservation_id,
                           "null unless the group has exactly one instance type (a reservation has one)")
        if group.efa and group.placement_group:
            raise _problem(f"{base}.placementGroup", True,
                           "false with a capacityReservationId (a forced cluster placement group "
                           "conflicts with reserved capacity)")
    if group.min_size != 0:  # infra-compute: the cost guard returns idle GPU groups to minSize
        raise _problem(f"{base}.minSize", group.min_size,
                       "0 (GPU node groups scale to zero when idle; set desiredSize for nodes at start)")
    _check_counts(base, group)


# --------------------------------------------------------------------------------------------
# Capacity Blocks for ML: rules that need AWS's record of the block
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CapacityBlock:
    """AWS's record of a Capacity Block (EC2 DescribeCapacityReservations, type capacity-block)."""

    reservation_id: str
    availability_zone: str
    instance_type: str
    instance_count: int
    state: str
    start_date: str
    end_date: str


# Capacity Block states in which its instances can still run (EC2 CapacityReservationState; a block
# goes payment-pending -> scheduled -> active -> expired).
USABLE_CAPACITY_BLOCK_STATES = ("payment-pending", "scheduled", "active")


def capacity_block_groups(cfg: StackConfig) -> list[tuple[int, NodeGroupConfig]]:
    return [(i, g) for i, g in enumerate(cfg.node_groups) if g.capacity_type == "CAPACITY_BLOCK"]


def check_capacity_blocks(settings: Settings, lookup: Callable[[str], CapacityBlock]) -> None:
    """Check every CAPACITY_BLOCK group against its block; raise the first ConfigError found.

    `lookup(reservation_id)` returns the block or raises LookupError with AWS's reason. The group's
    nodes launch only in network.gpuAvailabilityZone's subnet, and a block's instances exist only in
    its own zone, with its one instance type, up to its instance count, while it is active (EC2 user
    guide, "Launch instances using Capacity Blocks": an instance "can't launch in a subnet in a
    different Availability Zone from the Availability Zone where your Capacity Block is located";
    EKS user guide, "Create a managed node group with Capacity Blocks for ML").
    """
    cfg = settings.stack
    gpu_az = cfg.network.gpu_availability_zone
    for i, group in capacity_block_groups(cfg):
        base = f"nodeGroups[{i}]"
        rid = group.capacity_reservation_id
        assert rid is not None  # check_semantics requires it for CAPACITY_BLOCK
        try:
            block = lookup(rid)
        except LookupError as exc:
            raise _problem(f"{base}.capacityReservationId", rid,
                           f"a Capacity Block for ML of this account in aws:region {settings.region}; "
                           f"looking it up failed: {exc}") from None
        if block.availability_zone != gpu_az:
            raise _problem(f"{base}.capacityReservationId", rid,
                           f"a Capacity Block in network.gpuAvailabilityZone ({gpu_az}), where GPU nodes "
                           f"launch; this one is in {block.availability_zone}: set network."
                           f"gpuAvailabilityZone to {block.availability_zone} or use a block in {gpu_az}")
        if block.state not in USABLE_CAPACITY_BLOCK_STATES:
            raise _problem(f"{base}.capacityReservationId", rid,
                           f"a Capacity Block that is {', '.join(USABLE_CAPACITY_BLOCK_STATES[:-1])} or "
                           f"{USABLE_CAPACITY_BLOCK_STATES[-1]}; "
                           f"this one is {block.state} ({block.start_date} to {block.end_date})")
        if group.instance_types[0] != block.instance_type:
            raise _problem(f"{base}.instanceTypes[0]", group.instance_types[0],
                           f"{block.instance_type}, the instance type of Capacity Block {rid}")
        if group.max_size > block.instance_count:
            raise _problem(f"{base}.maxSize", group.max_size,
                           f"at most {block.instance_count}, the instances Capacity Block {rid} holds")
        if group.desired_size > 0 and block.state != "active":
            raise _problem(f"{base}.desiredSize", group.desired_size,
                           f"0 until Capacity Block {rid} is active (it is {block.state}, starts "
                           f"{block.start_date}); jobs scale the group up once it is")


def with_kubernetes_version(settings: Settings, version: str) -> Settings:
    """The same settings declaring another Kubernetes version (EKS upgraded the cluster past the
    committed one: infra/versions.py effective_version)."""
    cluster = settings.stack.cluster.model_copy(update={"kubernetes_version": version})
    return settings.model_copy(update={"stack": settings.stack.model_copy(update={"cluster": cluster})})


def check_private_endpoint(settings: Settings, cluster: str, endpoint: str | None,
                           reachable: Callable[[str], bool]) -> None:
    """With `cluster.publicAccessCidrs: []` the API endpoint answers inside the VPC only, and this run
    must reach it to install the Kubernetes platform. Refuse before anything is declared when it
    cannot: on the first `up` (no cluster yet; the VPC comes with this very run, so nothing can be
    inside it), or when the existing cluster's endpoint does not answer from here (`endpoint` is None
    when the cluster does not exist; `reachable(endpoint)` tries a TCP connection)."""
    cfg = settings.stack
    if not cfg.compute or cfg.cluster.public_access_cidrs:
        return
    if endpoint is None:
        raise _problem("cluster.publicAccessCidrs", [],
                       f"a list with this machine's egress CIDR (e.g. [198.51.100.7/32]) for the first "
                       f"`up`: with [] the API endpoint of {cluster}, which does not exist yet, answers only "
                       "inside the VPC this run creates, so the Kubernetes platform could not be installed; "
                       "set [] again once you run `up` from inside the VPC (VPN, bastion, CI runner there)")
    if not reachable(endpoint):
        raise _problem("cluster.publicAccessCidrs", [],
                       f"[] only when this machine reaches the private API endpoint of {cluster} ({endpoint} "
                       "does not answer from here): run `up` from inside the VPC (VPN, bastion, CI runner "
                       "there) or list this machine's egress CIDR")


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def _decode(value: Any) -> Any:
    """Engine config values are strings; structured and scalar non-string values are JSON text."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


# Top-level keys whose values are plain strings even when they look like JSON ("123", "true").
_STRING_KEYS = {"owner", "costCenter", "accountId"}


def raw_namespace(config: dict[str, Any]) -> dict[str, Any]:
    """The `ringtrain:` keys of an engine config map, prefix removed, values decoded."""
    out: dict[str, Any] = {}
    prefix = NAMESPACE + ":"
    for key, value in config.items():
        if key.startswith(prefix):
            short = key[len(prefix):]
            out[short] = value if short in _STRING_KEYS else _decode(value)
    return out


def parse_stack_config(raw: dict[str, Any], region: Any, catalog: Catalog | None = None) -> Settings:
    """Validate a decoded `ringtrain:` namespace for `region`; raise one ConfigError or return Settings."""
    catalog = catalog or load_catalog()
    if not isinstance(region, str) or not REGION_RE.match(region):
        shown = json.dumps(region) if region is not None else "(missing)"
        raise ConfigError(f"{REGION_KEY}: {shown} is invalid: an AWS region like us-east-1 "
                          "(set it with `pulumi config set aws:region us-east-1`)")
    try:
        cfg = StackConfig.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        first = _translate(errors[0])
        if len(errors) > 1:
            first = ConfigError(f"{first} (and {len(errors) - 1} more problem(s) after fixing this one)")
        raise first from None
    check_semantics(cfg, region, catalog)
    return Settings(region=region, stack=cfg)


def engine_config_map() -> dict[str, Any]:
    """Every config key the engine gave this program (the language host sets CONFIG or PULUMI_CONFIG)."""
    from pulumi.runtime import config as runtime_config

    merged: dict[str, Any] = dict(runtime_config.get_config_env())
    merged.update(runtime_config.CONFIG.get())
    return merged


def settings_from_engine_config(config: Mapping[str, Any]) -> Settings:
    """Validate a whole engine config map (values as the engine passes them: strings, JSON for the rest);
    the region is `aws:region`, else the AWS_REGION environment variable, as the AWS provider reads it."""
    return parse_stack_config(raw_namespace(dict(config)),
                              config.get(REGION_KEY) or os.environ.get("AWS_REGION"))


def load_stack_config() -> Settings:
    """Read and validate the running stack's config (call before declaring any resource)."""
    return settings_from_engine_config(engine_config_map())
