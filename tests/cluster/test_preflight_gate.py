"""An elastic job's preflight, run first as a static job (cluster/preflight_gate.py): the pure decisions.
The flow runs it on both backends: tests/cluster/test_faults.py (local, a real slow link) and
tests/cluster/test_capacity.py (AWS, through the kubectl stand-in)."""

from __future__ import annotations

import pytest

from cluster.job import JobSpec, trainer_config
from cluster.preflight_gate import decide_gate, needs_gate, preflight_job, preflight_record
from train.contract import EXIT_PREFLIGHT_FAILED

JOB = JobSpec(name="el", num_hosts=3, elastic=True, min_hosts=2, trainer=trainer_config(("--steps", "40")))
NODES = {"el-worker-0": "host-0", "el-worker-1": "host-1", "el-worker-2": "host-2"}


def record(*slow: str, passed: bool = False) -> dict:
    return {"busbw_gbps": 0.0012, "floor_gbps": 0.005, "ranks": 3, "passed": passed, "slow_hosts": list(slow)}


def test_only_an_elastic_job_of_several_hosts_with_its_preflight_on_gets_one():
    assert needs_gate(JOB)
    assert not needs_gate(JobSpec(name="s", num_hosts=3))
    assert not needs_gate(JobSpec(name="e", num_hosts=1, elastic=True))
    off = trainer_config(["--no-preflight"])
    assert not needs_gate(JobSpec(name="e", num_hosts=3, elastic=True, trainer=off))


def test_the_preflight_job_is_the_same_job_static_and_preflight_only():
    pre = preflight_job(JOB)
    assert (pre.name, pre.num_hosts, pre.elastic, pre.min_hosts) == ("el", 3, False, None)
    assert pre.trainer.health.preflight_only and not pre.trainer.horovod.elastic
    assert pre.trainer.steps == JOB.trainer.steps and not JOB.trainer.health.preflight_only


def test_a_passed_preflight_leaves_the_job_as_it_is():
    d = decide_gate(0, record(passed=True), NODES, JOB)
    assert d.passed and d.exclude_nodes == () and d.note == "passed"


def test_the_slow_hosts_node_is_excluded_while_the_rest_make_the_minimum():
    d = decide_gate(EXIT_PREFLIGHT_FAILED, record("el-worker-2"), NODES, JOB)
    assert d.passed and d.exclude_nodes == ("host-2",)
    assert "slow: host-2 (el-worker-2); excluded: the elastic job runs on the other 2 host(s)" in d.note


@pytest.mark.parametrize(("slow", "says"), [
    (("el-worker-0", "el-worker-1"), "the 1 other host(s) are fewer than the job's minimum of 2"),
    ((), "with no single host to blame (every pair of hosts is slow)"),
    (("el-worker-7",), "the node of el-worker-7 is not known"),
])
def test_otherwise_the_job_fails_fast_saying_why(slow, says):
    d = decide_gate(EXIT_PREFLIGHT_FAILED, record(*slow), NODES, JOB)
    assert not d.passed and says in d.failure and d.exclude_nodes == ()


def test_a_preflight_job_that_failed_before_measuring_fails_the_job():
    d = decide_gate(2, None, NODES, JOB)
    assert not d.passed and "its job ended with exit code 2 before it measured the links" in d.failure


def test_the_record_is_the_last_preflight_record_of_the_metrics():
    assert preflight_record([{"step": 0, "preflight": record("a")}, {"step": 0, "loss": 1.0}]) == record("a")
    assert preflight_record([{"step": 1, "loss": 1.0}]) is None
