"""What the results were measured on: cores, CPU model, load, versions."""

from __future__ import annotations

import contextlib
import os
import platform
from importlib import metadata
from pathlib import Path


def cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Processor", "cpu model") and value.strip():
            return value.strip()
    return platform.processor() or "unknown"


def machine_info() -> dict:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    return {
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_model": cpu_model(cpuinfo),
        "platform": platform.platform(),
        "load_avg": list(os.getloadavg()),
    }


def cpu_seconds(proc) -> float:
    """User and system CPU time of a psutil.Process, all its threads."""
    times = proc.cpu_times()
    return times.user + times.system


def versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in ("torch", "horovod", "boto3", "moto"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def lowest_priority(pid: int) -> None:
    """Niceness 19 for every thread process `pid` has, and so for those they start later (a thread
    inherits its creator's). Linux keeps niceness per thread: setpriority(pid) alone would leave a
    server's already running request threads (the local S3 store's) at normal priority. Under
    autogroup scheduling niceness only weighs threads within a session; this leaves sessions alone."""
    done: set[str] = set()
    for _ in range(5):  # again for threads started meanwhile by threads not yet lowered
        try:
            tids = set(os.listdir(f"/proc/{pid}/task")) - done
        except OSError:  # the process has gone
            return
        if not tids:
            return
        for tid in tids:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, int(tid), 19)
        done |= tids
