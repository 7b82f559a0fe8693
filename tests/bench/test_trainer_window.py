"""Reading the trainer's steady-state throughput, checkpoint counts and recovery figures (pure parts)."""

import pytest

from bench.peer import HorovodSettings, LoopShape
from bench.sections import StallSize, checkpoints_in_window, recovery_figures
from bench.trainer_run import TrainerRun, stall_estimate, step_durations, window_rate
from tests.summaries import run_summary


def records(times):
    return [{"step": s, "time": t, "loss": 1.0} for s, t in times.items()]


def test_window_rate_uses_only_the_steps_inside_the_window():
    recs = records({10: 100.0, 20: 101.0, 30: 103.0, 40: 104.0})
    # Steps 20..40: 20 steps x 64 samples in 3 s; the slow start before step 20 does not count.
    assert window_rate(recs, 20, 40, 64) == pytest.approx(20 * 64 / 3.0)


@pytest.mark.parametrize("start,end,match", [(20, 20, "empty"), (20, 50, r"step\(s\) \[50\]"),
                                             (15, 40, r"step\(s\) \[15\]")])
def test_window_rate_refuses_windows_it_cannot_measure(start, end, match):
    with pytest.raises(ValueError, match=match):
        window_rate(records({10: 1.0, 20: 2.0, 40: 3.0}), start, end, 64)


def test_trainer_runs_take_the_same_knobs_as_the_bare_loop(tmp_path):
    shape = LoopShape(steps=200, warmup=20, width=64)
    run = TrainerRun(shape, HorovodSettings(threads=1, cycle_time_ms=2.5, fusion_mb=0, compression="fp16"),
                     50, "http://127.0.0.1:9999", "bench")
    args = run.trainer_args(tmp_path / "m.jsonl", "r1")
    pairs = {flag: args[i + 1] for i, flag in enumerate(args[:-1]) if flag.startswith("--")}
    assert pairs["--model"] == "cnn" and pairs["--width"] == "64" and pairs["--batch-size"] == "32"
    assert pairs["--steps"] == "220" and pairs["--data"] == "synthetic"
    assert pairs["--cycle-time-ms"] == "2.5" and pairs["--fusion-threshold-mb"] == "0"
    assert pairs["--compression"] == "fp16"
    assert pairs["--checkpoint-dir"] == "s3://bench/checkpoints/r1" and pairs["--checkpoint-every"] == "50"
    # Knobs with trainer flags go as flags; threads (no flag) as the environment torch reads.
    assert run.env({"AWS_ENDPOINT_URL": "x"}) == {"AWS_ENDPOINT_URL": "x", "OMP_NUM_THREADS": "1"}
    no_ckpt = TrainerRun(shape, HorovodSettings(), 0).trainer_args(tmp_path / "m.jsonl", "r2")
    assert "--checkpoint-dir" not in no_ckpt and "--cycle-time-ms" not in no_ckpt
    assert no_ckpt[no_ckpt.index("--cpu-affinity") + 1] == "off"  # unpinned settings turn pinning off


def test_a_trainer_run_with_its_defaults_gets_no_tuning_flag_or_environment(tmp_path):
    run = TrainerRun(LoopShape(steps=200, warmup=20), None, 0)
    args = run.trainer_args(tmp_path / "m.jsonl", "r1")
    tuning = {"--compression", "--cycle-time-ms", "--fusion-threshold-mb", "--cpu-affinity"}
    assert not tuning & set(args), args
    assert run.env({"AWS_ENDPOINT_URL": "x"}) == {"AWS_ENDPOINT_URL": "x"}


def test_trainer_run_refuses_windows_off_the_metrics_cadence():
    with pytest.raises(ValueError, match="multiples"):
        TrainerRun(LoopShape(steps=205, warmup=20), HorovodSettings(), 0)
    with pytest.raises(ValueError, match="object store"):
        TrainerRun(LoopShape(steps=200, warmup=20), HorovodSettings(), 50)


def test_checkpoints_in_window_skips_the_last_step_and_the_warmup():
    assert checkpoints_in_window(20, 120, 25) == 4     # 25, 50, 75, 100
    assert checkpoints_in_window(20, 100, 25) == 3     # 100 is the run's last step: no periodic one
    assert checkpoints_in_window(20, 220, 50) == 4     # 50, 100, 150, 200
    with pytest.raises(ValueError):
        checkpoints_in_window(0, 10, 50)


