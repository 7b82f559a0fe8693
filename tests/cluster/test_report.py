"""The run report (cluster/report.py): the picture of a run with a reclaim and a resume, from recorded
metrics records and the flow's attempts; the files beside it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cluster.flow import Attempt, FlowResult, Reclaim
from cluster.report import PICTURE_NAME, figure, report_data, write_run_report
from tests.summaries import run_summary


def _records(steps, loss0, world_size, checkpoint_steps):
    """Metrics records as the trainer writes them, each listing the checkpoints taken since the previous
    record (a checkpoint at a logged step is taken after that step's record)."""
    out, previous = [], 0
    for step in steps:
        out.append({"step": step, "loss": loss0 / (1 + step / 20), "samples_per_sec": 900.0 + step,
                    "lr": 0.01, "world_size": world_size, "time": 1.0 + step,
                    "checkpoints": [c for c in checkpoint_steps if previous <= c < step]})
        previous = step
    return out


def reclaimed_and_resumed() -> FlowResult:
    first = Attempt(75, run_summary(steps=23, resumed_from_step=None, checkpoints_written=3, initial_loss=2.3,
                                    final_loss=1.1, interrupted=True), ["host-0", "host-1"],
                    metrics=[*_records([5, 10, 15, 20, 23], 2.3, 2, [10, 20]),
                             {"step": 10, "eval_accuracy": 0.5}],
                    started_at=100.0, ended_at=160.0)
    second = Attempt(0, run_summary(steps=40, resumed_from_step=23, checkpoints_written=2, initial_loss=1.1,
                                    final_loss=0.6), ["host-0", "host-1"],
                     metrics=_records([25, 30, 35, 40], 2.3, 2, [30]),
                     started_at=170.0, ended_at=200.0)
    return FlowResult(job="demo", succeeded=True, exit_code=0, attempts=[first, second],
                      summary=second.summary, metrics=second.metrics, reclaimed=["host-1"], storage=None,
                      reclaims=[Reclaim("host-1", 15, 130.0)])


def test_report_data_marks_checkpoints_the_reclaim_and_the_resume():
    data = report_data(reclaimed_and_resumed())
    first, second = data.attempts
    assert first.steps == [5, 10, 15, 20, 23] and len(first.loss) == 5   # the eval record is no loss point
    # checkpoints listed in the records (10, 20) and the one the trainer takes when it stops (23)
    assert first.checkpoints == [10, 20, 23]
    assert second.resumed_from == 23 and second.checkpoints == [30, 40]
    assert data.reclaims == [(15, "host-1")]
    assert "job demo: done" in data.title and "2 attempt(s)" in data.title


def _picture_stats(path):
    from PIL import Image, ImageStat

    with Image.open(path) as img:
        assert img.format == "PNG"
        rgb = img.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20)
        return img.size, ImageStat.Stat(rgb.convert("L")).var[0], len(colours or [])


def test_the_run_writes_a_picture_that_is_not_blank(tmp_path):
    files = write_run_report(reclaimed_and_resumed(), tmp_path / "run")
    assert files.picture == tmp_path / "run" / PICTURE_NAME
    size, variance, colours = _picture_stats(files.picture)
    assert size == (1000, 700)
    assert variance > 100          # a blank (one-colour) canvas has 0
    assert colours > 20            # lines in several colours, text, grid: not a flat image
    # the reclaim (red) and the resume (green) are drawn
    from PIL import Image

    with Image.open(files.picture) as img:
        pixels = {colour for _, colour in img.convert("RGB").getcolors(maxcolors=1 << 20)}
    assert (214, 39, 40) in pixels and (44, 160, 44) in pixels     # tab:red, tab:green


def test_the_picture_has_each_attempts_loss_and_throughput_curve():
    data = report_data(reclaimed_and_resumed())
    loss_ax, speed_ax, eval_ax = figure(data).axes   # the evaluation's accuracy on an axis of its own
    assert (loss_ax.get_ylabel(), speed_ax.get_ylabel(), eval_ax.get_ylabel()) == ("loss", "samples/s",
                                                                                  "accuracy")
    for ax, values in ((loss_ax, "loss"), (speed_ax, "samples_per_sec")):
        curves = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
                  for line in ax.get_lines() if line.get_marker() == "."}
        assert curves == {
            "attempt 1": (data.attempts[0].steps, getattr(data.attempts[0], values)),
            "attempt 2 (resumed from 23)": (data.attempts[1].steps, getattr(data.attempts[1], values))}


def test_the_summary_and_every_attempts_metrics_are_beside_the_picture(tmp_path):
    result = reclaimed_and_resumed()
    files = write_run_report(result, tmp_path)
    assert "job demo: done (exit code 0, 2 attempt(s))" in files.summary.read_text()
    records = [json.loads(line) for line in files.metrics.read_text().splitlines()]
    assert [r["attempt"] for r in records] == [1] * 6 + [2] * 4
    assert records[-1]["step"] == 40


def test_an_elastic_jobs_preflight_job_is_attempt_0_of_the_metrics_and_in_the_summary(tmp_path):
    record = {"busbw_gbps": 0.001, "floor_gbps": 0.005, "ranks": 3, "passed": False, "slow_hosts": ["w-2"]}
    gate = Attempt(69, None, ["host-0", "host-1", "host-2"], metrics=[{"step": 0, "preflight": record}],
                   decision="below the floor; slow: host-2 (w-2); excluded: the elastic job runs on the "
                            "other 2 host(s)")
    result = dataclasses.replace(reclaimed_and_resumed(), preflight=gate)
    files = write_run_report(result, tmp_path)
    records = [json.loads(line) for line in files.metrics.read_text().splitlines()]
    assert [r["attempt"] for r in records] == [0] + [1] * 6 + [2] * 4 and "preflight" in records[0]
    summary = files.summary.read_text()
    assert ("preflight          allreduce busbw 0.001 GB/s over 3 ranks (floor 0.005 GB/s): FAILED, "
            "slow: w-2") in summary
    assert "excluded: the elastic job runs on the other 2 host(s)" in summary


def test_a_backend_without_metrics_still_gets_a_picture_saying_so(tmp_path):
    result = reclaimed_and_resumed()
    for attempt in result.attempts:
        attempt.metrics = []
    size, variance, _ = _picture_stats(write_run_report(result, tmp_path).picture)
    assert size == (1000, 700) and variance > 0


@pytest.mark.parametrize("written,expected", [(0, []), (1, [23])])
def test_an_attempt_ends_on_a_checkpoint_only_if_it_wrote_any(written, expected):
    result = reclaimed_and_resumed()
    result.attempts = result.attempts[:1]
    result.attempts[0].metrics = []
    result.attempts[0].summary = run_summary(steps=23, checkpoints_written=written)
    assert report_data(result).attempts[0].checkpoints == expected


def test_a_write_aborted_by_the_stop_is_said_on_the_picture():
    result = reclaimed_and_resumed()
    assert "aborted" not in report_data(result).title
    result.attempts[0].summary = run_summary(steps=23, checkpoints_written=2, checkpoints_aborted=1)
    assert "1 marked checkpoint write(s) aborted by a stop" in report_data(result).title
