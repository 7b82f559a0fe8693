"""What a job survives, on the local backend: each fault `ringtrain run --fault` injects, through the flow
that command runs (cluster/flow.py run_job), on one cluster kept up across the cases.

- kill: a worker SIGKILLed mid-run -> restarted from the newest checkpoint, done.
- hang: a worker SIGSTOPped -> the other rank's watchdog ends it (exit 76), restarted, done.
- late reclaim: the host reclaimed once the last step is reached -> done, not FAILED.
- slow-link: a host's link capped by tc tbf -> the preflight fails the job fast, naming the hosts; in an
  elastic job of three hosts, the slow one is kept out and the job runs on the other two.
"""

from __future__ import annotations

import time

import pytest

from cluster.flow import DatasetSpec, FlowOptions, run_job
from cluster.job import JobSpec, trainer_config
from cluster.local import network
from cluster.local.backend import LocalBackend
from train.contract import EXIT_HUNG, EXIT_PREFLIGHT_FAILED, FAULT_STEP_SLEEP_ENV

pytestmark = pytest.mark.slow

PACING = {FAULT_STEP_SLEEP_ENV: "0.1"}
ARGS = ("--steps", "40", "--checkpoint-every", "10", "--batch-size", "32", "--log-every", "2")


@pytest.fixture(scope="module")
def cluster():
    import importlib.util

    if importlib.util.find_spec("horovod.torch") is None:
        pytest.skip("needs Horovod: run scripts/setup")
    backend = LocalBackend(2, reclaim_grace_s=10, log=print)
    backend.up()
    try:
        yield backend
    finally:
        backend.down()


def _run(backend, name, fault, at_step, *extra, steps=None):
    for host in backend.host_names():     # each case starts with every host up and clean
        backend.restore(host)
    args = ARGS if steps is None else (*ARGS[:1], str(steps), *ARGS[2:])
    job = JobSpec(name=name, num_hosts=2, env=PACING, trainer=trainer_config((*args, *extra)))
    opts = FlowOptions(dataset=DatasetSpec(shards=2, samples_per_shard=256), reclaim_at_step=at_step,
                       fault=fault, progress_bar=False, keep_up=True, job_timeout_s=400)
    lines: list[str] = []
    result = run_job(backend, job, opts, out=lambda s: (lines.append(s), print(s)))
    lines += [f"attempt {i}: exit {a.exit_code}: {a.message}" for i, a in enumerate(result.attempts, 1)]
    return result, "\n".join(lines)


def test_a_worker_killed_hard_restarts_from_the_last_checkpoint(cluster):
    result, out = _run(cluster, "faultkill", "kill", 15)
    assert result.succeeded and result.exit_code == 0, out
    assert len(result.attempts) == 2, out
    first, second = result.attempts
    assert first.exit_code not in (0, 2, 75) and "restarting from the newest verified checkpoint" in out
    assert second.summary.resumed_from_step in (10, 20) and second.summary.steps == 40
    assert first.cost is not None and first.cost.resumed_from == second.summary.resumed_from_step
    assert first.cost.steps_lost == first.cost.reached_step - first.cost.resumed_from >= 0


def test_a_hung_worker_is_found_by_the_watchdog_and_the_job_restarts(cluster):
    t0 = time.monotonic()
    result, out = _run(cluster, "faulthang", "hang", 15, "--hang-timeout", "8")
    assert result.succeeded and result.exit_code == 0, out
    assert result.attempts[0].exit_code == EXIT_HUNG, out
    assert "hung (the watchdog ended it): restarting" in out
    assert result.attempts[1].summary.resumed_from_step in (10, 20)
    assert time.monotonic() - t0 < 300   # not Gloo's own minutes-long timeout, nor a hang


def test_a_reclaim_after_the_last_step_leaves_the_job_done(cluster):
    result, out = _run(cluster, "faultlate", "reclaim", 40)
    assert result.succeeded and result.exit_code == 0, out
    assert len(result.attempts) == 1, out
    assert result.reclaimed == ["host-1"]


def test_a_slow_link_fails_the_job_fast_naming_its_hosts(cluster):
    ok, why = network.namespaces_available()
    if not ok:
        pytest.skip(f"a slow link needs network-namespace hosts: {why}")
    t0 = time.monotonic()
    result, out = _run(cluster, "faultslow", "slow-link", 0)
    assert not result.succeeded and result.exit_code == EXIT_PREFLIGHT_FAILED, out
    assert len(result.attempts) == 1                      # never retried on the same nodes
    assert "preflight" in result.message and "BELOW THE FLOOR" in result.message, result.message
    assert "faultslow-worker-0 and faultslow-worker-1" in result.message   # two hosts: both ends
    assert time.monotonic() - t0 < 180


def test_an_elastic_jobs_slow_host_is_kept_out_and_the_job_runs_on_the_rest():
    """Three hosts, host-2's link slow from the start: the elastic job's preflight (a static job of its
    own, cluster/preflight_gate.py) names host-2's worker, and the elastic job runs on the other two."""
    import importlib.util

    if importlib.util.find_spec("horovod.torch") is None:
        pytest.skip("needs Horovod: run scripts/setup")
    ok, why = network.namespaces_available()
    if not ok:
        pytest.skip(f"a slow link needs network-namespace hosts: {why}")
    backend = LocalBackend(3, log=print)
    job = JobSpec(name="faultgate", num_hosts=3, elastic=True, min_hosts=2, env=PACING,
                  trainer=trainer_config(("--steps", "20", *ARGS[2:])))
    opts = FlowOptions(dataset=DatasetSpec(shards=3, samples_per_shard=128), reclaim_at_step=0,
                       fault="slow-link", progress_bar=False, job_timeout_s=400)
    lines: list[str] = []
    result = run_job(backend, job, opts, out=lambda s: (lines.append(s), print(s)))
    out = "\n".join(lines)
    assert result.succeeded and result.exit_code == 0, out
    assert result.preflight is not None and result.preflight.exit_code == EXIT_PREFLIGHT_FAILED, out
    assert "preflight: below the floor (allreduce busbw" in out
    assert "slow: host-2 (faultgate-worker-2); excluded: the elastic job runs on the other 2 host(s)" in out
    (attempt,) = result.attempts
    assert attempt.summary.steps == 20 and attempt.summary.world_size == 2, out
