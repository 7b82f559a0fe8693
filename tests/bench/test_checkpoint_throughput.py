"""bench.checkpoint_throughput (scripts/bench's checkpoint_throughput section): its figures, target,
rendering, and one small run against the local store."""

from __future__ import annotations

import json

import pytest

from bench import checkpoint_throughput as ct
from bench import report, sections
from bench import results as results_mod
from bench.__main__ import main as bench_main
from bench.__main__ import parse_args, plan_for


def test_the_sides_alternate_which_goes_first():
    assert [ct.order(r) for r in range(3)] == [("ours", "bare"), ("bare", "ours"), ("ours", "bare")]


def test_a_ratio_is_the_bare_time_over_ours_per_repeat():
    f = ct.transfer(bare_s=[1.0, 2.0, 3.0], ours_s=[2.0, 2.0, 2.0], nbytes=200_000_000)
    assert f.ratio.per_repeat == (0.5, 1.0, 1.5) and f.ratio.median == 1.0
    assert f.ours_mb_s == 100.0 and f.bare_mb_s == 100.0
    assert f.ratio.interval is None and f.ratio.target == 0.8 and f.ratio.met and not f.ratio.decided


@pytest.mark.parametrize("per_repeat, met, decided", [
    ([0.85, 0.9, 0.95, 0.82, 0.88, 0.91], True, True),     # all above: decided
    ([0.6, 0.7, 0.75, 0.62, 0.7, 0.78], False, True),      # all below
    ([0.7, 0.9, 0.85, 0.75, 0.81, 0.95], True, False),     # the interval holds both sides
    ([0.7, 0.9, 0.79, 0.75, 0.78, 0.95], False, False),
])
def test_the_target_is_decided_only_where_the_interval_lies_on_one_side(per_repeat, met, decided):
    f = ct.transfer(bare_s=per_repeat, ours_s=[1.0] * len(per_repeat), nbytes=1).to_json()
    assert (f["met"], f["decided"]) == (met, decided)
    assert f["interval"] == [min(per_repeat), max(per_repeat)]  # 6 repeats: the extremes bound 95 %


def test_the_full_plan_has_the_issues_sizes_and_repeats_overrides_them():
    assert [z.size_mb for z in sections.FULL.throughput_sizes] == [100, 1000, 4000]
    assert all(z.repeats >= 6 for z in sections.FULL.throughput_sizes)  # 6: the fewest with an interval
    assert [z.repeats for z in plan_for(parse_args(["--repeats", "2"])).throughput_sizes] == [2, 2, 2]
    assert "checkpoint_throughput" in parse_args([]).sections


def _section(repeats: int = 6) -> dict:
    row = {"size_mb": 4000, "bytes": 4_000_000_000, "repeats": repeats,
           "write": ct.transfer([0.9] * repeats, [1.0] * repeats, 4_000_000_000).to_json(),
           "restore": ct.transfer([0.7] * repeats, [1.0] * repeats, 4_000_000_000).to_json()}
    return {"status": "ok", "target": ct.TARGET, "sizes": [row], "store": "moto", "method": "paired"}


def test_the_rows_say_each_direction_against_the_target(results):
    results["sections"]["checkpoint_throughput"] = _section()
    readme = report.readme_table(results)
    assert "| checkpoint write / restore, 4.0 GB / bare boto3, local S3 | 0.900× (0.900–0.900) / " \
           "0.700× (0.700–0.700) | ≥ 0.8: met / **not met** |" in readme
    page = report.markdown(results)
    assert "| write of a 4.00 GB state (6 repeats) | 4000 / 4444 MB/s | 0.900× | 0.900–0.900 | ≥ 0.8: met |" \
        in page
    assert "| restore of a 4.00 GB state (6 repeats) | 4000 / 5714 MB/s | 0.700× | 0.700–0.700 | " \
        "≥ 0.8: **not met** |" in page


def test_a_run_of_this_section_keeps_the_others_figures(tmp_path, results):
    """The smoke run: both sides move the same bytes, and the results file keeps the other sections."""
    results["name"], results["quick"] = "quick", True
    results_mod.write(results, tmp_path)
    assert bench_main(["--quick", "--sections", "checkpoint_throughput", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "quick.json").read_text())
    assert doc["sections"]["headline"]["efficiency"] == results["sections"]["headline"]["efficiency"]
    section = doc["sections"]["checkpoint_throughput"]
    (row,) = section["sizes"]
    assert row["size_mb"] == 20 and 20_000_000 < row["bytes"] < 20_100_000 and row["repeats"] == 2
    for direction in ("write", "restore"):
        assert len(row[direction]["ours_s"]) == len(row[direction]["bare_s"]) == 2
        assert all(t > 0 for t in row[direction]["ours_s"] + row[direction]["bare_s"])
    assert section["measured"]["command"].endswith("--sections checkpoint_throughput --out " + str(tmp_path))
