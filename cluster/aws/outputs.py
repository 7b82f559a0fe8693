"""The stack outputs the AWS backend reads, parsed once into a typed record.

Names follow the infra contract's exports. The data-layer outputs exist whenever the stack has been
deployed; the compute outputs (cluster, training namespace and service account, node groups) only
while `ringtrain:compute` is true, so a missing one means "run up first", and the error says so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster.backend import BackendError

DATA_OUTPUTS = ("datasetsBucket", "checkpointsBucket", "ecrRepositoryUrl")
COMPUTE_OUTPUTS = ("clusterName", "trainingNamespace", "trainingServiceAccount", "nodeGroups")


# The EKS API's node group capacity types (botocore eks 2017-11-01, CapacityTypes).
CAPACITY_TYPES = ("ON_DEMAND", "SPOT", "CAPACITY_BLOCK")


ECR_REGISTRY = re.compile(r"^\d{12}\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/")


class OutputsError(BackendError):
    """The stack's outputs lack something the asked-for action needs."""


@dataclass(frozen=True)
class NodeGroupOutput:
    """One GPU node group as exported by the stack (`nodeGroups` output)."""

    name: str
    instance_types: tuple[str, ...]
    capacity_type: str          # ON_DEMAND | SPOT | CAPACITY_BLOCK
    efa_interfaces: int         # EFA devices per node; 0 without EFA
    eks_name: str | None = None  # the EKS node group's own name (what the EKS API scales)


@dataclass(frozen=True)
class StackOutputs:
    stack: str
    datasets_bucket: str
    checkpoints_bucket: str
    ecr_repository_url: str
    cluster_name: str | None = None
    training_namespace: str | None = None
    training_service_account: str | None = None
    training_role_arn: str | None = None
    node_groups: tuple[NodeGroupOutput, ...] = ()

    @property
    def has_compute(self) -> bool:
        return self.cluster_name is not None

    @property
    def region(self) -> str:
        """The stack's AWS region, from its ECR repository URL
        (`<account>.dkr.ecr.<region>.amazonaws.com[.cn]/<name>`: Amazon ECR user guide, registry URLs)."""
        m = ECR_REGISTRY.match(self.ecr_repository_url)
        if m is None:
            raise OutputsError(f"stack {self.stack!r} output ecrRepositoryUrl is "
                               f"{self.ecr_repository_url!r}: expected "
                               "<account>.dkr.ecr.<region>.amazonaws.com/<repository>")
        return m.group(1)

    def require_compute(self) -> None:
        if not self.has_compute:
            missing = ", ".join(COMPUTE_OUTPUTS)
            raise OutputsError(
                f"stack {self.stack!r} has no compute outputs ({missing}): its compute is down "
                "(ringtrain:compute=false) or was never deployed; "
                f"run `scripts/up --stack {self.stack}` first"
            )

    def node_group(self, name: str | None) -> NodeGroupOutput:
        """The named GPU node group, or the only one when `name` is None."""
        self.require_compute()
        names = [g.name for g in self.node_groups]
        if not names:
            raise OutputsError(
                f"stack {self.stack!r} exports no GPU node groups (ringtrain:nodeGroups is empty)"
            )
        if name is None:
            if len(names) > 1:
                raise OutputsError(
                    f"stack {self.stack!r} has several GPU node groups ({', '.join(names)}): name one"
                )
            return self.node_groups[0]
        for group in self.node_groups:
            if group.name == name:
                return group
        raise OutputsError(
            f"node group {name!r} is not in stack {self.stack!r}: allowed are {', '.join(names)}"
        )


def _node_group(name: str, raw: Any, stack: str) -> NodeGroupOutput:
    where = f"stack {stack!r} output nodeGroups.{name}"
    if not isinstance(raw, Mapping):
        raise OutputsError(
            f"{where} is {raw!r}: expected a mapping with instanceTypes, capacityType, efaInterfaces"
        )
    types = raw.get("instanceTypes")
    if not isinstance(types, list | tuple) or not types or not all(isinstance(t, str) for t in types):
        raise OutputsError(f"{where}.instanceTypes is {types!r}: expected a non-empty list of instance types")
    capacity = raw.get("capacityType")
    if capacity not in CAPACITY_TYPES:
        raise OutputsError(
            f"{where}.capacityType is {capacity!r}: expected one of {', '.join(CAPACITY_TYPES)}")
    efa = raw.get("efaInterfaces", 0)
    # Outputs that went through the engine may carry numbers as floats (3.0); accept whole numbers only.
    if isinstance(efa, bool) or not isinstance(efa, int | float) or efa < 0 or int(efa) != efa:
        raise OutputsError(f"{where}.efaInterfaces is {efa!r}: expected a whole number >= 0")
    eks_name = raw.get("eksNodeGroupName")
    return NodeGroupOutput(name=name, instance_types=tuple(types), capacity_type=capacity,
                           efa_interfaces=int(efa), eks_name=str(eks_name) if eks_name else None)


def parse_outputs(stack: str, raw: Mapping[str, Any]) -> StackOutputs:
    """Typed outputs from the plain {name: value} mapping of a stack's outputs."""
    missing = [k for k in DATA_OUTPUTS if not raw.get(k)]
    if missing:
        raise OutputsError(
            f"stack {stack!r} lacks the outputs {', '.join(missing)}: it has not been deployed; "
            f"run `scripts/up --stack {stack}` first"
        )
    compute = {k: raw.get(k) for k in COMPUTE_OUTPUTS}
    present = [k for k, v in compute.items() if v is not None]
    if present and len(present) != len(COMPUTE_OUTPUTS):
        absent = [k for k in COMPUTE_OUTPUTS if k not in present]
        raise OutputsError(f"stack {stack!r} exports {', '.join(present)} but not {', '.join(absent)}: "
                           "the stack is half deployed; run `scripts/up` again")
    groups: tuple[NodeGroupOutput, ...] = ()
    if present:
        raw_groups = compute["nodeGroups"]
        if not isinstance(raw_groups, Mapping):
            raise OutputsError(f"stack {stack!r} output nodeGroups is {raw_groups!r}: expected a mapping "
                               "name -> {instanceTypes, capacityType, efaInterfaces}")
        groups = tuple(_node_group(n, g, stack) for n, g in raw_groups.items())
    return StackOutputs(
        stack=stack,
        datasets_bucket=str(raw["datasetsBucket"]),
        checkpoints_bucket=str(raw["checkpointsBucket"]),
        ecr_repository_url=str(raw["ecrRepositoryUrl"]),
        cluster_name=compute["clusterName"],
        training_namespace=compute["trainingNamespace"],
        training_service_account=compute["trainingServiceAccount"],
        training_role_arn=raw.get("trainingRoleArn"),
        node_groups=groups,
    )
