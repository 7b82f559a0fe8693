"""Run real `python -m train` processes for the tests, alone or under `horovodrun --gloo`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """One thread per worker: the machine has 2 cores shared with other test processes."""
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("AWS_ENDPOINT_URL", None)
    env.update(extra or {})
    return env


def train_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "train", "--no-progress", *args]


def horovodrun_cmd(np: int, *args: str, hosts: str | None = None, module: str = "train") -> list[str]:
    """`module` runs instead of the trainer when it takes the trainer's arguments (a test probe)."""
    return [str(VENV_BIN / "horovodrun"), "--gloo", "-np", str(np), "-H", hosts or f"localhost:{np}",
            sys.executable, "-m", module, "--no-progress", *args]


def run(cmd: list[str], timeout: float = 180, env: dict[str, str] | None = None):
    return subprocess.run(cmd, cwd=REPO, env=env or worker_env(), capture_output=True, text=True,
                          timeout=timeout)


def start(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, env=env or worker_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def train_workers(proc: subprocess.Popen) -> list[psutil.Process]:
    """The `python -m train` processes under a launcher (excluding the launcher and shells)."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for c in children:
        try:
            cmd = c.cmdline()
        except psutil.NoSuchProcess:
            continue
        launcher = cmd[:1] == ["/bin/sh"] or any("horovodrun" in part for part in cmd)
        if "-m" in cmd and "train" in cmd and not launcher:
            out.append(c)
    return out


def vanish(proc: subprocess.Popen) -> None:
    """The node vanishes: the launcher and every process under it stop at once, then die. Killed one
    by one, a survivor could react to the first death in between (the launcher SIGTERMs the others,
    whose stop aborts the checkpoint in flight), which no real node loss allows."""
    launcher = psutil.Process(proc.pid)
    frozen = {launcher.pid: launcher}
    with contextlib.suppress(psutil.NoSuchProcess):
        launcher.suspend()   # first: it cannot signal the rest
        for _ in range(20):  # again until none is new: one not yet stopped may have forked meanwhile
            new = [p for p in launcher.children(recursive=True) if p.pid not in frozen]
            if not new:
                break
            for p in new:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.suspend()
                frozen[p.pid] = p
    for p in frozen.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.communicate(timeout=30)


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None,
             interval: float = 0.05):
    """Poll `predicate` until truthy; fail early (with the run's output) if `proc` ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read()[-4000:]
            raise AssertionError(f"run ended (code {proc.returncode}) before {what}:\n{out}")
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def metrics_steps(path: Path) -> list[int]:
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError):  # a line being written right now
            record = json.loads(line)
            if "loss" in record:   # training records only (not the preflight's or evaluation's)
                steps.append(record["step"])
    return steps


def finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=10)
        raise AssertionError(f"run did not finish within {timeout}s; output:\n{out[-4000:]}") from None
    return out
