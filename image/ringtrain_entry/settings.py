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
# The env file's sections: `common` applies everywhere; exactly one network section applies on a worker,
# chosen by RINGTRAIN_NETWORK, which cluster/mpijob.py sets on the worker pods from the node group (efa
# where the group has EFA interfaces, socket elsewhere); unset or `auto`, the node's EFA devices decide.
COMMON_SECTION = "common"
NETWORK_ENV = "RINGTRAIN_NETWORK"
NETWORKS = ("efa", "socket")
# sshd mode writes the chosen network section here: the trainer ranks are ssh sessions, whose environment
# is PAM's (pam_env reads /etc/environment) plus what horovodrun exports from the launcher, which carries
# the common section only (the launcher cannot see the workers' network).
ETC_ENVIRONMENT = "/etc/environment"

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
    """The trainers' time to reach a step boundary, checkpoint and exit once SIGTERM is forwarded
    (RINGTRAIN_STOP_GRACE_S): its default and its one allowed range are the trainer's contract, so it
    ends inside the worker pod's terminationGracePeriodSeconds with supervisor.SSHD_STOP_S to spare."""
    # Imported here: sshd mode runs only in the worker image, which carries train/; the launcher
    # image, which runs this package too, does not.
    from train.contract import stop_grace_s

    try:
        return stop_grace_s(env)
    except ValueError as e:
        raise UsageError(str(e)) from None


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


def parse_env_file(text: str, source: str = "env file") -> dict[str, dict[str, str]]:
    """`[section]` headers, each followed by KEY=VALUE lines; blank lines and '#' comments ignored.
    Returns {section: {key: value}}. The sections must be `common` and one per network (NETWORKS), and a
    network section may not repeat a common key. Anything else is an error."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    allowed = (COMMON_SECTION, *NETWORKS)
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        header = re.fullmatch(r"\[([a-z]+)\]", stripped)
        if header:
            if header.group(1) not in allowed or header.group(1) in sections:
                raise UsageError(f"{source}:{n}: section [{header.group(1)}]: each of "
                                 f"{', '.join(allowed)} once")
            current = sections.setdefault(header.group(1), {})
            continue
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(\S*)", stripped)
        if not m:
            raise UsageError(f"{source}:{n}: {line!r} is not KEY=VALUE (no spaces, no quotes)")
        if current is None:
            raise UsageError(f"{source}:{n}: {m.group(1)} comes before any [section] header")
        if m.group(1) in current:
            raise UsageError(f"{source}:{n}: {m.group(1)} is set twice")
        current[m.group(1)] = m.group(2)
    missing = [s for s in allowed if s not in sections]
    if missing:
        raise UsageError(f"{source}: no section {', '.join(f'[{s}]' for s in missing)}; it needs "
                         f"{', '.join(f'[{s}]' for s in allowed)}")
    for network in NETWORKS:
        both = sorted(set(sections[network]) & set(sections[COMMON_SECTION]))
        if both:
            raise UsageError(f"{source}: {', '.join(both)} in both [{COMMON_SECTION}] and [{network}]")
    return sections


def resolve_network(env: Mapping[str, str], efa_device_count: int) -> str:
    """The network a worker's NCCL uses: RINGTRAIN_NETWORK (the node group's, set by the MPIJob), or with it
    unset or `auto`, efa when the node shows EFA devices and socket otherwise."""
    raw = env.get(NETWORK_ENV, "auto").strip().lower()
    if raw == "auto":
        return NETWORKS[0] if efa_device_count else NETWORKS[1]
    if raw not in NETWORKS:
        raise UsageError(f"{NETWORK_ENV}={env[NETWORK_ENV]!r}: use {', '.join(NETWORKS)} or auto (the node's "
                         "EFA devices decide)")
    return raw


def network_defaults(sections: Mapping[str, Mapping[str, str]], network: str | None) -> dict[str, str]:
    """The common section, plus the network's own (None: common only, as on the launcher)."""
    return {**sections[COMMON_SECTION], **(sections[network] if network else {})}


def environment_with_network(current: str, values: Mapping[str, str], network_keys: set[str]) -> str:
    """/etc/environment's text with every network-section key replaced by `values` (idempotent: a restarted
    container rewrites the same lines)."""
    kept = [line for line in current.splitlines()
            if line.split("=", 1)[0].strip() not in network_keys or "=" not in line]
    return "\n".join([*kept, *(f"{k}={v}" for k, v in values.items())]) + "\n"


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
