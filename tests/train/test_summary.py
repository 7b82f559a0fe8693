"""The run's summary line: written by the trainer, read back by tests, the benchmark and both backends
through the one type (train/summary.py)."""

from __future__ import annotations

import json

import pytest

from tests.summaries import NEUTRAL, run_summary
from train.summary import RunSummary, last_summary, parse_summary


def test_summary_line_round_trips_and_requires_every_key():
    summary = run_summary(steps=7, final_loss=0.5, cpu_affinity=[0, 1], eval={"eval_accuracy": 0.9})
    line = summary.line()
    assert line.startswith("RINGTRAIN_SUMMARY {")
    assert json.loads(line.split(" ", 1)[1]) == summary.record()
    assert parse_summary(f"noise\n{line}\nmore") == summary
    with pytest.raises(ValueError, match="lacks"):
        RunSummary.from_record({"steps": 1})
    with pytest.raises(ValueError, match="lacks"):
        parse_summary('RINGTRAIN_SUMMARY {"steps": 1}')
    with pytest.raises(ValueError, match="exactly one"):
        parse_summary(f"{line}\n{line}")
    with pytest.raises(ValueError, match="exactly one"):
        parse_summary("no summary here")


def test_keys_a_newer_trainer_adds_are_left_out():
    record = NEUTRAL | {"steps": 3, "a_later_figure": 1.5}
    assert RunSummary.from_record(record) == run_summary(steps=3)


def test_last_summary_reads_the_last_complete_line_through_horovods_prefix():
    first, last = run_summary(steps=5, interrupted=True), run_summary(steps=9)
    lines = ["[1]<stderr>:noise", f"[0]<stdout>:{first.line()}", f"[0]<stdout>:{last.line()}",
             '[0]<stdout>:RINGTRAIN_SUMMARY {"steps": 12, "interr', "tail"]  # the last one cut off
    assert last_summary(lines) == last
    assert last_summary(lines[:2]) == first
    assert last_summary(["nothing here", '[0]<stdout>:RINGTRAIN_SUMMARY {"steps": 5}']) is None
