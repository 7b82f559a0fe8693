"""The entrypoint's invocation and settings: argv and the environment, parsed; bad ones refused with
one message naming what is wrong and what is allowed (UsageError, exit 2)."""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

EXIT_OK = 0
EXIT_SELFTEST_FAILED = 1
EXIT_USAGE = 2

DEFAULT_ENV_FILE = "/etc/ringtrain/nccl-efa.env"
# The trainers' time to reach a step boundary, checkpoint and exit once SIGTERM is forwarded. It must end
# before the worker pod's terminationGracePeriodSeconds (cluster/mpijob.py, 120 s: the spot notice),
# leaving supervisor.SSHD_STOP_S and some slack, or the kubelet's SIGKILL lands mid-checkpoint.
DEFAULT_STOP_GRACE_S = 100.0

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
# The old switch that made train/launcher self-test first; refused now (see parse_invocation).
SELFTEST_ENV = "RINGTRAIN_SELFTEST"


class UsageError(Exception):
    """Bad invocation or configuration; the message says what is wrong and what is allowed."""


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


def efa_expected(settings: Settings) -> bool:
    """EFA is required (not just checked if present): the pod asked for EFA interfaces."""
    return settings.expect_efa is not None and settings.expect_efa >= 1
