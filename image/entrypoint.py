#!/usr/bin/env python3
"""Entrypoint of the ringtrain images (the `train` and `launcher` targets of image/Dockerfile).

    entrypoint.py selftest                         check the node, exit 0 (all pass) or 1: the MPIJob runs
                                                   it as every worker pod's init container
    entrypoint.py train [--] ARGS                  exec `python -m train ARGS`
    entrypoint.py launcher -- CMD                  exec CMD (the horovodrun command cluster.launch renders)
                                                   on the MPIJob launcher; never a self-test (no GPUs there)
    entrypoint.py sshd                             MPIJob worker: host keys, then run `sshd -D -e` as a
                                                   child, forwarding SIGTERM to the trainer processes

The self-test checks what a training run silently depends on: Horovod was built with what the image
promises (`horovodrun --check-build`), the expected GPUs are visible, the expected EFA devices are
visible and usable by libfabric, and local ranks can allreduce through horovodrun: NCCL on all visible
GPUs when two are visible or EFA is expected, Gloo on two CPU ranks otherwise. When EFA is expected
(RINGTRAIN_EXPECT_EFA >= 1) NCCL must also report that it uses the EFA provider, or the job would run
over TCP sockets at a fraction of the bandwidth and nobody would know.

Environment (all optional):
    RINGTRAIN_EXPECT_GPUS        auto (at least one) | N (at least N; 0 skips the check)   [auto]
    RINGTRAIN_EXPECT_EFA         auto (check devices if present) | N (at least N devices, and NCCL must
                                 use the EFA provider; 0 skips)                             [auto]
    RINGTRAIN_SELFTEST_REQUIRE   what --check-build must list      [PyTorch,Gloo,MPI,NCCL]
    RINGTRAIN_SELFTEST_TIMEOUT   seconds each external check may take                        [180]
    RINGTRAIN_ENV_FILE           NCCL/EFA defaults applied where unset [/etc/ringtrain/nccl-efa.env]
    RINGTRAIN_SSH_DIR            where the MPI Operator mounts the job's keys (sshAuthMountPath) [/root/.ssh]
    RINGTRAIN_STOP_GRACE_S       sshd mode: seconds the trainers get to checkpoint and exit after SIGTERM,
                                 kept below the worker pod's terminationGracePeriodSeconds (120)   [100]

Why sshd mode does not exec sshd: on a spot reclaim the kubelet sends SIGTERM to PID 1 of the worker
pod only, then SIGKILL when the pod's grace period ends. The trainer ranks (`python -m train`, started
by horovodrun over ssh) are sshd's grandchildren and would never hear it; their spot-safe path (stop
at the next step, rank 0 checkpoints, exit 75) needs that SIGTERM. So PID 1 stays this script: it
forwards SIGTERM to every trainer process, waits for them (bounded), then stops sshd, and reaps
orphans meanwhile (PID 1's duty).

Exit codes: 0 success, 1 self-test failed, 2 bad invocation or configuration (one message, no
traceback). This file uses only the standard library, so it runs before anything else is known to work.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path

EXIT_OK = 0
EXIT_SELFTEST_FAILED = 1
EXIT_USAGE = 2

DEFAULT_ENV_FILE = "/etc/ringtrain/nccl-efa.env"
DEFAULT_SSH_DIR = Path("/root/.ssh")          # the MPI Operator's default sshAuthMountPath
DEFAULT_HOST_KEY_DIR = Path("/etc/ssh")
DEFAULT_SYSFS_INFINIBAND = Path("/sys/class/infiniband")
SSHD = "/usr/sbin/sshd"
SSHD_RUN_DIR = Path("/run/sshd")              # sshd's privilege-separation directory
PROC_ROOT = Path("/proc")
# The trainers' time to reach a step boundary, checkpoint and exit once SIGTERM is forwarded. It must end
# before the worker pod's terminationGracePeriodSeconds (cluster/mpijob.py, 120 s: the spot notice),
# leaving SSHD_STOP_S and some slack, or the kubelet's SIGKILL lands mid-checkpoint.
DEFAULT_STOP_GRACE_S = 100.0
SSHD_STOP_S = 5.0                             # sshd's time to exit after SIGTERM, then SIGKILL
TRAINER_MODULE = "train"                      # `python -m train`, what horovodrun starts on workers

# Where each name appears in `horovodrun --check-build` output (MPI and Gloo also appear as tensor
# operations; what the image promises is the controllers).
CHECK_BUILD_SECTIONS = {
    "PyTorch": "Available Frameworks",
    "TensorFlow": "Available Frameworks",
    "MXNet": "Available Frameworks",
    "MPI": "Available Controllers",
    "Gloo": "Available Controllers",
    "NCCL": "Available Tensor Operations",
    "DDL": "Available Tensor Operations",
    "CCL": "Available Tensor Operations",
}
DEFAULT_REQUIRE = ("PyTorch", "Gloo", "MPI", "NCCL")
ALLREDUCE_OK = "RINGTRAIN_ALLREDUCE_OK"
# The old switch that made train/launcher self-test first; refused now (see parse_invocation).
SELFTEST_ENV = "RINGTRAIN_SELFTEST"
# NCCL's log of its network, with NCCL_DEBUG=INFO. The EFA pattern is the one AWS's own health check
# greps after its NCCL allreduce (aws-samples/awsome-distributed-training,
# 4.validation_and_observability/2.gpu-cluster-healthcheck/checks/5-nccl-allreduce.sh:
# `grep -qi "Selected Provider is efa\|Using network EFA"` with NCCL_DEBUG=INFO): aws-ofi-nccl logs
# "NET/OFI Selected provider is efa, fabric is ..." when it loads; NCCL logs "Using network <name>",
# "Socket" when it fell back to TCP.
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
NCCL_USES_EFA = re.compile(r"Selected Provider is efa|Using network EFA", re.IGNORECASE)
NCCL_NETWORK = re.compile(r"Using network (.+?)\s*$", re.MULTILINE)

USAGE = __doc__.split("\n\n")[1]


class UsageError(Exception):
    """Bad invocation or configuration; the message says what is wrong and what is allowed."""


# --------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class Invocation:
    mode: str                  # selftest | train | launcher | sshd | allreduce-worker
    args: tuple[str, ...]      # trainer args (train), command (launcher), worker args


@dataclass(frozen=True)
class Settings:
    expect_gpus: int | None    # None: auto (at least one)
    expect_efa: int | None     # None: auto (check only if devices are present)
    require: tuple[str, ...]
    timeout_s: float


def _expectation(value: str, name: str) -> int | None:
    v = value.strip().lower()
    if v in ("", "auto"):
        return None
    if v.isdigit():
        return int(v)
    raise UsageError(f"{name}={value!r}: use 'auto' or a whole number (0 skips the check)")


def parse_settings(env: Mapping[str, str]) -> Settings:
    require = tuple(
        x.strip() for x in env.get("RINGTRAIN_SELFTEST_REQUIRE", ",".join(DEFAULT_REQUIRE)).split(",")
        if x.strip()
    )
    unknown = [r for r in require if r not in CHECK_BUILD_SECTIONS]
    if unknown:
        allowed = ", ".join(CHECK_BUILD_SECTIONS)
        raise UsageError(f"RINGTRAIN_SELFTEST_REQUIRE names {', '.join(unknown)}; allowed: {allowed}")
    raw_timeout = env.get("RINGTRAIN_SELFTEST_TIMEOUT", "180")
    try:
        timeout_s = float(raw_timeout)
    except ValueError:
        timeout_s = -1.0
    if not 0 < timeout_s <= 3600:
        raise UsageError(f"RINGTRAIN_SELFTEST_TIMEOUT={raw_timeout!r}: use seconds between 1 and 3600")
    return Settings(
        expect_gpus=_expectation(env.get("RINGTRAIN_EXPECT_GPUS", "auto"), "RINGTRAIN_EXPECT_GPUS"),
        expect_efa=_expectation(env.get("RINGTRAIN_EXPECT_EFA", "auto"), "RINGTRAIN_EXPECT_EFA"),
        require=require,
        timeout_s=timeout_s,
    )


def parse_stop_grace(env: Mapping[str, str]) -> float:
    raw = env.get("RINGTRAIN_STOP_GRACE_S", f"{DEFAULT_STOP_GRACE_S:g}")
    try:
        grace_s = float(raw)
    except ValueError:
        grace_s = -1.0
    if not 0 <= grace_s <= 3600:
        raise UsageError(f"RINGTRAIN_STOP_GRACE_S={raw!r}: use seconds between 0 and 3600, below the pod's "
                         "terminationGracePeriodSeconds")
    return grace_s


def parse_invocation(argv: Sequence[str], env: Mapping[str, str]) -> Invocation:
    if not argv:
        raise UsageError("no mode given; use one of: selftest, train, launcher, sshd")
    mode, rest = argv[0], list(argv[1:])
    if mode in ("selftest", "sshd"):
        if rest:
            raise UsageError(f"mode '{mode}' takes no arguments (got {' '.join(rest)})")
        return Invocation(mode, ())
    if mode in ("train", "launcher"):
        # The self-test is a mode of its own, never a prelude: the worker pods run it as their init
        # container; the launcher has no GPU to test (and a test there would only delay every rank).
        if SELFTEST_ENV in env or (rest and rest[0] in ("--selftest", "--no-selftest")):
            raise UsageError(f"mode '{mode}' runs no self-test ({SELFTEST_ENV} and --selftest are gone): run "
                             "`entrypoint.py selftest`, as the MPIJob's worker init container does")
        if rest and rest[0] == "--":
            rest.pop(0)
        if mode == "launcher" and not rest:
            raise UsageError("mode 'launcher' needs the command to run, e.g. launcher -- horovodrun ...")
        return Invocation(mode, tuple(rest))
    if mode == "allreduce-worker":
        if rest not in (["--device", "cpu"], ["--device", "cuda"]):
            raise UsageError("allreduce-worker takes --device cpu|cuda")
        return Invocation(mode, (rest[1],))
    raise UsageError(f"unknown mode {mode!r}; use one of: selftest, train, launcher, sshd")


def parse_env_file(text: str, source: str = "env file") -> dict[str, str]:
    """KEY=VALUE lines; blank lines and '#' comments ignored. Anything else is an error."""
    values: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(\S*)", stripped)
        if not m:
            raise UsageError(f"{source}:{n}: {line!r} is not KEY=VALUE (no spaces, no quotes)")
        if m.group(1) in values:
            raise UsageError(f"{source}:{n}: {m.group(1)} is set twice")
        values[m.group(1)] = m.group(2)
    return values


def apply_env_defaults(env: MutableMapping[str, str], defaults: Mapping[str, str]) -> list[str]:
    """Set each default the environment does not set already (a pod spec or -x wins). Returns the keys set."""
    applied = []
    for key, value in defaults.items():
        if key not in env:
            env[key] = value
            applied.append(key)
    return applied


# --------------------------------------------------------------------------------------------------
# Host facts, behind one seam so tests can point them at fakes


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


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str
    skipped: bool = False

    def line(self) -> str:
        status = "SKIP" if self.skipped else ("PASS" if self.ok else "FAIL")
        return f"selftest: {status} {self.name}: {self.detail}"


# --------------------------------------------------------------------------------------------------
# Checks: pure parsing/decisions first, then the thin functions that gather the facts


def parse_check_build(text: str) -> dict[str, dict[str, bool]]:
    """`horovodrun --check-build` output -> {section: {name: built?}}."""
    sections: dict[str, dict[str, bool]] = {}
    current = None
    for line in text.splitlines():
        header = re.fullmatch(r"\s*(Available [A-Za-z ]+):\s*", line)
        if header:
            current = sections.setdefault(header.group(1), {})
            continue
        item = re.fullmatch(r"\s*\[([ X])\]\s+(\S+)\s*", line)
        if item and current is not None:
            current[item.group(2)] = item.group(1) == "X"
    return sections


def missing_from_build(sections: Mapping[str, Mapping[str, bool]], require: Sequence[str]) -> list[str]:
    return [name for name in require if not sections.get(CHECK_BUILD_SECTIONS[name], {}).get(name, False)]


def count_nvidia_smi_gpus(text: str) -> int:
    """`nvidia-smi -L` prints one 'GPU <n>: <name> (UUID: ...)' line per visible GPU."""
    return sum(1 for line in text.splitlines() if re.match(r"GPU \d+:", line.strip()))


def efa_devices(sysfs_infiniband: Path) -> list[str]:
    """RDMA devices whose kernel driver is efa (their names, e.g. rdmap16s27, do not say so)."""
    if not sysfs_infiniband.is_dir():
        return []
    found = []
    for dev in sorted(sysfs_infiniband.iterdir()):
        driver = dev / "device" / "driver"
        if driver.exists() and driver.resolve().name == "efa":
            found.append(dev.name)
    return found


def fi_info_has_efa(text: str) -> bool:
    return re.search(r"^\s*provider:\s*efa\s*$", text, re.MULTILINE) is not None


def efa_expected(settings: Settings) -> bool:
    """EFA is required (not just checked if present): the pod asked for EFA interfaces."""
    return settings.expect_efa is not None and settings.expect_efa >= 1


def plan_allreduce(gpu_count: int, efa: bool) -> tuple[str, int]:
    """(device, ranks): NCCL wants one GPU per rank, so all visible GPUs each get one; two GPUs, or one
    when EFA must be shown in use (only NCCL can show it), test the NCCL path; otherwise two Gloo ranks on
    CPU. Horovod runs a one-rank GPU allreduce through NCCL too (ncclCommInitRank with size 1:
    horovod/common/ops/nccl_operations.cc NCCLAllreduce::Execute has no single-rank shortcut)."""
    if gpu_count >= 2 or (efa and gpu_count == 1):
        return "cuda", gpu_count
    return "cpu", 2


def nccl_network(text: str) -> str | None:
    """The network NCCL said it uses ("Using network AWS Libfabric", "... Socket"), the last one logged."""
    found = NCCL_NETWORK.findall(text)
    return found[-1] if found else None


def check_nccl_uses_efa(output: str, device: str) -> CheckResult:
    name = "nccl over efa"
    if device != "cuda":
        return CheckResult(name, False, "not run: NCCL needs a visible GPU (see the gpus check)")
    if NCCL_USES_EFA.search(output):
        match = next(line for line in output.splitlines() if NCCL_USES_EFA.search(line))
        start = match.find("NCCL INFO")
        return CheckResult(name, True, match[max(start, 0):].strip()[:200])
    network = nccl_network(output)
    said = f"NCCL used network {network!r}" if network else "NCCL logged no network (did it start?)"
    return CheckResult(name, False, f"{said}, not the EFA provider: the job would run over TCP. Check that "
                       "NCCL_NET_PLUGIN=ofi, /opt/amazon/ofi-nccl/lib is on LD_LIBRARY_PATH and the pod "
                       "requests vpc.amazonaws.com/efa")


def check_horovod_build(host: Host, settings: Settings) -> CheckResult:
    name = "horovod check-build"
    horovodrun = host.which("horovodrun")
    if not horovodrun:
        return CheckResult(name, False, "horovodrun is not installed (not on PATH)")
    res = host.run([horovodrun, "--check-build"], settings.timeout_s)
    if res.rc != 0:
        return CheckResult(name, False, f"horovodrun --check-build exited {res.rc}: {res.out.strip()[-300:]}")
    missing = missing_from_build(parse_check_build(res.out), settings.require)
    if missing:
        return CheckResult(name, False, f"Horovod was built without {', '.join(missing)}")
    return CheckResult(name, True, "built with " + ", ".join(settings.require))


def visible_gpus(host: Host, timeout_s: float) -> tuple[int, str]:
    smi = host.which("nvidia-smi")
    if smi:
        res = host.run([smi, "-L"], timeout_s)
        if res.rc == 0:
            return count_nvidia_smi_gpus(res.out), "nvidia-smi"
    res = host.run([host.python, "-c", "import torch; print(torch.cuda.device_count())"], timeout_s)
    if res.rc == 0 and res.out.strip().splitlines() and res.out.strip().splitlines()[-1].isdigit():
        return int(res.out.strip().splitlines()[-1]), "torch.cuda"
    return 0, "no nvidia-smi and torch.cuda unavailable"


def check_gpus(count: int, source: str, expect: int | None) -> CheckResult:
    name = "gpus"
    if expect == 0:
        return CheckResult(name, True, "not expected (RINGTRAIN_EXPECT_GPUS=0)", skipped=True)
    need = 1 if expect is None else expect
    ok = count >= need
    return CheckResult(name, ok, f"{count} visible ({source}), need at least {need}")


def check_efa(host: Host, settings: Settings) -> CheckResult:
    name = "efa"
    if settings.expect_efa == 0:
        return CheckResult(name, True, "not expected (RINGTRAIN_EXPECT_EFA=0)", skipped=True)
    devices = efa_devices(host.sysfs_infiniband)
    if settings.expect_efa is None and not devices:
        detail = f"no EFA devices in {host.sysfs_infiniband}; none expected"
        return CheckResult(name, True, detail, skipped=True)
    need = 1 if settings.expect_efa is None else settings.expect_efa
    if len(devices) < need:
        return CheckResult(name, False, f"{len(devices)} EFA devices in {host.sysfs_infiniband}, need {need}"
                           " (does the pod request vpc.amazonaws.com/efa?)")
    fi_info = host.which("fi_info")
    if not fi_info:
        return CheckResult(name, False, f"{len(devices)} EFA devices but fi_info is not installed")
    res = host.run([fi_info, "-p", "efa", "-t", "FI_EP_RDM"], settings.timeout_s)
    if res.rc != 0 or not fi_info_has_efa(res.out):
        tail = res.out.strip()[-300:]
        detail = f"{len(devices)} EFA devices but libfabric's efa provider is not usable: {tail}"
        return CheckResult(name, False, detail)
    listed = ", ".join(devices)
    return CheckResult(name, True, f"{len(devices)} EFA devices ({listed}), libfabric efa provider ok")


def parse_allreduce_ranks(text: str) -> set[int]:
    return {int(m.group(1)) for m in re.finditer(ALLREDUCE_OK + r" rank=(\d+)", text)}


def check_allreduce(host: Host, settings: Settings, device: str, ranks: int = 2) -> tuple[CheckResult, str]:
    """The allreduce through horovodrun, and its whole output (NCCL's log lines included on GPUs)."""
    name = f"allreduce ({ranks} ranks, {'NCCL on GPU' if device == 'cuda' else 'Gloo on CPU'})"
    horovodrun = host.which("horovodrun")
    if not horovodrun:
        return CheckResult(name, False, "horovodrun is not installed (not on PATH)"), ""
    cmd = [horovodrun, "--gloo", "-np", str(ranks), "-H", f"localhost:{ranks}",
           host.python, str(Path(__file__).resolve()), "allreduce-worker", "--device", device]
    res = host.run(cmd, settings.timeout_s, NCCL_DEBUG_ENV if device == "cuda" else None)
    done = parse_allreduce_ranks(res.out)
    if res.rc == 0 and done == set(range(ranks)):
        return CheckResult(name, True, f"all {ranks} ranks got the expected sum"), res.out
    detail = f"exit {res.rc}, ranks ok: {sorted(done)}; output: {res.out.strip()[-500:]}"
    return CheckResult(name, False, detail), res.out


def run_selftest(host: Host, settings: Settings, emit: Callable[[str], None] = print) -> bool:
    results = []

    def record(r: CheckResult) -> CheckResult:
        emit(r.line())
        results.append(r)
        return r

    build = record(check_horovod_build(host, settings))
    gpu_count, source = visible_gpus(host, settings.timeout_s) if settings.expect_gpus != 0 else (0, "")
    record(check_gpus(gpu_count, source, settings.expect_gpus))
    record(check_efa(host, settings))
    efa = efa_expected(settings)
    device, ranks = plan_allreduce(gpu_count, efa)
    output = ""
    if build.ok:
        allreduce, output = check_allreduce(host, settings, device, ranks)
        record(allreduce)
    else:
        record(CheckResult("allreduce", False, "not run: Horovod's build check failed"))
    if efa:
        record(check_nccl_uses_efa(output, device) if build.ok
               else CheckResult("nccl over efa", False, "not run: Horovod's build check failed"))
    ok = all(r.ok for r in results)
    emit(f"selftest: {'passed' if ok else 'FAILED'} ({sum(r.ok for r in results)}/{len(results)} ok)")
    return ok


# --------------------------------------------------------------------------------------------------
# Hand-over


def handover_command(inv: Invocation, python: str = sys.executable, sshd: str = SSHD) -> list[str]:
    if inv.mode == "train":
        return [python, "-m", "train", *inv.args]
    if inv.mode == "launcher":
        return list(inv.args)
    if inv.mode == "sshd":
        # -D: stay in the foreground (the entrypoint supervises it as a child); -e: log to stderr.
        return [sshd, "-D", "-e"]
    raise ValueError(f"mode {inv.mode!r} hands over to nothing")


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


# --------------------------------------------------------------------------------------------------
# sshd mode: sshd as a child, SIGTERM forwarded to the trainers (see the module docstring for why)


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


def allreduce_worker(device: str) -> int:
    """One rank of the self-test's allreduce: rank r contributes r+1; every rank must see the sum."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    if device == "cuda":
        torch.cuda.set_device(hvd.local_rank())
    t = torch.full((1024,), float(hvd.rank() + 1), device=device)
    total = hvd.allreduce(t, op=hvd.Sum)
    expected = hvd.size() * (hvd.size() + 1) / 2
    if torch.allclose(total.cpu(), torch.full((1024,), expected)):
        print(f"{ALLREDUCE_OK} rank={hvd.rank()} size={hvd.size()} device={device}", flush=True)
        return EXIT_OK
    print(f"allreduce mismatch on rank {hvd.rank()}: got {total[0].item()}, expected {expected}", flush=True)
    return EXIT_SELFTEST_FAILED


def main(
    argv: Sequence[str] | None = None,
    env: MutableMapping[str, str] | None = None,
    exec_fn: Callable[[list[str], Mapping[str, str]], None] | None = None,
    host: Host | None = None,
    supervise_fn: Callable[[list[str], Mapping[str, str], float], int] | None = None,
) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    if argv and argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return EXIT_OK
    try:
        env_file = Path(env.get("RINGTRAIN_ENV_FILE", DEFAULT_ENV_FILE))
        if env_file.is_file():
            apply_env_defaults(env, parse_env_file(env_file.read_text(), str(env_file)))
        inv = parse_invocation(argv, env)
        if inv.mode == "allreduce-worker":
            return allreduce_worker(inv.args[0])
        host = host or Host(env=env)
        if inv.mode == "sshd":
            stop_grace_s = parse_stop_grace(env)
            ssh_dir = Path(env.get("RINGTRAIN_SSH_DIR", str(DEFAULT_SSH_DIR)))
            for note in prepare_sshd(ssh_dir, DEFAULT_HOST_KEY_DIR, SSHD_RUN_DIR, host):
                print(f"entrypoint: {note}", flush=True)
        if inv.mode == "selftest":
            ok = run_selftest(host, parse_settings(env), emit=lambda s: print(s, flush=True))
            return EXIT_OK if ok else EXIT_SELFTEST_FAILED
        cmd = handover_command(inv, python=host.python, sshd=SSHD)
    except UsageError as e:
        print(f"entrypoint: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.flush()
    sys.stderr.flush()
    if inv.mode == "sshd":
        # Not exec: this process must stay PID 1 to hear the pod's SIGTERM and pass it to the trainers.
        return (supervise_fn or supervise_sshd)(cmd, env, stop_grace_s)
    (exec_fn or _exec)(cmd, env)
    return EXIT_OK  # only reached with a non-exec exec_fn (tests)


def _exec(cmd: list[str], env: Mapping[str, str]) -> None:
    try:
        os.execvpe(cmd[0], cmd, dict(env))
    except OSError as e:
        print(f"entrypoint: error: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    sys.exit(main())
