"""`scripts/run --task image` ends with an export in the local store, kept in the run's directory before
the store goes with the cluster; README's snippet loads it and gets the run's top-1 on the evaluation
set again (the digits' evaluation split packed again, as README says)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from train import checksum

pytestmark = pytest.mark.slow  # a local cluster and a training job

RINGTRAIN = str(Path(sys.executable).parent / "ringtrain")
REPO = Path(__file__).resolve().parents[2]


def test_an_image_run_ends_with_an_export_that_readme_s_snippet_evaluates_again(tmp_path):
    run_dir = tmp_path / "run"
    r = subprocess.run(
        [RINGTRAIN, "run", "--task", "image", "--hosts", "1", "--steps", "10", "--no-reclaim",
         "--no-progress", "--run-dir", str(run_dir), "--", "--model", "shufflenet_v2_x0_5",
         "--augment", "none", "--lr", "0.005", "--loader-workers", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = (run_dir / "summary.txt").read_text()
    top1 = re.search(r"  evaluation         top-1 (\d\.\d{4}) \(180 samples\) \(step 10\)", summary)
    assert top1, summary
    assert (f"  export             s3://ringtrain-local-checkpoints/exports/image, kept in {run_dir}/export"
            in summary), summary
    record = json.loads((run_dir / "run.json").read_text())
    assert record["export"] == "s3://ringtrain-local-checkpoints/exports/image" and record["steps"] == 10

    # README: the digits' evaluation split again, then the snippet
    png, train, evaluation = (tmp_path / d for d in ("digits", "digits-train", "digits-eval"))
    for cmd in (["-m", "cluster.example_data", "digits", "--out", str(png)],
                ["-m", "train.data", "pack", "images", "--src", str(png), "--out", str(train),
                 "--eval-out", str(evaluation), "--eval-fraction", "0.1", "--samples-per-shard", "100"]):
        subprocess.run([sys.executable, *cmd], cwd=REPO, check=True, capture_output=True, timeout=300)
    from train.export import load_export

    exported = load_export(str(run_dir / "export"))
    again = exported.evaluate(str(evaluation))
    assert again == exported.record["eval"]
    assert f"{again['eval_top1']:.4f}" == top1.group(1)
    # packed again, the training split is the one the run trained on: the same index
    assert exported.record["dataset"]["index_xxh3_128"] == checksum.of((train / "index.json").read_bytes())[
        "xxh3_128"]
