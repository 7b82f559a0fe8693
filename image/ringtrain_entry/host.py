"""The node's facts behind one seam (commands run, programs on PATH, the sysfs tree), so tests can point
the self-test and sshd's preparation at fakes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SYSFS_INFINIBAND = Path("/sys/class/infiniband")


@dataclass
class CmdResult:
    rc: int
    out: str


@dataclass
class Host:
    env: Mapping[str, str]
    sysfs_infiniband: Path = DEFAULT_SYSFS_INFINIBAND
    python: str = sys.executable

    def which(self, name: str) -> str | None:
        # The venv's own horovodrun sits beside the interpreter even when PATH lacks the venv.
        beside = Path(self.python).parent / name
        if name == "horovodrun" and beside.exists():
            return str(beside)
        return shutil.which(name, path=self.env.get("PATH", os.defpath))

    def run(self, cmd: Sequence[str], timeout_s: float,
            extra_env: Mapping[str, str] | None = None) -> CmdResult:
        """Run cmd in its own process group; on timeout the whole group is killed (no stray ranks)."""
        try:
            proc = subprocess.Popen(
                list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env={**self.env, **(extra_env or {})}, start_new_session=True,
            )
        except OSError as e:
            return CmdResult(127, f"cannot run {cmd[0]}: {e.strerror}")
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return CmdResult(124, (out or "") + f"\n{cmd[0]} timed out after {timeout_s:.0f} s")
        return CmdResult(proc.returncode, out or "")
