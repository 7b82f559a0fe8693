"""Typed view of infra/catalog.yaml (instance types, GPU shapes, EFA cards, prices)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

CATALOG_PATH = Path(__file__).with_name("catalog.yaml")


class CatalogError(Exception):
    """catalog.yaml is malformed (a repository bug, not a user error)."""


class GpuShape(NamedTuple):
    """What makes two instance types interchangeable for one synchronous data-parallel job.

    GPU count per instance, GPU model and memory per GPU. Two types of the same shape (g5.12xlarge and
    g5.24xlarge: 4 x A10G 24 GiB) differ only in host CPU and memory, so a job spread over both runs at
    one speed and fits the same model. Same count and memory but another model (g5.12xlarge A10G vs
    g6.12xlarge L4, both 4 x 24 GiB) is NOT the same shape: L4 has half the memory bandwidth of A10G,
    so every allreduce waits for the slower GPUs, and the image must target two CUDA architectures.
    """

    gpus: int
    model: str | None
    memory_gib: int

    def describe(self) -> str:
        if not self.gpus:
            return "no GPU"
        return f"{self.gpus} x {self.model} {self.memory_gib} GiB"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class InstanceType(_Record):
    name: str = ""
    gpus: int = Field(ge=0)
    gpu_model: str | None
    gpu_memory_gib: int = Field(ge=0, alias="gpuMemoryGiB")
    vcpus: int = Field(gt=0)
    memory_gib: int = Field(gt=0, alias="memoryGiB")
    efa: bool
    network_cards: int = Field(ge=1)
    on_demand_usd_per_hour: float | None = Field(ge=0)
    price_source: str
    price_date: str
    # nccl-tests allreduce busbw measured between two such instances (GB/s), with where it was read:
    # the reference the job's preflight floor derives from (cluster/aws/backend.py). None: not measured.
    allreduce_busbw_gbps: float | None = Field(default=None, gt=0)
    allreduce_busbw_source: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> InstanceType:
        if (self.gpus > 0) != (self.gpu_model is not None):
            raise ValueError("gpuModel must be set exactly when gpus > 0")
        if (self.allreduce_busbw_gbps is None) != (self.allreduce_busbw_source is None):
            raise ValueError("allreduceBusbwGbps needs its allreduceBusbwSource, and only with it")
        if not self.efa and self.network_cards != 1:
            raise ValueError("a type without EFA has networkCards: 1")
        return self

    @property
    def shape(self) -> GpuShape:
        return GpuShape(self.gpus, self.gpu_model, self.gpu_memory_gib)

    @property
    def efa_interfaces(self) -> int:
        """EFA interfaces to attach: one per network card (0 without EFA)."""
        return self.network_cards if self.efa else 0


class FixedCosts(_Record):
    eks_control_plane_usd_per_hour: float = Field(ge=0)
    nat_gateway_usd_per_hour: float = Field(ge=0)
    price_source: str
    price_date: str


class Catalog(_Record):
    fixed_costs: FixedCosts
    instance_types: dict[str, InstanceType]

    @model_validator(mode="after")
    def _named(self) -> Catalog:
        for key, rec in self.instance_types.items():
            object.__setattr__(rec, "name", key)
        return self

    def get(self, name: str) -> InstanceType | None:
        return self.instance_types.get(name)

    def __getitem__(self, name: str) -> InstanceType:
        return self.instance_types[name]

    def __contains__(self, name: object) -> bool:
        return name in self.instance_types

    def gpu_types(self) -> list[str]:
        return sorted(n for n, t in self.instance_types.items() if t.gpus > 0)

    def cpu_types(self) -> list[str]:
        return sorted(n for n, t in self.instance_types.items() if t.gpus == 0)

    def efa_types(self) -> list[str]:
        return sorted(n for n, t in self.instance_types.items() if t.efa)


def parse_catalog(doc: object) -> Catalog:
    try:
        return Catalog.model_validate(doc)
    except ValidationError as exc:
        raise CatalogError(f"{CATALOG_PATH.name} is malformed: {exc}") from None


@functools.lru_cache(maxsize=1)
def load_catalog(path: Path = CATALOG_PATH) -> Catalog:
    return parse_catalog(yaml.safe_load(path.read_text()))
