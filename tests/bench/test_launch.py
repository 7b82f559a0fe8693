"""Running and parsing benchmark jobs: result lines, timeouts, failures, the harness's own env."""

import sys
import time

import pytest

from bench.launch import BenchError, parse_result, run_command, run_worker


def test_parse_result_reads_the_one_result_line_through_horovodrun_rank_tags():
    out = "noise\n[0]<stdout>:BENCH_RESULT {\"samples_per_sec\": 12.5}\n[1]<stderr>:warning\n"
    assert parse_result(out) == {"samples_per_sec": 12.5}
    assert parse_result("BENCH_RESULT {\"a\": 1}") == {"a": 1}


@pytest.mark.parametrize("out", ["nothing here", "BENCH_RESULT {}\nBENCH_RESULT {}"])
def test_parse_result_wants_exactly_one_line(out):
    with pytest.raises(ValueError, match="exactly one"):
        parse_result(out)


def test_a_hung_job_is_killed_at_its_timeout():
    start = time.monotonic()
    with pytest.raises(BenchError, match="no result within 1s"):
        run_command("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1)
    assert time.monotonic() - start < 20


def test_a_failed_job_names_its_exit_code_and_shows_its_output():
    with pytest.raises(BenchError, match=r"(?s)crasher: exited with code 3.*last words"):
        run_command("crasher", [sys.executable, "-c", "print('last words'); raise SystemExit(3)"])


def test_a_job_without_a_result_line_is_an_error():
    with pytest.raises(BenchError, match="silent: expected exactly one"):
        run_worker("silent", [sys.executable, "-c", "print('hello')"])


def test_inherited_tuning_knobs_do_not_leak_into_runs(monkeypatch):
    # "Horovod's defaults" must mean its defaults, whatever the caller's shell exported.
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "7")
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    code = ("import json, os; print('BENCH_RESULT ' + json.dumps({k: os.environ.get(k) for k in "
            "('HOROVOD_CYCLE_TIME', 'OMP_NUM_THREADS', 'HOROVOD_FUSION_THRESHOLD')}))")
    got = run_worker("env", [sys.executable, "-c", code], env={"HOROVOD_FUSION_THRESHOLD": "0"})
    assert got == {"HOROVOD_CYCLE_TIME": None, "OMP_NUM_THREADS": None, "HOROVOD_FUSION_THRESHOLD": "0"}
