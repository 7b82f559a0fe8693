"""What the trainer promises whoever launches it: its exit codes and how a machine's cores are split
between its CPU workers. They live with the trainer, which the worker image carries alone; `cluster/`
(the launchers, both backends) imports them from here, so there is one definition of each.
"""

from __future__ import annotations

from collections.abc import Sequence

# Exit code of `python -m train` when it stopped on SIGTERM after writing a checkpoint: the run
# is interrupted but resumable. 75 is EX_TEMPFAIL from sysexits.h ("try again later").
EXIT_INTERRUPTED_RESUMABLE = 75
# Exit code of `python -m train` for bad input (arguments, dataset, endpoint, credentials).
EXIT_BAD_INPUT = 2
# Exit code when the hang watchdog ended the run (train/watchdog.py): no step completed in time. Like
# any failure but bad input, the launcher restarts it from the newest checkpoint. 76 is EX_PROTOCOL.
EXIT_HUNG = 76
# Exit code when the preflight found a link below its floor (train/preflight.py): the job fails fast
# and names the node; restarting on the same nodes would fail again. 69 is EX_UNAVAILABLE.
EXIT_PREFLIGHT_FAILED = 69
# Seconds every rank sleeps after each step: paces a demo or a fault test so that a fault lands
# mid-run on a fast machine (`ringtrain run --step-pace`).
FAULT_STEP_SLEEP_ENV = "RINGTRAIN_FAULT_STEP_SLEEP_S"

# The checkpoint layout a launcher may read (train/checkpoint/store.py writes it): a checkpoint of step N
# is complete once <checkpoint-uri>/<step_dir(N)>/<MANIFEST> exists, written after every object it lists.
MANIFEST = "manifest.json"


def step_dir(step: int) -> str:
    return f"step-{step:09d}"


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
