"""What a training job is, independent of where it runs.

One JobSpec is rendered once into an MPIJob (`cluster.mpijob.render_mpijob`, whose launcher runs
`cluster.launch.horovodrun_command`); the MPI Operator runs that object on EKS and the local executor
runs the same object on this machine, so both launch the trainer identically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cluster.usage import UsageError
from train.config import TrainConfig, parse_args
from train.errors import BadInput


@dataclass(frozen=True)
class JobSpec:
    """A Horovod training job.

    num_hosts * slots_per_host processes are started; with `elastic`, Horovod keeps training while
    at least `min_hosts` hosts are alive and lets lost hosts rejoin, up to `num_hosts`.
    `trainer` is the trainer's configuration (train/config.py), parsed once where the job is described
    (trainer_config); the launcher's command renders it (train.config.to_argv, cluster/launch.py).
    `exclude_nodes`: nodes its workers must not be scheduled on (the preflight's slow ones, cluster/flow.py).
    """

    name: str
    num_hosts: int
    slots_per_host: int = 1
    elastic: bool = False
    min_hosts: int | None = None
    trainer: TrainConfig = field(default_factory=TrainConfig)
    env: dict[str, str] = field(default_factory=dict)
    exclude_nodes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").isalnum() or self.name != self.name.lower():
            raise ValueError(f"job name {self.name!r}: use lower-case letters, digits and '-'")
        if self.num_hosts < 1:
            raise ValueError(f"num_hosts={self.num_hosts}: must be >= 1")
        if self.slots_per_host < 1:
            raise ValueError(f"slots_per_host={self.slots_per_host}: must be >= 1")
        if self.min_hosts is not None and not 1 <= self.min_hosts <= self.num_hosts:
            raise ValueError(f"min_hosts={self.min_hosts}: must be between 1 and num_hosts={self.num_hosts}")
        if any(not node for node in self.exclude_nodes):
            raise ValueError(f"exclude_nodes={self.exclude_nodes}: node names must not be empty")
        if self.trainer.horovod.adasum and self.num_procs > 1:
            # horovod/common/ops: Adasum is implemented on MPI only (the trainer refuses it on Gloo too).
            raise ValueError(f"--adasum with {self.num_procs} workers: the cluster launch runs Horovod over "
                             "Gloo (horovodrun --gloo, cluster/launch.py) and Horovod implements Adasum only "
                             "over MPI; drop --adasum")

    @property
    def num_procs(self) -> int:
        return self.num_hosts * self.slots_per_host

    @property
    def min_procs(self) -> int:
        return (self.min_hosts if self.min_hosts is not None else 1) * self.slots_per_host


def trainer_config(argv: Sequence[str]) -> TrainConfig:
    """The trainer's arguments parsed here by the trainer's own parser and checks (pure, but for importing
    the task), so that bad input is refused before anything is stood up, not after a cluster start. The
    defaults the trainer reads from its environment are left to the workers' environment."""
    try:
        return parse_args(list(argv), environ={})
    except BadInput as e:
        raise UsageError(f"trainer arguments: {e}") from None
