"""run_comparison with scripted contenders: order, raw samples, medians, ratios, failures."""

import itertools

import pytest

from bench.compare import Contender, run_comparison, summarise_run
from bench.launch import BenchError


def scripted(name, values, calls):
    it = iter(values)

    def run():
        calls.append(name)
        return {"samples_per_sec": next(it), "step_times_s": [0.1, 0.3, 0.2], "noise": "dropped"}

    return Contender(name, run, {"what": name})


def test_runs_interleaved_and_reports_raw_samples_medians_and_ratios():
    calls = []
    result = run_comparison(
        [scripted("base", [100, 80, 120], calls), scripted("new", [110, 84, 150], calls)],
        baseline="base", repeats=3)
    assert calls == ["base", "new", "new", "base", "base", "new"]
    assert result["order"] == calls
    base, new = result["contenders"]["base"], result["contenders"]["new"]
    # Raw samples are in repeat order, whichever slot each repeat ran in.
    assert base["samples"] == [100, 80, 120] and new["samples"] == [110, 84, 150]
    assert base["median"] == 100 and new["median"] == 110
    assert new["config"] == {"what": "new"}
    assert result["ratios"]["new"]["per_repeat"] == pytest.approx([1.1, 1.05, 1.25])
    assert result["ratios"]["new"]["median"] == pytest.approx(1.1)
    assert "base" not in result["ratios"]
    # Per-run records keep the summary figures, not the per-step arrays.
    assert base["runs"][0] == {"samples_per_sec": 100, "median_step_s": 0.2}


def test_a_failed_run_fails_the_comparison():
    def boom():
        raise BenchError("worker died")

    with pytest.raises(BenchError, match="worker died"):
        run_comparison([scripted("a", itertools.repeat(1.0), []), Contender("b", boom)], "a", 2)


def test_missing_metric_and_bad_baseline_are_errors():
    with pytest.raises(ValueError, match="no 'window_s'"):
        run_comparison([scripted("a", [1.0], [])], "a", 1, metric="window_s")
    with pytest.raises(ValueError, match="baseline"):
        run_comparison([scripted("a", [1.0], [])], "z", 1)


def test_a_run_keeps_what_says_whether_training_waited_for_a_checkpoint():
    """The headline trainer checkpoints every 50 steps; whether it waited for the previous write
    (the local store starved of CPU) must be in the results, not only in the trainer's summary."""
    record = {"samples_per_sec": 100.0, "window_s": 1.0, "checkpoint_wait_s": 0.03,
              "checkpoint_write_max_s": 0.25, "checkpoint_write_cpu_s": 0.04, "records": [{"step": 1}]}
    kept = summarise_run(record)
    assert kept == {"samples_per_sec": 100.0, "window_s": 1.0, "checkpoint_wait_s": 0.03,
                    "checkpoint_write_max_s": 0.25, "checkpoint_write_cpu_s": 0.04}