def test_recovery_figures():
    events = [(1000.0, "attempt 1: submitted"), (1010.0, "fault injection: reclaiming host-1 (...)"),
              (1030.0, "attempt 2: submitted bench on host-0, host-1")]
    first = run_summary(steps=73, checkpoints_written=2)
    second = run_summary(resumed_from_step=73)
    metrics = [{"step": 75, "time": 1041.0}, {"step": 74, "time": 1040.5}, {"step": 73, "time": 999.0}]
    got = recovery_figures(events, first, second, metrics)
    assert got.sigterm_to_resumed_s == pytest.approx(30.5)
    assert got.sigterm_to_resubmitted_s == pytest.approx(20.0)
    assert got.first_resumed_step == 74
    assert got.steps_lost == 0 and got.interrupted_at_step == 73
    # Resumed from an older checkpoint: the steps in between are lost work.
    assert recovery_figures(events, run_summary(steps=73), run_summary(resumed_from_step=50),
                            [{"step": 51, "time": 1050.0}]).steps_lost == 23


def test_recovery_figures_need_a_reclaim_and_a_resume():
    with pytest.raises(ValueError, match="reclaim"):
        recovery_figures([], run_summary(steps=5), run_summary(resumed_from_step=5),
                         [{"step": 6, "time": 1.0}])
    with pytest.raises(ValueError, match="did not resume"):
        recovery_figures([(1.0, "fault injection: reclaiming h")], run_summary(steps=5),
                         run_summary(resumed_from_step=None), [])


def test_step_durations_from_per_step_records():
    assert step_durations(records({1: 10.0, 2: 10.5, 3: 11.5, 5: 12.0})) == {2: 0.5, 3: 1.0}


def test_stall_estimate_sums_the_excess_after_each_checkpoint():
    # 20 ms steps; after each checkpoint the first step takes +50 ms (snapshot, serialization) and the
    # next two +10 ms each (the upload competing for the CPU).
    def run(ckpts, noisy_ckpt=None):
        d = {s: 0.02 for s in range(1, 101)}
        for c in ckpts:
            d[c + 1] += 0.05
            d[c + 2] += 0.01
            d[c + 3] += 0.01
        if noisy_ckpt:
            for p in range(1, 9):  # a neighbour's burst right after one checkpoint
                d[noisy_ckpt + p] += 0.5
        return d

    est = stall_estimate([run([20, 40, 60]), run([20, 40, 60], noisy_ckpt=40)], [20, 40, 60], every=20)
    assert est["baseline_step_s"] == pytest.approx(0.02)
    assert est["first_step_excess_s"] == pytest.approx(0.05)
    assert est["lost_per_checkpoint_s"] == pytest.approx(0.07)  # the burst at one checkpoint is not counted
    assert sorted(est["lost_per_checkpoint_samples_s"])[-1] == pytest.approx(4.07)  # ... but reported
    assert est["after_steps"] == 10 and est["write_within_after"]  # half the interval: no write given
    assert est["checkpoints_measured"] == 6 and len(est["excess_by_position_s"]) == 20


def test_stall_estimate_widens_the_after_steps_to_cover_the_longest_write():
    # 10 ms steps, checkpoints every 20; each checkpoint's write takes 130 ms and costs 1 ms on each of
    # the first 12 steps after it: half the interval (10 steps, ~110 ms) would miss part of it.
    d = {s: 0.01 for s in range(1, 101)}
    for c in (20, 40, 60):
        for p in range(1, 13):
            d[c + p] += 0.001
    est = stall_estimate([d], [20, 40, 60], every=20, write_s=0.13)
    assert est["after_steps"] == 12 and est["write_within_after"]  # 12 steps = 132 ms > 130 ms
    assert est["lost_per_checkpoint_s"] == pytest.approx(0.012)
    # without the write's length, half the interval: 10 ms of the cost inside, 2 ms in the baseline
    assert stall_estimate([d], [20, 40, 60], every=20)["lost_per_checkpoint_s"] == pytest.approx(0.008)
    # a write longer than all but a fifth of the interval: measured as far as it goes, and said so
    long = stall_estimate([d], [20, 40, 60], every=20, write_s=0.5)
    assert long["after_steps"] == 16 and not long["write_within_after"]


def test_stall_estimate_compares_each_checkpoint_with_its_own_interval():
    # A machine that slows down during the run (steps 20 ms at the start, 40 ms at the end), and a
    # 30 ms cost on the first step after each checkpoint: each checkpoint is measured against the steps
    # just before the next, so only the drift within one interval shows, not the run's whole spread.
    d = {s: 0.02 + 0.0002 * s for s in range(1, 101)}
    for c in (20, 40, 60):
        d[c + 1] += 0.03
    est = stall_estimate([d], [20, 40, 60], every=20)
    # first half (steps c+1..c+10) minus second half (c+11..c+20): 0.03 - 10 * 10 * 0.0002
    assert est["lost_per_checkpoint_s"] == pytest.approx(0.03 - 0.02)


