"""Per-rank step times and the slowest rank (train/stragglers.py)."""

import pytest

from train.stragglers import describe, straggler_fields


def test_the_record_names_the_slowest_rank_and_its_straggle():
    f = straggler_fields([0.010, 0.030, 0.011, 0.012])
    assert f["slowest_rank"] == 1 and f["rank_step_s"][1] == 0.03
    assert f["straggle"] == pytest.approx(0.030 / 0.0115, rel=1e-3)
    assert straggler_fields([]) == {}


def test_the_run_line_names_the_rank_slowest_most_often():
    records = [{"step": 10, "rank_step_s": [0.01, 0.02]}, {"step": 20, "rank_step_s": [0.01, 0.03]},
               {"step": 30, "rank_step_s": [0.02, 0.01]}, {"step": 40, "loss": 1.0}]
    line = describe(records)
    assert line.startswith("rank 1 slowest in 2 of 3 windows")
    assert "spread max/min 2.00x" in line
    assert describe([{"step": 1, "loss": 1.0}]) is None
