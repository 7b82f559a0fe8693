"""The image-task, input-pipeline and shard-read sections (issue 27): their ratios against their
targets, the rows they put in RESULTS.md, the README and the printed table, and the image workload
the bare loops share with the trainer's image task."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report, sections
from bench.figures import Ratio
from bench.image_loop import ImageShape
from bench.trainer_run import TrainerRun
from bench.workerlib import worker_args

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("per_repeat, target, median, met, decided", [
    ([0.99, 1.0, 0.98, 1.01, 0.985, 0.995], 0.97, 0.9925, True, True),    # interval 0.98..1.01: above
    ([0.95, 1.0, 0.96, 1.01, 0.98, 0.99], 0.97, 0.985, True, False),       # 0.95..1.01 holds 0.97
    ([0.90, 0.93, 0.92, 0.94, 0.91, 0.95], 0.97, 0.925, False, True),      # wholly below
    ([0.90, 1.2], 0.97, 1.05, True, False),                               # too few for an interval
])
def test_a_ratio_meets_its_target_by_its_median_and_the_interval_decides_it(per_repeat, target, median,
                                                                               met, decided):
    r = Ratio.of(per_repeat, target)
    assert r.median == pytest.approx(median)
    assert (r.met, r.decided) == (met, decided)
    assert (r.interval is None) == (len(per_repeat) < 6)
    # as the results file holds it, and read back
    assert Ratio.from_json(r.to_json()) == r
    assert r.to_json()["met"] == met and r.to_json()["decided"] == decided


def test_a_ratio_without_a_target_has_no_verdict():
    r = Ratio.of([1.1] * 6)
    with pytest.raises(ValueError, match="without a target"):
        r.met  # noqa: B018
    assert not r.decided and not r.undecided
    assert "target" not in r.to_json() and "met" not in r.to_json() and r.to_json()["interval"] == [1.1, 1.1]


def _contender(samples, config=None):
    return {"config": config or {}, "samples": samples, "median": sorted(samples)[len(samples) // 2],
            "runs": [{}] * len(samples)}


def _image_comparison():
    shape = ImageShape("/tmp/x", steps=40, warmup=10, model="shufflenet_v2_x0_5")
    cfg = {"model": shape.model, "image_size": 32, "batch_size": 32, "workers": 2, "loader_workers": 1}
    trainer = [300.0, 310.0, 290.0, 305.0, 295.0, 300.0]
    bare = [300.0, 300.0, 300.0, 300.0, 300.0, 300.0]
    ddp = [330.0, 330.0, 330.0, 330.0, 330.0, 330.0]
    comparison = {
        "metric": "samples_per_sec", "baseline": "bare-hvd", "repeats": 6, "order": [],
        "contenders": {"trainer": _contender(trainer, cfg),
                       "bare-hvd": _contender(bare, {"threads": 1, "pin": True, "cycle_time_ms": 0.05,
                                                     "groups": 1}),
                       "ddp": _contender(ddp), "ddp-pin": _contender([300.0] * 6, {"pin": True})},
        "ratios": {"trainer": {"per_repeat": [t / b for t, b in zip(trainer, bare, strict=True)],
                               "median": 1.0},
                   "ddp": {"per_repeat": [1.1] * 6, "median": 1.1}},
    }
    return comparison, shape


def _pipeline_sections():
    def section(metric, baseline, base, name, measured, per_repeat, target, config):
        return {"status": "ok", "ratio": Ratio.of(per_repeat, target).to_json(), "comparison": {
            "metric": metric, "baseline": baseline, "repeats": 6, "order": [],
            "contenders": {baseline: _contender([base] * 6), name: _contender([measured] * 6, config)},
            "ratios": {name: {"per_repeat": per_repeat, "median": sorted(per_repeat)[3]}}}}

    read = section("bytes_per_sec", "bare-boto3", 42.7e6, "shard-stream", 52.7e6,
                   [1.2, 1.3, 1.25, 1.1, 1.22, 1.28], 0.9,
                   {"shards": 8, "samples_per_shard": 40, "sample_kb": 100.0, "bytes_per_run": 33e6})
    decode = section("samples_per_sec", "bare-loop", 227.9, "loader-worker", 218.1,
                     [0.93, 0.96, 0.97, 0.94, 0.95, 0.99], 0.95,
                     {"samples_per_run": 512, "image_px": 64, "size": 56, "batch": 32})
    return read, decode


def test_the_image_section_holds_the_trainer_to_the_bare_loop_and_to_ddp():
    comparison, shape = _image_comparison()
    figures = sections.peer_figures(comparison, shape)
    e, p = figures["efficiency"], figures["peer"]
    assert e["target"] == 0.97 and e["met"] and e["median"] == pytest.approx(1.0)
    # against DDP: paired per repeat (trainer[i] / ddp[i]), target 1.0 as the headline's DDP row
    assert p["trainer"]["per_repeat"] == pytest.approx([t / 330 for t in comparison["contenders"]["trainer"]
                                                        ["samples"]])
    assert p["trainer"]["target"] == 1.0 and not p["trainer"]["met"] and p["trainer"]["decided"]
    assert "target" not in p["bare-hvd"]
    # like with like: DDP pinned as the trainer is; reported, no target
    pinned = figures["peer_pinned"]
    assert pinned["trainer"]["median"] == pytest.approx(1.0) and "target" not in pinned["trainer"]
    assert pinned["bare-hvd"]["per_repeat"] == [1.0] * 6
    assert figures["window"].startswith("steps 10..50 of every run")


def test_the_new_rows_reach_the_readme_results_md_and_the_table(results):
    comparison, shape = _image_comparison()
    results["sections"]["image_task"] = {**sections.peer_figures(comparison, shape), "data": "digits"}
    results["sections"]["shard_read"], results["sections"]["input_pipeline"] = _pipeline_sections()
    readme = report.readme_table(results)
    assert ("| image task: trainer / bare Horovod loop | 1.000× (0.967–1.033) | "
            "≥ 0.97: met (undecided) |") in readme
    assert "| image task: trainer / DDP over Gloo | 0.909× (0.879–0.939) | ≥ 1.0: **not met** |" \
        in readme
    assert ("| shard stream / bare boto3 reads, local S3 | 1.235× (1.100–1.300) | "
            "≥ 0.9: met |") in readme
    assert ("| 1 DataLoader worker / bare decode loop | 0.955× (0.930–0.990) | "
            "≥ 0.95: met (undecided) |") in readme
    text = report.markdown(results)
    assert "| trainer / bare Horovod loop | 300 / 300 | 1.000× | 0.967–1.033 | ≥ 0.97: met (undecided) |" \
        in text
    assert "| bare Horovod / torch DDP | 300 / 330 | 0.909× | 0.909–0.909 |  |" in text
    assert ("| trainer / DDP pinned like the trainer | 300 / 300 | 1.000× | 0.967–1.033 | like with like; "
            "no target |") in text
    assert "torchvision shufflenet_v2_x0_5 at 32 px, batch 32 per worker, 2 workers with 1 DataLoader" in text
    assert ("(8 shards of 40 samples of 100 kB, 33 MB a run; 6 repeats) | 52.7 / 42.7 MB/s | 1.235× | "
            "1.100–1.300 | ≥ 0.9: met |") in text
    assert ("(512 generated 64 px PNGs, 56 px crops, batch 32; 6 repeats) | 218.1 / 227.9 samples/s | "
            "0.955× | 0.930–0.990 | ≥ 0.95: met (undecided) |") in text


def test_the_bare_image_loops_run_the_trainers_image_task_settings(tmp_path):
    """The bare loops and the trainer get the same model, crop, batch and input-pipeline flags, and the
    loops decode with the task's default augmentation: else the ratio measures the settings."""
    from train.config import parse_args

    shape = ImageShape(str(tmp_path), steps=40, warmup=10, model="shufflenet_v2_x0_5", image_size=24,
                       batch_size=16, loader_workers=2, prefetch=3, readahead_shards=1)
    trainer = parse_args(TrainerRun(shape, None, 0).trainer_args(tmp_path / "m.jsonl", "r1"))
    bare = worker_args(shape.args())
    task = trainer.task.args
    assert trainer.task.name == "image" and trainer.data.source == bare.data == str(tmp_path)
    assert trainer.steps == bare.warmup + bare.steps == 50
    assert trainer.data.batch_size == bare.batch_size == 16
    for name in ("model", "image_size", "loader_workers", "prefetch", "readahead_shards"):
        assert getattr(task, name) == getattr(bare, name), name
    assert task.augment == "standard"  # what image_loop.image_workload decodes with
    assert trainer.checkpoint.uri is None and trainer.metrics.metrics_file == str(tmp_path / "m.jsonl")


