"""Start a benchmark job as subprocesses and collect its result line.

Every run is bounded by a timeout and killed as a process group on timeout, so a stuck collective
never hangs the benchmark.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.workerlib import RESULT_PREFIX

ROOT = Path(__file__).resolve().parents[1]


class BenchError(RuntimeError):
    """A benchmark run failed; the message names the run and shows the end of its output."""


def venv_bin(name: str) -> str:
    """A console script next to the running interpreter (horovodrun, torchrun)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise BenchError(f"{name} not found next to {sys.executable}; run scripts/setup first")
    return str(path)


def with_root_on_path(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the repository first on PYTHONPATH, so a child's `-m bench...` imports from it."""
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)}


def horovod_command(module: str, args: Sequence[str], np: int = 2) -> list[str]:
    return [venv_bin("horovodrun"), "--gloo", "-np", str(np), "-H", f"localhost:{np}",
            sys.executable, "-m", module, *args]


def ddp_command(module: str, args: Sequence[str], np: int = 2) -> list[str]:
    return [venv_bin("torchrun"), "--standalone", "--nproc-per-node", str(np), "-m", module, *args]


# horovodrun prefixes each worker's lines with "[rank]<stdout>:"
_RANK_PREFIX = re.compile(r"^\[\d+\]<std(?:out|err)>:")


def parse_result(output: str, prefix: str = RESULT_PREFIX) -> dict:
    """The JSON record on the (single) line starting with `prefix`, after any horovodrun rank tag."""
    lines = [_RANK_PREFIX.sub("", line) for line in output.splitlines()]
    found = [line for line in lines if line.startswith(prefix)]
    if len(found) != 1:
        raise ValueError(f"expected exactly one {prefix.strip()!r} line, found {len(found)}")
    return json.loads(found[0][len(prefix):])


_HARNESS_OWNED = ("HOROVOD_", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def run_command(
    label: str, cmd: Sequence[str], env: Mapping[str, str] | None = None, timeout_s: float = 300,
) -> str:
    """Run `cmd` to completion in its own process group; returns stdout+stderr; raises BenchError."""
    # The harness sets every tuning knob itself: inherited ones would silently change "defaults".
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(_HARNESS_OWNED)}
    full_env = with_root_on_path({**inherited, **(env or {})})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=full_env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise BenchError(f"{label}: no result within {timeout_s:.0f}s; last output:\n{tail(out)}") from None
    if proc.returncode != 0:
        raise BenchError(f"{label}: exited with code {proc.returncode}; last output:\n{tail(out)}")
    return out


def run_worker(label: str, cmd: Sequence[str], env: Mapping[str, str] | None = None,
               timeout_s: float = 300) -> dict:
    out = run_command(label, cmd, env, timeout_s)
    try:
        return parse_result(out)
    except ValueError as e:
        raise BenchError(f"{label}: {e}; last output:\n{tail(out)}") from None


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.splitlines()[-lines:])
