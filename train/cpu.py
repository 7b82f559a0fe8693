"""Where a CPU worker's threads run (how many torch threads, which cores), and Horovod's CPU defaults.

The choices come from the benchmarks (bench/, README "Performance"): at 2 workers on 2 cores,
torch's default of one thread per core per process made a bare Horovod loop 20x slower, and
pinning each worker's threads (its training thread, Horovod's background thread, Gloo's) to a core
of its own lifted Horovod from about 0.8x to about 1.0x torch DDP: Horovod's wait for a collective
spins with sched_yield, which hands the core to the threads doing the work only when they share a
core. GPU workers are left alone: their binding is a NUMA/PCIe question this cannot measure.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping

import torch

from train.contract import cores_per_worker, cpu_share

# Horovod's cycle time for CPU workers (its own default is 1 ms): how long its background thread
# sleeps between rounds, so at most how long a step's ready gradients wait before their allreduce is
# negotiated. A small model's step is latency-bound: a short cycle gains more than the waking thread's
# own CPU costs (the "cycle" settings of the tuning study, bench/RESULTS.md, against the earlier 0.5 ms).
CPU_CYCLE_TIME_MS = 0.05

# CPU workers allreduce all their gradients in one group, sent when the last is ready, instead of
# each gradient as it comes: a worker's one core cannot overlap communication with the backward pass
# anyway, and one fused allreduce per step replaces several (each with Horovod's negotiation round).
# Measured in bench/ (the "groups1" settings of the tuning study, bench/RESULTS.md) against the
# per-gradient way with the same other settings.
CPU_GRADIENT_GROUPS = 1


def cpu_threads_per_worker(cpus: int, local_size: int, environ: Mapping[str, str]) -> int | None:
    """torch's intra-op threads for a CPU worker, or None to leave torch's choice alone.

    torch gives every process one thread per core; with several workers on one host that
    oversubscribes the cores. torchrun sets one thread per worker; horovodrun sets nothing. We share
    the cores among the host's workers unless the user chose explicitly with OMP_NUM_THREADS.
    """
    if environ.get("OMP_NUM_THREADS"):
        return None
    return cores_per_worker(cpus, local_size)


def pin_worker(local_rank: int, local_size: int) -> tuple[int, ...] | None:
    """Pin every thread of this process to this worker's share of the cores it may use.

    Called after hvd.init(), so the threads Horovod and Gloo have started are moved too (each thread
    has its own affinity; threads started later inherit their creator's). Returns the cores, or
    None when there are fewer cores than workers (nothing is pinned then).
    """
    allowed = sorted(os.sched_getaffinity(0))
    share = cpu_share(allowed, local_rank, local_size)
    if share is None:
        return None
    every_thread(lambda tid: os.sched_setaffinity(tid, share))
    return share


def every_thread(apply: Callable[[int], object]) -> None:
    """apply(tid) for every thread this process has: Linux keeps affinity, niceness and scheduling
    policy per thread (a thread inherits its creator's), so setting them for the process's pid alone
    leaves the threads already running (Horovod's, Gloo's, a client's) as they were."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
            apply(int(tid))


def idle_while_finishing() -> bool:
    """Move every thread of this process to SCHED_IDLE: for a worker whose training is over.

    From then on a worker writes its last checkpoint and waits: rank 0 on its checkpoint writer
    (niceness 19) and the store, the others at the exit barrier. Meanwhile Horovod's background thread
    keeps negotiating every cycle (0.05 ms on CPU workers) and a waiting collective spins: at normal
    priority two waiting ranks filled both cores of a 2-core machine and starved the writer, which
    made the 2-worker image test several times as long. SCHED_IDLE threads run only where nothing else
    wants the core. Once: an unprivileged thread
    cannot leave SCHED_IDLE (RLIMIT_NICE), so only a process about to exit calls this. Threads started
    later inherit it. Returns whether every thread moved (a seccomp profile may refuse; the run goes
    on at normal priority then).
    """
    try:
        every_thread(lambda tid: os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0)))
    except OSError:
        return False
    return True


def fp16_autocast_works() -> bool:
    """Whether this torch's CPU autocast runs float16 (older builds lack it)."""
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            out = torch.nn.functional.linear(torch.ones(2, 2), torch.ones(2, 2))
        return out.dtype == torch.float16
    except (RuntimeError, TypeError):
        return False
