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
    RINGTRAIN_NETWORK            efa | socket | auto: which network section of that file applies in the
                                 worker modes (selftest, train, sshd); the MPIJob sets it from the node
                                 group; auto: efa if the node shows EFA devices. The launcher applies the
                                 common section only                                               [auto]
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
traceback). This script dispatches; the jobs live in the package beside it, ringtrain_entry/ (settings,
host, selftest, supervisor), which the image copies next to it. Standard library only, so it runs before
anything else is known to work.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path

# The package beside this file is importable however the file is started: as a script (the image's
# ENTRYPOINT, the local executor) its directory is sys.path[0] already; loaded by path (tests) it is not.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.append(_HERE)

from ringtrain_entry.host import Host  # noqa: E402
from ringtrain_entry.selftest import allreduce_worker, efa_devices, run_selftest  # noqa: E402
from ringtrain_entry.settings import (  # noqa: E402
    DEFAULT_ENV_FILE,
    ETC_ENVIRONMENT,
    EXIT_OK,
    EXIT_SELFTEST_FAILED,
    EXIT_USAGE,
    NETWORKS,
    Invocation,
    UsageError,
    apply_env_defaults,
    environment_with_network,
    network_defaults,
    parse_env_file,
    parse_invocation,
    parse_settings,
    parse_stop_grace,
    resolve_network,
)
from ringtrain_entry.supervisor import (  # noqa: E402
    DEFAULT_HOST_KEY_DIR,
    DEFAULT_SSH_DIR,
    SSHD,
    SSHD_RUN_DIR,
    prepare_sshd,
    supervise_sshd,
)

USAGE = __doc__.split("\n\n")[1]
# The modes that run on a worker node and so use its network section (see RINGTRAIN_NETWORK).
WORKER_MODES = ("selftest", "train", "sshd")


def handover_command(inv: Invocation, python: str = sys.executable, sshd: str = SSHD) -> list[str]:
    if inv.mode == "train":
        return [python, "-m", "train", *inv.args]
    if inv.mode == "launcher":
        return list(inv.args)
    if inv.mode == "sshd":
        # -D: stay in the foreground (the entrypoint supervises it as a child); -e: log to stderr.
        return [sshd, "-D", "-e"]
    raise ValueError(f"mode {inv.mode!r} hands over to nothing")



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
        inv = parse_invocation(argv, env)
        host = host or Host(env=env)
        network = resolve_network(env, len(efa_devices(host.sysfs_infiniband))) if inv.mode in WORKER_MODES \
            else None
        env_file = Path(env.get("RINGTRAIN_ENV_FILE", DEFAULT_ENV_FILE))
        sections = parse_env_file(env_file.read_text(), str(env_file)) if env_file.is_file() else None
        if sections:
            apply_env_defaults(env, network_defaults(sections, network))
            if inv.mode in ("selftest", "sshd"):  # their logs; train's stdout is the trainer's
                chosen = " ".join(f"{k}={env[k]}" for k in sections[network])
                print(f"entrypoint: network {network}: {chosen}", flush=True)
        if inv.mode == "allreduce-worker":
            return allreduce_worker(inv.args[0])
        if inv.mode == "sshd":
            stop_grace_s = parse_stop_grace(env)
            ssh_dir = Path(env.get("RINGTRAIN_SSH_DIR", str(DEFAULT_SSH_DIR)))
            for note in prepare_sshd(ssh_dir, DEFAULT_HOST_KEY_DIR, SSHD_RUN_DIR, host):
                print(f"entrypoint: {note}", flush=True)
            if sections and network:
                write_session_environment(Path(ETC_ENVIRONMENT_PATH), sections, network, env)
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


# Where sshd's sessions (the trainer ranks) read their environment from (a module attribute: tests move it).
ETC_ENVIRONMENT_PATH = ETC_ENVIRONMENT


def write_session_environment(path: Path, sections: Mapping[str, Mapping[str, str]], network: str,
                              env: Mapping[str, str]) -> None:
    """Put this worker's network settings (as resolved in `env`: a pod's own value wins) into the file
    sshd's sessions read, replacing any network lines written before."""
    network_keys = {k for n in NETWORKS for k in sections[n]}
    current = path.read_text() if path.is_file() else ""
    path.write_text(environment_with_network(current, {k: env[k] for k in sections[network]}, network_keys))


def _exec(cmd: list[str], env: Mapping[str, str]) -> None:
    try:
        os.execvpe(cmd[0], cmd, dict(env))
    except OSError as e:
        print(f"entrypoint: error: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    sys.exit(main())
