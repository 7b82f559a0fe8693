"""Before an elastic job: its preflight as a short static job, and the slow nodes kept out of it.

An elastic job cannot run the preflight itself: a worker that joins it later starts from the top too,
and its collectives would meet no others (train/run.py preflight()). So the flow first runs the same
job as a static one with `--preflight-only` (the trainer measures the allreduce busbw across every
worker, records it and exits: train/preflight.py), and then, from that record:

- passed (or no floor set): the elastic job runs as it is;
- below the floor, with slow hosts named: the nodes those workers ran on are excluded from the elastic
  job (JobSpec.exclude_nodes, a required node affinity the scheduler honours, cluster/mpijob.py), if
  the other nodes still make its --min-hosts;
- otherwise (no single host to blame, or too few left): the job fails fast with exit 69, as a static
  job whose preflight fails does.

The functions here are pure; cluster/flow.py runs the job and acts on what they decide.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cluster.job import JobSpec
from train.contract import EXIT_PREFLIGHT_FAILED


def needs_gate(job: JobSpec) -> bool:
    """An elastic job of two or more hosts whose preflight is on."""
    return job.elastic and job.num_hosts > 1 and job.trainer.health.preflight


def preflight_job(job: JobSpec) -> JobSpec:
    """The elastic `job` as the static job that only runs its preflight: same name, hosts and trainer."""
    cfg = job.trainer
    cfg = dataclasses.replace(cfg, health=dataclasses.replace(cfg.health, preflight_only=True),
                              horovod=dataclasses.replace(cfg.horovod, elastic=False))
    return dataclasses.replace(job, elastic=False, min_hosts=None, trainer=cfg)


@dataclass(frozen=True)
class GateDecision:
    exclude_nodes: tuple[str, ...] = ()
    failure: str = ""          # why the job must not run (it fails with exit 69); "" when it may
    note: str = ""             # what was decided, for the flow's output and the summary

    @property
    def passed(self) -> bool:
        return not self.failure


def decide_gate(exit_code: int | None, record: Mapping | None, pod_nodes: Mapping[str, str],
                job: JobSpec) -> GateDecision:
    """What the elastic `job` does after its preflight job ended with `exit_code` and wrote `record`
    (train/preflight.py PreflightResult.record; None: none written); `pod_nodes`: each worker pod's
    node in that job."""
    if exit_code == 0:
        return GateDecision(note="passed")
    if exit_code != EXIT_PREFLIGHT_FAILED or record is None:
        return GateDecision(failure=f"its job ended with exit code {exit_code} before it measured the links")
    slow = list(record.get("slow_hosts") or [])
    figure = f"allreduce busbw {record.get('busbw_gbps')} GB/s, floor {record.get('floor_gbps')} GB/s"
    if not slow:
        return GateDecision(failure=f"below the floor ({figure}) with no single host to blame (every pair "
                                    "of hosts is slow): not run")
    unknown = [pod for pod in slow if pod not in pod_nodes]
    if unknown:
        return GateDecision(failure=f"below the floor ({figure}); slow: {', '.join(slow)}, but the node of "
                                    f"{', '.join(unknown)} is not known: not run")
    nodes = tuple(sorted({pod_nodes[pod] for pod in slow}))
    left, needed = job.num_hosts - len(nodes), job.min_hosts or 1
    named = ", ".join(f"{pod_nodes[pod]} ({pod})" for pod in slow)
    if left < needed:
        return GateDecision(failure=f"below the floor ({figure}); slow: {named}; the {left} other host(s) "
                                    f"are fewer than the job's minimum of {needed}: not run")
    note = f"below the floor ({figure}); slow: {named}; excluded: the elastic job runs on the "
    return GateDecision(exclude_nodes=nodes, note=note + f"other {left} host(s)")


def preflight_record(metrics: Sequence[Mapping]) -> dict | None:
    """The last preflight record in a job's metrics, if any."""
    found = [m["preflight"] for m in metrics if isinstance(m.get("preflight"), dict)]
    return dict(found[-1]) if found else None