def test_stall_sizes_measure_from_the_second_checkpoint_with_a_whole_interval_after_each():
    assert StallSize(256, every=100, steps=600, warmup=50).profiled() == [200, 300, 400, 500]
    assert StallSize(1024, every=50, steps=250, warmup=50).profiled() == [100, 150, 200, 250]
    with pytest.raises(ValueError, match="no checkpoint with 50 steps after it in 140 steps"):
        StallSize(1024, every=50, steps=100, warmup=40).profiled()


def test_stall_estimate_needs_room_after_each_checkpoint():
    with pytest.raises(ValueError, match="after checkpoint step 20"):
        stall_estimate([{s: 0.02 for s in range(1, 30)}], [20], every=20)
    with pytest.raises(ValueError, match="at least 4"):
        stall_estimate([{}], [2], every=2)


def test_stall_estimate_with_fixed_after_steps_reads_runs_without_checkpoints():
    # The null control: the same estimate over runs that wrote nothing, with the after steps the
    # checkpointing runs needed. Flat steps read 0; a run whose steps slow down across each interval
    # (a trend the method would count as a gain) reads that bias, not 0.
    flat = {s: 0.02 for s in range(1, 101)}
    est = stall_estimate([flat], [20, 40, 60], every=20, after=14)
    assert est["after_steps"] == 14 and est["write_within_after"]
    assert est["lost_per_checkpoint_s"] == pytest.approx(0.0)
    rising = {s: 0.02 + 0.001 * (s % 20) for s in range(1, 101)}  # positions 1..19 rise, 20 resets
    biased = stall_estimate([rising], [20, 40, 60], every=20, after=10)["lost_per_checkpoint_s"]
    after_excess, rest_mean = 0.001 * sum(range(1, 11)), 0.001 * sum(range(11, 20)) / 10
    assert biased == pytest.approx(after_excess - 10 * rest_mean)
    with pytest.raises(ValueError, match="after=17: must be 1..16"):
        stall_estimate([flat], [20, 40, 60], every=20, after=17)


def test_stall_estimate_gives_an_interval_for_its_median_once_there_are_enough_checkpoints():
    d = {s: 0.02 for s in range(1, 141)}
    for i, c in enumerate((20, 40, 60, 80, 100, 120)):
        d[c + 1] += 0.001 * (i + 1)  # per-checkpoint costs 1..6 ms
    est = stall_estimate([d], [20, 40, 60, 80, 100, 120], every=20)
    low, high = est["lost_interval_s"]
    assert low == pytest.approx(0.001) and high == pytest.approx(0.006)  # 6 values: the extremes (96.9 %)
    assert low <= est["lost_per_checkpoint_s"] <= high
    assert stall_estimate([d], [20, 40, 60], every=20)["lost_interval_s"] is None  # 3 values: too few


def _stall_record(steps: int, slow_after: set[int], cpu_s: float = 0.0, written: int = 0) -> dict:
    """A TrainerRun.run record of a run logging every step: 1 ms steps, 5 ms where `slow_after` says."""
    times, t = {}, 0.0
    for step in range(1, steps + 1):
        t += 0.005 if step in slow_after else 0.001
        times[step] = t
    return {"records": records(times), "window_s": t - times[8], "checkpoint_write_max_s": 0.002,
            "checkpoints_written": written, "checkpoint_wait_s": 0.0, "checkpoints_deferred": 0,
            "checkpoint_write_cpu_s": cpu_s, "store_cpu_s": cpu_s / 2, "run_id": "r"}


def test_a_stall_row_is_computed_from_its_runs_records_and_read_back_from_the_results():
    from bench.figures import StallRow
    from bench.sections import SPARE_CORE, stall_row

    size = StallSize(256, every=8, steps=24, warmup=8)   # checkpoints measured after steps 16 and 24
    runs = {"checkpoints": [_stall_record(32, {17, 25}, cpu_s=0.03, written=3)] * 2,
            "no-checkpoints": [_stall_record(32, set())] * 2}
    row = stall_row(SPARE_CORE, size, runs, nbytes=700_000)
    assert row.layout == SPARE_CORE.name and row.workers == 1 and row.every == 8
    assert row.baseline_step_s == pytest.approx(0.001)
    assert row.lost_per_checkpoint_s == pytest.approx(0.004)      # the one slow step's excess
    assert row.null_lost_per_checkpoint_s == pytest.approx(0.0)   # nothing written: nothing found
    assert row.checkpoints_measured == 4 and row.lost_interval_s is None   # too few for an interval
    assert row.lost_in_steps == pytest.approx(4.0) and not row.below_one_step
    assert row.verdict() == "not met"
    assert row.writer_cpu_per_checkpoint_s == pytest.approx(0.01)  # 30 ms over 3 checkpoints
    assert row.store_cpu_per_checkpoint_s == pytest.approx(0.005)
    assert row.ab_lost_per_repeat_s == pytest.approx((0.008 / 2,) * 2)  # 2 checkpoints in the window
    assert StallRow.from_json(row.to_json()) == row
