"""What a training job is, independent of where it runs.

One JobSpec is rendered once into an MPIJob (`cluster.mpijob.render_mpijob`, whose launcher runs
`cluster.launch.horovodrun_command`); the MPI Operator runs that object on EKS and the local executor
runs the same object on this machine, so both launch the trainer identically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# Exit code of `python -m train` when it stopped on SIGTERM after writing a checkpoint: the run
# is interrupted but resumable. 75 is EX_TEMPFAIL from sysexits.h ("try again later").
EXIT_INTERRUPTED_RESUMABLE = 75
# Exit code of `python -m train` for bad input (arguments, dataset, endpoint, credentials).
EXIT_BAD_INPUT = 2


def cores_per_worker(cpus: int, workers: int) -> int:
    """Intra-op threads for each of `workers` CPU processes sharing `cpus` cores (never zero).

    One thread per core in total: oversubscribed cores starve Horovod's busy-waiting collectives
    (bench/: a bare Horovod loop 20x slower at 2 workers x 2 threads on 2 cores).
    """
    return max(1, cpus // max(1, workers))


def cpu_share(cpus: Sequence[int], index: int, parts: int) -> tuple[int, ...] | None:
    """The contiguous slice of `cpus` that part `index` of `parts` gets, or None when there are fewer
    cores than parts (then nobody is pinned: a shared core is better shared by the scheduler).

    Each part gets cores_per_worker cores; cores left over by an uneven split stay unused by pinned
    workers, as torchrun's and mpirun's bindings leave them.
    """
    if not 0 <= index < parts:
        raise ValueError(f"part {index} of {parts}: must be in 0..{parts - 1}")
    ordered = sorted(cpus)
    if len(ordered) < parts:
        return None
    k = cores_per_worker(len(ordered), parts)
    return tuple(ordered[index * k:(index + 1) * k])


@dataclass(frozen=True)
class JobSpec:
    """A Horovod training job.

    num_hosts * slots_per_host processes are started; with `elastic`, Horovod keeps training while
    at least `min_hosts` hosts are alive and lets lost hosts rejoin, up to `num_hosts`.
    `trainer_args` are the arguments after `python -m train`.
    """

    name: str
    num_hosts: int
    slots_per_host: int = 1
    elastic: bool = False
    min_hosts: int | None = None
    trainer_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").isalnum() or self.name != self.name.lower():
            raise ValueError(f"job name {self.name!r}: use lower-case letters, digits and '-'")
        if self.num_hosts < 1:
            raise ValueError(f"num_hosts={self.num_hosts}: must be >= 1")
        if self.slots_per_host < 1:
            raise ValueError(f"slots_per_host={self.slots_per_host}: must be >= 1")
        if self.min_hosts is not None and not 1 <= self.min_hosts <= self.num_hosts:
            raise ValueError(f"min_hosts={self.min_hosts}: must be between 1 and num_hosts={self.num_hosts}")

    @property
    def num_procs(self) -> int:
        return self.num_hosts * self.slots_per_host

    @property
    def min_procs(self) -> int:
        return (self.min_hosts if self.min_hosts is not None else 1) * self.slots_per_host
