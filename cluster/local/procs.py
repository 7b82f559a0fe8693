"""Finding and stopping the processes the local backend started.

Every process is stopped by its own id (or its group), never by name, so nothing of anyone else's
is touched. Stops are bounded: SIGTERM, a grace period, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterable, Mapping

import psutil

# Horovod starts every worker with `env HOROVOD_RANK=... <command>`: the variable marks the training
# processes themselves (not the shells and sshd sessions around them), which are what Kubernetes
# signals when a spot node is reclaimed.
WORKER_MARKER = "HOROVOD_RANK"


def is_worker_environment(environ: Mapping[str, str]) -> bool:
    return WORKER_MARKER in environ


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def worker_processes(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    found = []
    for p in procs:
        try:
            if is_worker_environment(p.environ()):
                found.append(p)
        except psutil.Error:
            continue  # gone already, or not ours to read
    return found


def signal_all(procs: Iterable[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)


def stop_processes(procs: Iterable[psutil.Process], grace_s: float = 5.0) -> None:
    """SIGTERM, wait up to `grace_s`, SIGKILL what is left, wait again (bounded)."""
    procs = list(procs)
    signal_all(procs, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    signal_all(alive, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)


def stop_popen_tree(proc: subprocess.Popen | None, grace_s: float = 5.0) -> None:
    """Stop a process we started (with start_new_session=True) together with everything under it."""
    if proc is None:
        return
    tree = []
    if proc.poll() is None:
        tree = descendants(proc.pid)
        with contextlib.suppress(psutil.Error):
            tree.insert(0, psutil.Process(proc.pid))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    stop_processes(tree, grace_s=grace_s)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
