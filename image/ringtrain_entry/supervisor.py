"""sshd mode's PID 1: sshd as a child, SIGTERM forwarded to the trainers (image/entrypoint.py's docstring
says why), orphans reaped; and the preparation sshd needs first (mounted keys, host keys)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ringtrain_entry.host import Host
from ringtrain_entry.settings import EXIT_OK, UsageError

DEFAULT_SSH_DIR = Path("/root/.ssh")          # the MPI Operator's default sshAuthMountPath
DEFAULT_HOST_KEY_DIR = Path("/etc/ssh")
SSHD = "/usr/sbin/sshd"
SSHD_RUN_DIR = Path("/run/sshd")              # sshd's privilege-separation directory
PROC_ROOT = Path("/proc")
SSHD_STOP_S = 5.0                             # sshd's time to exit after SIGTERM, then SIGKILL
TRAINER_MODULE = "train"                      # `python -m train`, what horovodrun starts on workers


def prepare_sshd(ssh_dir: Path, host_key_dir: Path, run_dir: Path, host: Host) -> list[str]:
    """Check the mounted keys, make host keys and sshd's privilege-separation dir; returns what was done.

    Raises UsageError when the worker could not be reached anyway (no authorized_keys).
    """
    done = []
    auth = ssh_dir / "authorized_keys"
    if not auth.is_file() or not auth.read_text().strip():
        raise UsageError(
            f"no authorized_keys in {ssh_dir}: the MPI Operator mounts the job's key pair there "
            "(sshAuthMountPath); without it the launcher cannot reach this worker"
        )
    if not any(host_key_dir.glob("ssh_host_*_key")):
        keygen = host.which("ssh-keygen")
        if not keygen:
            raise UsageError("ssh-keygen is not installed; cannot create sshd host keys")
        res = host.run([keygen, "-A"], 60)
        if res.rc != 0:
            raise UsageError(f"ssh-keygen -A failed: {res.out.strip()}")
        done.append("generated host keys")
    run_dir.mkdir(parents=True, exist_ok=True)
    return done


def python_module(argv: Sequence[str]) -> str | None:
    """The module a Python command line runs with -m (`python -u -m train`, `python3 -mtrain`), else None.

    Reads the interpreter's options the way CPython does: short options may be clustered (`-um train`),
    -W/-X take a value, -c or a script path means no module runs.
    """
    if not argv or not Path(argv[0]).name.startswith("python"):
        return None
    args = list(argv[1:])
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-" or not arg.startswith("-") or arg.startswith("--"):
            return None  # a script, stdin, or a long option (none of which run -m)
        for j, opt in enumerate(arg[1:], 1):
            value = arg[j + 1:]
            if opt == "c":
                return None
            if opt in ("m", "W", "X"):
                if not value:
                    i += 1
                    if i >= len(args):
                        return None
                    value = args[i]
                if opt == "m":
                    return value
                break
        i += 1
    return None


def is_trainer_cmdline(argv: Sequence[str]) -> bool:
    return python_module(argv) == TRAINER_MODULE


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    state: str                 # R, S, D, Z (zombie: exited, not reaped), ...
    argv: tuple[str, ...]


def read_processes(proc_root: Path = PROC_ROOT) -> dict[int, ProcInfo]:
    """Every process in /proc (pid, parent, state, command line); ones that vanish while read are skipped."""
    procs = {}
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
        fields = stat[stat.rfind(")") + 1:].split()
        if len(fields) < 2 or not fields[1].isdigit():
            continue
        argv = tuple(a.decode(errors="replace") for a in raw.split(b"\0")[:-1]) if raw else ()
        procs[int(entry.name)] = ProcInfo(int(entry.name), int(fields[1]), fields[0], argv)
    return procs


def descends_from(pid: int, ancestor: int, procs: Mapping[int, ProcInfo]) -> bool:
    seen = set()
    while pid in procs and pid not in seen:
        seen.add(pid)
        pid = procs[pid].ppid
        if pid == ancestor:
            return True
    return False


def trainer_pids(
    proc_root: Path = PROC_ROOT,
    matcher: Callable[[Sequence[str]], bool] = is_trainer_cmdline,
    under: int | None = None,
) -> set[int]:
    """Live (not zombie) processes whose command line the matcher accepts; with `under`, only that
    process's descendants. As a pod's PID 1 the whole PID namespace is the container's, so all count."""
    procs = read_processes(proc_root)
    found = {p.pid for p in procs.values() if p.state != "Z" and matcher(p.argv)}
    if under is not None:
        found = {pid for pid in found if descends_from(pid, under, procs)}
    return found


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper() -> bool:
    """Make orphaned descendants ours (as they would be for PID 1), so they are reaped and still counted
    as our descendants: needed when something else is PID 1 (tini, tests). Best effort."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def exit_code(wait_status: int) -> int:
    """A wait status as a shell reports it: the exit code, or 128 + N for death by signal N."""
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code


class SshdSupervisor:
    """Runs sshd as a child; SIGTERM/SIGINT (or sshd exiting) stops the trainers first, then sshd.

    One loop, woken by signals through a self-pipe (signal.set_wakeup_fd), so nothing is missed between
    checks; every wake-up also reaps any exited child, orphans included (as PID 1 they all come to us).
    """

    def __init__(
        self,
        cmd: Sequence[str],
        env: Mapping[str, str],
        stop_grace_s: float,
        *,
        proc_root: Path = PROC_ROOT,
        matcher: Callable[[Sequence[str]], bool] = is_trainer_cmdline,
        sshd_stop_s: float = SSHD_STOP_S,
        emit: Callable[[str], None] = lambda s: print(s, flush=True),
    ) -> None:
        self.cmd = list(cmd)
        self.env = dict(env)
        self.stop_grace_s = stop_grace_s
        self.proc_root = proc_root
        self.matcher = matcher
        self.sshd_stop_s = sshd_stop_s
        self.emit = emit
        self.stop_signal: int | None = None
        self.sshd_pid = 0
        self.sshd_status: int | None = None   # wait status once reaped
        self._wake_r = -1

    # -- signals and children

    def _on_stop(self, signum: int, frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.sshd_pid:
                self.sshd_status = status

    def _sleep(self, timeout_s: float) -> None:
        """Until a signal arrives (SIGCHLD included) or timeout_s passes."""
        ready, _, _ = select.select([self._wake_r], [], [], max(timeout_s, 0.0))
        if ready:
            try:
                while os.read(self._wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        self._reap()

    # -- the run

    def run(self) -> int:
        if os.getpid() != 1:
            become_subreaper()
        wake_r, wake_w = os.pipe()
        for fd in (wake_r, wake_w):
            os.set_blocking(fd, False)
        self._wake_r = wake_r
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}
        old_wakeup = signal.set_wakeup_fd(wake_w)
        # Handlers before sshd starts: a SIGTERM from then on is never lost (PID 1 ignores unhandled ones).
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # only to wake the loop
        try:
            return self._run()
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for s, handler in previous.items():
                signal.signal(s, handler)
            os.close(wake_r)
            os.close(wake_w)

    def _run(self) -> int:
        try:
            proc = subprocess.Popen(self.cmd, env=self.env)
        except OSError as e:
            print(f"entrypoint: error: cannot run {self.cmd[0]}: {e.strerror}", file=sys.stderr, flush=True)
            return 127
        self.sshd_pid = proc.pid
        try:
            while self.stop_signal is None and self.sshd_status is None:
                self._sleep(60.0)
            if self.stop_signal is not None:
                name = signal.Signals(self.stop_signal).name
                self.emit(f"entrypoint: {name}: stopping the trainers, then sshd")
                own_exit = None
            else:
                own_exit = exit_code(self.sshd_status)
                self.emit(f"entrypoint: sshd exited by itself ({own_exit}); stopping the trainers")
            self.stop_trainers()
            self.stop_sshd()
            return EXIT_OK if own_exit is None else own_exit
        finally:
            proc.returncode = exit_code(self.sshd_status) if self.sshd_status is not None else -1

    def stop_trainers(self) -> None:
        """SIGTERM to each trainer process (and any that start meanwhile); wait, bounded, for all to exit."""
        under = None if os.getpid() == 1 else os.getpid()
        start = time.monotonic()
        deadline = start + self.stop_grace_s
        signalled: set[int] = set()
        while True:
            pids = trainer_pids(self.proc_root, self.matcher, under)
            for pid in sorted(pids - signalled):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
                signalled.add(pid)
            if not pids:
                if signalled:
                    self.emit(f"entrypoint: {len(signalled)} trainer processes exited after "
                              f"{time.monotonic() - start:.1f} s")
                else:
                    self.emit("entrypoint: no trainer processes running")
                return
            if time.monotonic() >= deadline:
                self.emit(f"entrypoint: warning: trainer processes {sorted(pids)} still running after "
                          f"{self.stop_grace_s:g} s (RINGTRAIN_STOP_GRACE_S); stopping sshd anyway")
                return
            self._sleep(min(0.2, deadline - time.monotonic()))

    def stop_sshd(self) -> None:
        if self.sshd_status is None:  # not reaped yet, so the pid is still sshd's (running or a zombie)
            os.kill(self.sshd_pid, signal.SIGTERM)
        deadline = time.monotonic() + self.sshd_stop_s
        while self.sshd_status is None and time.monotonic() < deadline:
            self._sleep(min(0.2, deadline - time.monotonic()))
        if self.sshd_status is None:
            self.emit(f"entrypoint: sshd did not exit within {self.sshd_stop_s:g} s; killing it")
            os.kill(self.sshd_pid, signal.SIGKILL)
            _, self.sshd_status = os.waitpid(self.sshd_pid, 0)
        self._reap()


def supervise_sshd(cmd: Sequence[str], env: Mapping[str, str], stop_grace_s: float) -> int:
    return SshdSupervisor(cmd, env, stop_grace_s).run()
