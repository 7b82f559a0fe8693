"""The preflight's arithmetic (train/preflight.py), and the trainer's --preflight-only mode run for real;
the slow-link cases run in the local flow tests (tests/cluster/test_faults.py)."""

import json

import pytest

from cluster.exit_codes import job_exit_code
from tests.train.proc import horovodrun_cmd, run
from train.config import parse_args
from train.contract import EXIT_PREFLIGHT_FAILED
from train.errors import BadInput
from train.preflight import PreflightResult, bus_bandwidth, pair_bandwidth, slow_hosts


def test_busbw_is_nccl_tests_definition():
    # nccl-tests doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n for allreduce
    assert bus_bandwidth(8e9, 1.0, 2) == pytest.approx(8e9)
    assert bus_bandwidth(8e9, 1.0, 8) == pytest.approx(8e9 * 14 / 8)
    assert bus_bandwidth(8e9, 2.0, 16) == pytest.approx(4e9 * 30 / 16)
    assert pair_bandwidth(1e6, 0.5) == pytest.approx(2e6)


def test_the_slow_host_is_the_one_every_pair_of_which_is_slow():
    pairs = {("a", "b"): 1.0, ("a", "c"): 10.0, ("b", "c"): 1.0, ("b", "d"): 1.0, ("c", "d"): 10.0,
             ("a", "d"): 10.0}
    assert slow_hosts(pairs, floor=5.0) == ["b"]
    # two hosts: both ends of their one link
    assert slow_hosts({("host-0", "host-1"): 1.0}, floor=5.0) == ["host-0", "host-1"]
    assert slow_hosts({("host-0", "host-1"): 9.0}, floor=5.0) == []


def test_the_result_names_the_slow_hosts_and_records_gbps():
    r = PreflightResult(ranks=2, nbytes=2**20, busbw=1.2e6, floor=20e6,
                        pairs={("host-0", "host-1"): 1.2e6}, slow=["host-0", "host-1"])
    assert not r.passed
    assert "BELOW THE FLOOR; slow: host-0 and host-1" in r.describe()
    assert r.record()["floor_gbps"] == 0.02 and r.record()["passed"] is False
    assert PreflightResult(ranks=2, nbytes=1, busbw=1.0, floor=None).passed


def test_a_slow_allreduce_whose_every_pair_is_above_the_floor_passes_naming_no_link():
    pairs = {("w-0", "w-1"): 70e6, ("w-0", "w-2"): 40e6, ("w-1", "w-2"): 55e6}
    r = PreflightResult(ranks=3, nbytes=2**21, busbw=1.4e6, floor=5e6, pairs=pairs)
    assert r.passed and r.record()["passed"] is True
    assert "below the floor, but every pair of hosts is above it" in r.describe()
    one_slow = PreflightResult(ranks=3, nbytes=2**21, busbw=1.4e6, floor=5e6,
                               pairs={**pairs, ("w-1", "w-2"): 1e6})
    assert not one_slow.passed
    # no pair measured (all ranks on one host): nothing clears the allreduce
    assert not PreflightResult(ranks=2, nbytes=2**21, busbw=1.4e6, floor=5e6).passed


@pytest.mark.parametrize(("argv", "says"), [
    (["--preflight-only", "--no-preflight"], "--preflight-only with --no-preflight: choose one"),
    (["--preflight-only", "--elastic"], "the preflight runs as a static job"),
])
def test_preflight_only_refuses_what_contradicts_it(argv, says):
    with pytest.raises(BadInput, match=says):
        parse_args(argv, environ={})


@pytest.mark.slow
@pytest.mark.parametrize(("floor", "code"), [(None, 0), ("1e6", EXIT_PREFLIGHT_FAILED)])  # 1e6 GB/s: never
def test_preflight_only_measures_records_and_exits_before_training(tmp_path, floor, code):
    metrics = tmp_path / "m.jsonl"
    args = ["--data", "synthetic", "--metrics-file", str(metrics), "--preflight-only", "--steps", "50"]
    r = run(horovodrun_cmd(2, *args, *(["--preflight-min-busbw", floor] if floor else [])), timeout=180)
    # horovodrun exits 1 for any failed worker; the job's code is the workers' (cluster/exit_codes.py)
    assert job_exit_code(r.returncode, (r.stdout + r.stderr).splitlines()) == code, r.stderr[-3000:]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [list(rec["preflight"]) for rec in records if "preflight" in rec]   # the record, written
    assert not [rec for rec in records if "loss" in rec]                        # and no training step
    record = next(rec["preflight"] for rec in records if "preflight" in rec)
    assert record["ranks"] == 2 and record["busbw_gbps"] > 0 and record["passed"] is (code == 0)
