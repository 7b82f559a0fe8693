"""bench/RESULTS.md and the README's Performance table are what bench.report renders from the committed
results: no figure typed by hand, none left stale."""

from __future__ import annotations

import pytest

from bench import report
from bench.results import RESULTS_DIR


def _committed():
    """The committed results with the side files beside them, as `python -m bench.report` renders them."""
    return report.load_results(RESULTS_DIR / "latest.json")


def test_results_md_is_rendered_from_the_committed_results():
    expected = report.results_page(_committed(), report.READING.read_text())
    assert report.RESULTS_MD.read_text() == expected, "run: .venv/bin/python -m bench.report --write"


def test_the_readmes_performance_table_is_rendered_from_the_committed_results():
    readme = report.README.read_text()
    table = report.readme_table(_committed())
    assert table in readme, "run: .venv/bin/python -m bench.report --write"
    assert readme.count(report.README_BEGIN) == 1
    # The headline ratios, with the run's date and machine, and the way to the rest.
    assert "| trainer / bare Horovod loop (samples/s) | 0.971× (0.926–1.073) | ≥ 0.97: met (undecided) |" \
        in table
    assert "| trainer / torch DDP over Gloo (samples/s) | 1.147× (1.053–1.233) | ≥ 1.0: met |" in table
    assert ("Measured 2026-12-06 to 2026-12-07 by 5 runs of `scripts/bench` sections and `bench.tokens` "
            "on 2 shared cores (Intel(R) Xeon(R) Processor)") in table
    # issue 27's rows, from the later run of their sections
    for row in ("| image task: trainer / bare Horovod loop |", "| image task: trainer / DDP over Gloo |",
                "| shard stream / bare boto3 reads, local S3 |",
                "| 1 DataLoader worker / bare decode loop |"):
        assert row in table
    # issue 28's row, from the later run of its section
    for gb in ("0.1", "1.0", "4.0"):
        assert f"| checkpoint write / restore, {gb} GB / bare boto3, local S3 |" in table
    # issue 36's rows, from bench/results/tokens.json
    for row in ("| lm token stream / bare reads: local disk inline / S3 read-ahead |",
                "| lm packing / tokenizer alone (MB per CPU-s, one more pass) |",
                "| lm trainer / bare Horovod loop (tokens/s) |"):
        assert row in table
    assert "[bench/RESULTS.md](bench/RESULTS.md)" in table


def test_the_table_names_each_spare_core_stall_size_and_the_recovery(results):
    results["sections"]["checkpoint_stall"] = {"status": "ok", "repeats": 1, "sizes": [
        {"layout": "2 workers on 2 cores", "workers": 2, "checkpoint_bytes": 700_000,
         "baseline_step_s": 0.002, "lost_per_checkpoint_s": 0.0001, "lost_in_steps": 0.05,
         "below_one_step": True, "write_within_after": True},
        {"layout": "1 worker, 1 thread, 2 cores", "workers": 1, "checkpoint_bytes": 9_000_000,
         "baseline_step_s": 0.0039, "lost_per_checkpoint_s": 0.0001, "lost_in_steps": 0.03,
         "below_one_step": True, "write_within_after": True, "lost_interval_s": [-0.0004, 0.0005]}]}
    results["sections"]["recovery"] = {"status": "ok", "sigterm_to_resumed_s": 8.46, "steps_lost": 0}
    table = report.readme_table(results)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "what" not in line]
    assert rows[2:] == [
        "| training time lost per checkpoint of 9.0 MB, a core to spare | 0.1 ms against a 3.9 ms step "
        "| < 1 step: met |",
        "| spot reclaim: SIGTERM to training resumed, steps lost | 8.5 s, 0 | |"]


def test_the_table_replaces_only_its_block_and_a_readme_without_one_is_refused():
    readme = f"# x\n\nbefore\n{report.README_BEGIN}\nold | figures\n{report.README_END}\nafter\n"
    assert report.replace_readme_table(readme, "NEW") == "# x\n\nbefore\nNEW\nafter\n"
    with pytest.raises(ValueError, match="README.md has no"):
        report.replace_readme_table("# x\n", "NEW")


def test_the_readings_figures_are_filled_in_from_the_results_not_typed():
    from bench.reading import typed_figures

    template = report.READING.read_text()
    assert typed_figures(template) == []
    assert typed_figures("took 1.6 ms, 0.97× and 3 s; {recovery/steps_lost} steps") == \
        ["1.6 ms", "0.97×", "3 s"]
    results = _committed()
    page = report.results_page(results, template)
    assert "{" not in page.split("## Reading the figures")[1]
    results["sections"]["recovery"]["sigterm_to_resumed_s"] = 123.4
    assert "123.4 s from a host's SIGTERM to training resumed" in report.results_page(results, template)


def test_a_figure_the_results_do_not_hold_is_named():
    from bench.reading import fill

    results = _committed()
    with pytest.raises(ValueError, match=r"reading.md: \{nope/median\}: nope/median: no 'nope' in the"):
        fill("a {nope/median} b", results)
    with pytest.raises(ValueError, match=r"needs a format"):
        fill("{recovery/sigterm_to_resumed_s}", results)
    assert fill("{headline/efficiency|verdict} / {checkpoint_stall/sizes/0|verdict}", results) == \
        "met (undecided) / no verdict: the write outlasts 4/5 of the interval"
