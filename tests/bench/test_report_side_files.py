"""The benches run outside `scripts/bench` (bench.tokens, bench.image_input) write their own files beside
the results file; bench.report renders them as sections of the same results, against the targets that
bench/tokens.py and bench/image_input.py hold, and renders the rest where a file is missing."""

from __future__ import annotations

import json

import pytest

from bench import report
from bench.figures import Ratio
from bench.reading import fill


def _comparison(baseline: str, medians: dict[str, float], ratios: dict[str, list[float]], **extra) -> dict:
    return {"metric": "tokens_per_s", "baseline": baseline, "repeats": len(next(iter(ratios.values()))),
            "contenders": {name: {"config": {}, "median": m} for name, m in medians.items()},
            "ratios": {name: {"per_repeat": r, "median": sorted(r)[len(r) // 2]}
                       for name, r in ratios.items()},
            "measured": {"started": "2026-03-02T06:37:34+0000", "load_average": 0.84, "cpus": 2}, **extra}


def _tokens() -> dict:
    """bench/results/tokens.json as `python -m bench.tokens` writes it: its ratios carry no target."""
    six = lambda x: [x - 0.01, x, x + 0.01, x - 0.02, x, x + 0.02]  # noqa: E731
    trainer = _comparison("bare-hvd", {"trainer": 985.0, "bare-hvd": 1000.0}, {"trainer": six(0.985)},
                          window="steps 10..50")
    trainer["contenders"]["trainer"]["config"] = {"layers": 4, "dim": 256, "seq_len": 256, "batch_size": 8,
                                                  "workers": 2}
    return {
        "token_pipeline": _comparison(
            "bare_range", {"bare_range": 5e8, "stream": 3e8, "stream_inline": 4.6e8, "bare_memmap": 6e8},
            {"stream": six(0.6), "stream_inline": six(0.92), "bare_memmap": six(1.2)},
            shape={"seq_len": 1024, "batch": 8, "steps": 100, "blocks": 3, "block_tokens": 262144,
                   "dtype": "uint16"},
            s3=_comparison("bare_range", {"bare_range": 2e8, "stream": 2.1e8, "stream_inline": 1.9e8},
                           {"stream": six(1.05), "stream_inline": six(0.94)},
                           store="local S3 server (moto)")),
        "packing": _comparison("tokenizer_alone", {"tokenizer_alone": 1.4, "pack_tokens": 1.2},
                               {"pack_tokens": six(0.85)}, text_mb=13.2, one_command_mb_per_cpu_s=1.05),
        "trainer_vs_bare": trainer,
    }


def _image_input() -> dict:
    """bench/results/image_input.json as it was committed: 3 repeats, each row a median and a target."""
    rates = {"bare-wds-2w": 155.0, "task-2w": 153.0, "task-1w": 147.0}
    config = {"width": 500, "height": 375, "quality": 90, "size": 224, "batch": 32, "images_per_run": 384}
    return {
        "comparison": {"repeats": 3,
                       "contenders": {n: {"config": config, "median": m} for n, m in rates.items()}},
        "images_per_s_vs_bare": {"per_repeat": [0.96, 0.99, 0.88], "median": 0.96, "target": 0.95,
                                 "met": True},
        "main_cpu_per_image_vs_bare": {"per_repeat": [1.29, 1.65, 1.04], "median": 1.29, "target": 1.5,
                                       "met": True},
        "two_workers_vs_one": {"per_repeat": [1.33, 1.04, 0.69], "median": 1.04, "target": 1.7, "met": False},
        "main_cpu_us_per_image": {"bare-wds-2w": 60.0, "task-2w": 85.0, "task-1w": 82.0},
    }


def _side_paragraphs() -> str:
    """bench/reading.md's paragraphs on the side files (the rest name sections these results lack)."""
    paragraphs = report.READING.read_text().split("\n\n")
    return "\n\n".join(p for p in paragraphs if "{tokens/" in p or "{image_input/" in p)


@pytest.fixture
def folder(tmp_path, results):
    """A results folder: the results file, and both side files beside it."""
    (tmp_path / "latest.json").write_text(json.dumps(results))
    (tmp_path / "tokens.json").write_text(json.dumps(_tokens()))
    (tmp_path / "image_input.json").write_text(json.dumps(_image_input()))
    return tmp_path


def test_a_ratio_can_hold_a_ceiling_for_a_cost():
    below = Ratio.of([1.2, 1.25, 1.3, 1.3, 1.35, 1.4], 1.5, at_most=True)
    above = Ratio.of([1.6] * 6, 1.5, at_most=True)
    assert (below.met, below.decided, below.verdict()) == (True, True, "met")
    assert (above.met, above.decided, above.verdict()) == (False, True, "not met")
    straddles = Ratio.of([1.3, 1.4, 1.45, 1.55, 1.6, 1.7], 1.5, at_most=True)
    assert straddles.verdict() == "met (undecided)"
    assert Ratio.from_json(below.to_json()) == below and below.to_json()["at_most"] is True
    assert "at_most" not in Ratio.of([1.0], 0.9).to_json()


def test_the_side_files_are_sections_with_the_issues_targets(folder):
    from bench import image_input, tokens

    sections = report.load_results(folder / "latest.json")["sections"]
    assert sections["headline"]["status"] == "ok"       # the results file's own sections stay
    tk, ii = sections["tokens"], sections["image_input"]
    assert (tk["status"], tk["side_file"]) == ("ok", str(folder / "tokens.json"))
    # each read mode against the target on the store it is made for; the rest information only
    pipeline, on_s3 = tk["token_pipeline"]["ratios"], tk["token_pipeline"]["s3"]["ratios"]
    assert pipeline["stream_inline"]["target"] == on_s3["stream"]["target"] == tokens.TOKEN_PIPELINE_TARGET
    untargeted = (pipeline["stream"], pipeline["bare_memmap"], on_s3["stream_inline"])
    assert not any("target" in r for r in untargeted)
    assert tk["packing"]["ratios"]["pack_tokens"]["target"] == tokens.PACKING_TARGET == 0.8
    assert tk["trainer_vs_bare"]["efficiency"]["target"] == tokens.TRAINER_TARGET == 0.97
    assert ii["main_cpu_per_image_vs_bare"]["target"] == image_input.MAIN_CPU_PER_IMAGE_MAX
    # The placeholders of bench/reading.md name their figures, and the targets give the verdicts.
    paths = ["tokens/token_pipeline/ratios/stream_inline", "tokens/token_pipeline/s3/ratios/stream",
             "tokens/packing/ratios/pack_tokens", "tokens/trainer_vs_bare/efficiency",
             "image_input/images_per_s_vs_bare", "image_input/main_cpu_per_image_vs_bare",
             "image_input/two_workers_vs_one"]
    results = {"sections": sections}
    assert fill(", ".join("{" + path + "}" for path in (paths[0], paths[4])), results) == \
        "0.920× (interval 0.900–0.940), 0.960×"
    assert fill(", ".join("{" + path + "|verdict}" for path in paths), results) == \
        "not met, met, met, met (undecided), met, met, not met"


def test_the_results_page_has_the_side_rows_and_the_reading_their_figures(folder):
    results = report.load_results(folder / "latest.json")
    page = report.results_page(results, _side_paragraphs())
    assert ("| local disk: token stream, each block read when needed (`--readahead-blocks 0`) / bare loop "
            "of ranged reads | 460 / 500 M tokens/s | 0.920× | 0.900–0.940 | ≥ 0.95: **not met** |") in page
    assert ("| local disk: bare loop through a numpy memmap / bare loop of ranged reads | 600 / 500 M "
            "tokens/s | 1.200× | 1.180–1.220 | what a read costs; no target |") in page
    assert ("| S3: token stream, its default read-ahead (4 blocks on threads) / bare loop of ranged reads | "
            "210 / 200 M tokens/s | 1.050× | 1.030–1.070 | ≥ 0.95: met |") in page
    assert ("| S3: token stream, each block read when needed (`--readahead-blocks 0`) / bare loop of "
            "ranged reads | 190 / 200 M tokens/s | 0.940× | 0.920–0.960 | the mode for a local disk; no "
            "target here |") in page
    assert ("| `pack tokens`, one tokenizer process / the tokenizer alone, per CPU-second of one more pass "
            "over the text | 1.20 / 1.40 MB/s | 0.850× | 0.830–0.870 | ≥ 0.8: met |") in page
    assert ("packing 13.2 MB of text (the corpus packed twice over less once; a single command, its start-up "
            "included, packs 1.05 MB per CPU-second)") in page
    assert ("| trainer (`--task lm`) / bare Horovod loop | 985 / 1000 tokens/s | 0.985× | 0.965–1.005 | "
            "≥ 0.97: met (undecided) |") in page
    assert ("| the training process's CPU per image: the task's loader / bare loop | 85 / 60 µs | 1.290× | "
            "– (too few repeats) | ≤ 1.5: met |") in page
    assert ("| the task's loader, 2 workers / 1 worker | 153 / 147 images/s | 1.040× | – (too few repeats) | "
            "≥ 1.7: **not met** |") in page
    reading = page[page.index("**The lm task's text path and trainer (issue 36)**"):]
    assert "the\nstream runs at 0.920× (interval 0.900–0.940) the bare loop" in reading
    assert "from S3, with its default read-ahead, at\n1.050× (interval 1.030–1.070) (met)" in reading
    assert "The loader with 2 workers reads\n0.960× the bare loop's images/s (met)" in reading
    assert "missing" not in page and "Not measured, shown as" not in page


def test_a_missing_side_file_is_named_and_the_rest_renders(folder):
    (folder / "tokens.json").unlink()
    results = report.load_results(folder / "latest.json")
    assert results["sections"]["tokens"] == {
        "status": "missing", "side_file": str(folder / "tokens.json"),
        "reason": f"{folder}/tokens.json is not there; `python -m bench.tokens --out {folder}/tokens.json` "
                  "writes it"}
    page = report.results_page(results, _side_paragraphs())
    assert (f"tokens (missing: {folder}/tokens.json is not there; `python -m bench.tokens --out "
            f"{folder}/tokens.json` writes it)") in page
    assert "**The lm task's text path and trainer** (" not in page               # no table
    assert "| the task's loader, 2 workers / 1 worker |" in page                 # the other side file's
    assert "| trainer / bare Horovod loop | 980 / 1000 |" in page                # the results file's
    # In the reading, its figures read '–' and the paragraph says why; the other paragraphs are filled.
    reading = page[page.index("**The lm task's text path and trainer (issue 36)**"):]
    assert ("the bare Horovod loop's tokens/s (–). (Not measured, shown as –: "
            f"{folder}/tokens.json is not there; `python -m bench.tokens --out {folder}/tokens.json` "
            "writes it.)\n\n**The image task's input path") in reading
    assert reading.count("Not measured, shown as –") == 1
    assert "0.960× the bare loop's images/s" in reading
    # The README's table: the lm rows are absent, and so is the bench that would have measured them.
    table = report.readme_table(results)
    assert "| lm " not in table and "bench.tokens" not in table
    assert "| trainer / bare Horovod loop (samples/s) |" in table


def test_the_readme_rows_of_the_lm_task(folder):
    table = report.readme_table(report.load_results(folder / "latest.json"))
    rows = [line for line in table.splitlines() if line.startswith("| lm ")]
    assert rows == [
        "| lm token stream / bare reads: local disk inline / S3 read-ahead | 0.920× (0.900–0.940) / 1.050× "
        "(1.030–1.070) | ≥ 0.95: **not met** / met |",
        "| lm packing / tokenizer alone (MB per CPU-s, one more pass) | 0.850× (0.830–0.870) | ≥ 0.8: met |",
        "| lm trainer / bare Horovod loop (tokens/s) | 0.985× (0.965–1.005) | ≥ 0.97: met (undecided) |"]
    # the side rows' date joins the runs' in the head
    assert "Measured 2026-01-01 to 2026-03-02 by `scripts/bench` and `bench.tokens` on 2 shared cores" \
        in table


def test_a_side_file_that_cannot_be_read_is_one_message_and_exit_2(folder, capsys):
    (folder / "image_input.json").write_text("{")
    assert report.main([str(folder / "latest.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bench.report: cannot read {folder}/image_input.json: JSONDecodeError") and \
        err.count("\n") == 1
    (folder / "image_input.json").write_text(json.dumps({"images_per_s_vs_bare": {}}))
    assert report.main([str(folder / "latest.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_the_image_bench_writes_its_rows_as_ratios_against_their_targets():
    from bench.image_input import ratios

    records = {name: [{"samples_per_sec": rate, "main_cpu_us_per_image": cpu}] * 3
               for name, rate, cpu in (("bare-wds-2w", 100.0, 50.0), ("task-2w", 96.0, 80.0),
                                       ("task-1w", 60.0, 80.0))}
    rows = ratios(records)
    assert rows["main_cpu_per_image_vs_bare"] == {
        "per_repeat": [1.6] * 3, "median": 1.6, "interval": None, "target": 1.5, "met": False,
        "decided": False, "at_most": True}
    assert (rows["images_per_s_vs_bare"]["met"], rows["two_workers_vs_one"]["median"]) == (True, 1.6)


def test_a_token_pipeline_row_from_before_the_s3_comparison_still_renders(folder):
    """`--rows` keeps the rows not re-run: one written before the S3 comparison renders its local rows."""
    tokens = _tokens()
    del tokens["token_pipeline"]["s3"]
    (folder / "tokens.json").write_text(json.dumps(tokens))
    results = report.load_results(folder / "latest.json")
    page = report.results_page(results, "")
    assert "| local disk: token stream, each block read when needed" in page and "| S3: " not in page
    row = "| lm token stream / bare reads: local disk inline | 0.920× (0.900–0.940) | ≥ 0.95: **not met** |"
    assert row in report.readme_table(results)
