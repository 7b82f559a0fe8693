"""Render a JobSpec into a `horovodrun` command line (the MPIJob launcher's, cluster/mpijob.py)."""

from __future__ import annotations

from collections.abc import Sequence

from cluster.job import JobSpec
from train.config import to_argv

# Seconds horovodrun may take to ssh into every host and start the workers (Horovod's default 30 is
# tight on a busy machine where every worker imports torch).
START_TIMEOUT_S = 120
# Elastic: how long horovodrun waits for at least --min-np slots, at the start and after losing hosts.
# On EKS an elastic launcher starts at once (launcherCreationPolicy AtStartup) and the operator lists a
# worker only once its pod is Running, i.e. after the image pull: minutes on a fresh node.
ELASTIC_TIMEOUT_S = 600
# Elastic: a host that failed is blacklisted; it may come back after this many seconds (a restored local
# host keeps its name). The local executor's: its hosts leave discovery before their workers are stopped.
# On EKS a draining pod stays in discovery through its grace period (cluster/mpijob.py
# EKS_BLACKLIST_COOLDOWN_S).
BLACKLIST_COOLDOWN_S = (2, 5)


def horovodrun_command(
    job: JobSpec,
    *,
    hosts: Sequence[str] | None = None,
    hostfile: str | None = None,
    discovery_script: str | None = None,
    network_interface: str | None = None,
    python: str = "python",
    blacklist_cooldown_s: tuple[int, int] = BLACKLIST_COOLDOWN_S,
) -> list[str]:
    """The launcher's command.

    Static jobs name their hosts, in a `host slots=N` file (`hostfile`, the MPI Operator's format) or
    as a list (`hosts`, each "name" or "name:slots"); elastic jobs name a discovery script that prints
    the live hosts, which is how Horovod learns that a spot node went away or came back, and start
    with the fewest processes they may run with (`-np` = `--min-np`: with short spot capacity waiting
    for all of them would time out instead of starting). Gloo is the controller in both cases: elastic
    mode requires it, and it needs no MPI on the launcher.
    """
    cmd = ["horovodrun", "--gloo"]
    if job.elastic:
        if not discovery_script:
            raise ValueError("an elastic job needs a host discovery script")
        cmd += [
            "-np", str(job.min_procs),
            "--min-np", str(job.min_procs),
            "--max-np", str(job.num_procs),
            "--host-discovery-script", discovery_script,
            "--slots-per-host", str(job.slots_per_host),
            "--elastic-timeout", str(ELASTIC_TIMEOUT_S),
            "--blacklist-cooldown-range", *map(str, blacklist_cooldown_s),
        ]
    elif hostfile and not hosts:
        cmd += ["-np", str(job.num_procs), "--hostfile", hostfile]
    elif hosts and not hostfile:
        spec = [h if ":" in h else f"{h}:{job.slots_per_host}" for h in hosts]
        cmd += ["-np", str(job.num_procs), "-H", ",".join(spec)]
    else:
        raise ValueError("a static job needs either its hostfile or its host list")
    if network_interface:
        cmd += ["--network-interfaces", network_interface]
    # The launcher is fresh for every job: Horovod's ~/.horovod check cache could only be stale.
    cmd += ["--start-timeout", str(START_TIMEOUT_S), "--disable-cache"]
    cmd += [python, "-m", "train", *to_argv(job.trainer)]
    return cmd
