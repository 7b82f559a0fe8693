"""Render a JobSpec into the `horovodrun` command line both backends run."""

from __future__ import annotations

from collections.abc import Sequence

from cluster.job import JobSpec


def horovodrun_command(
    job: JobSpec,
    *,
    hosts: Sequence[str] | None = None,
    discovery_script: str | None = None,
    python: str = "python",
    extra_horovodrun_args: Sequence[str] = (),
) -> list[str]:
    """The launcher's command.

    Static jobs name their hosts (`hosts`, each "name" or "name:slots"); elastic jobs name a
    discovery script that prints the live hosts, which is how Horovod learns that a spot node went
    away or came back. Gloo is the controller in both cases: elastic mode requires it, and it needs
    no MPI on the launcher.
    """
    cmd = ["horovodrun", "--gloo", "-np", str(job.num_procs)]
    if job.elastic:
        if not discovery_script:
            raise ValueError("an elastic job needs a host discovery script")
        cmd += [
            "--min-np",
            str(job.min_procs),
            "--max-np",
            str(job.num_procs),
            "--host-discovery-script",
            discovery_script,
            "--slots-per-host",
            str(job.slots_per_host),
        ]
    else:
        if not hosts:
            raise ValueError("a static job needs its host list")
        spec = [h if ":" in h else f"{h}:{job.slots_per_host}" for h in hosts]
        cmd += ["-H", ",".join(spec)]
    cmd += list(extra_horovodrun_args)
    cmd += [python, "-m", "train", *job.trainer_args]
    return cmd
