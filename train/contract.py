"""What the trainer promises whoever launches it, and what the launchers, the image and the stack must
agree on: exit codes, how a machine's cores are split between CPU workers, the seconds a stop may take,
the node-pool label, the launcher image's tag. They live with the trainer, which the worker image
carries alone; `cluster/`, `infra/` and `image/` import them from here, so there is one definition of
each (and no test keeping copies equal).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

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

# A spot reclaim drains the worker's node: the kubelet sends SIGTERM to the pod's PID 1 (the image's
# entrypoint, which forwards it to the trainer ranks) and SIGKILL when the pod's
# terminationGracePeriodSeconds end (cluster/mpijob.py sets it). The instance itself goes two minutes
# after the interruption notice, so longer buys nothing ("a warning that is issued two minutes before
# Amazon EC2 stops or terminates your Spot Instance":
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
WORKER_TERMINATION_GRACE_S = 120
# Of those, the trainers get RINGTRAIN_STOP_GRACE_S to reach a step boundary, checkpoint and exit (the
# entrypoint waits that long; the trainer measures its stop's checkpoint against it); the rest is the
# entrypoint's, to stop sshd after the trainers (image/ringtrain_entry/supervisor.py SSHD_STOP_S), plus
# slack: a grace beyond MAX_STOP_GRACE_S would let the SIGKILL land mid-checkpoint.
STOP_GRACE_ENV = "RINGTRAIN_STOP_GRACE_S"
DEFAULT_STOP_GRACE_S = 100.0
STOP_GRACE_MARGIN_S = 10
MAX_STOP_GRACE_S = WORKER_TERMINATION_GRACE_S - STOP_GRACE_MARGIN_S

# The label infra/nodegroups.py puts on every node: its node group's config name, SYSTEM_POOL for the
# on-demand CPU group; the MPIJob's selectors and the AWS backend's node queries name it.
NODE_POOL_LABEL = "ringtrain.io/node-pool"
SYSTEM_POOL = "system"
# image/build.py pushes the launcher target as <repository>:<tag> + this beside each worker tag; the
# MPIJob's launcher runs that image (cluster/mpijob.py launcher_image_for).
LAUNCHER_TAG_SUFFIX = "-launcher"


def stop_grace_s(environ: Mapping[str, str] = os.environ) -> float:
    """RINGTRAIN_STOP_GRACE_S in seconds (default DEFAULT_STOP_GRACE_S). ValueError, naming the value and
    the one allowed range, for anything that is not a number from 0 to MAX_STOP_GRACE_S."""
    raw = environ.get(STOP_GRACE_ENV)
    if raw is None:
        return DEFAULT_STOP_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_STOP_GRACE_S:  # (NaN fails too)
        raise ValueError(f"{STOP_GRACE_ENV}={raw!r}: allowed are 0..{MAX_STOP_GRACE_S} seconds (the worker "
                         f"pod's terminationGracePeriodSeconds is {WORKER_TERMINATION_GRACE_S}, the spot "
                         f"notice, less {STOP_GRACE_MARGIN_S} s for the entrypoint to stop sshd)")
    return value


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