def test_synthetic_bare_loops_still_want_the_trainers_demo_models():
    with pytest.raises(SystemExit):
        worker_args(["--model", "resnet18"])
    assert worker_args(["--model", "resnet18", "--data", "/d"]).model == "resnet18"


@pytest.mark.slow
def test_quick_run_of_the_input_sections_writes_their_rows(tmp_path):
    """Smoke: the input sections run for real, one short repeat each; checks the document, not the
    speed. The image_task section's runs are the headline's machinery (bench.trainer_run, bench.peer),
    run by test_report_and_cli's smoke; its rows are rendered from results in the tests here."""
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--sections",
                           "shard_read,input_pipeline", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "quick.json").read_text())
    assert set(doc["sections"]) == {"shard_read", "input_pipeline"}
    for name in ("shard_read", "input_pipeline"):
        assert doc["sections"][name]["ratio"]["median"] > 0
    assert "| shard stream / bare boto3" in proc.stdout


def test_a_document_merged_from_two_runs_names_both_and_what_each_measured(results):
    later = {"command": "scripts/bench --sections image_task", "run_started_at": "2026-02-01T00:00:00+00:00",
             "started_at": "2026-02-01T00:01:00+00:00", "finished_at": "2026-02-01T00:09:00+00:00",
             "load_avg": [7.5, 6.0, 5.0], "load_avg_end": [9.25, 8.0, 6.0], "cpu_model": "Test CPU"}
    comparison, shape = _image_comparison()
    results["sections"]["image_task"] = {**sections.peer_figures(comparison, shape), "data": "digits",
                                         "measured": later}
    assert ("Measured 2026-01-01 to 2026-02-01 by 2 runs of `scripts/bench` sections "
            "on 2 shared cores (Test CPU)") in report.readme_table(results)
    text = report.markdown(results)
    assert ("Measured with 2 runs: `scripts/bench` (2026-01-01T00:00:00+00:00 to 2026-01-01T00:10:00+00:00, "
            "load average 1.0 at the start) for peer_study, headline, recovery; `scripts/bench --sections "
            "image_task` (2026-02-01T00:01:00+00:00 to 2026-02-01T00:09:00+00:00, load average 7.5 at the "
            "start) for image_task on 2 cores") in text
    assert "untimed for all contenders); load average 7.5 to 9.2 during it." in text
    # one run: as before
    del results["sections"]["image_task"]
    assert "Measured 2026-01-01 by `scripts/bench` on 2 shared cores" in report.readme_table(results)
