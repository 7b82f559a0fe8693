"""`ringtrain runs` (cluster/runs.py) and `ringtrain export` (cluster/export_cli.py): run records, a
bucket's jobs, exports from a checkpoint after the run, and their bad input."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from cluster.buckets import checkpoints_root
from cluster.cli import main
from cluster.flow import Attempt, FlowResult
from cluster.local.objectstore import LOCAL_CREDENTIALS
from cluster.run_cost import NodeGroupCost
from cluster.runs import bucket_runs, format_runs, keep_in_bucket, local_runs, run_record, write_run_record
from tests.summaries import run_summary
from train import export
from train.checkpoint import store as ckpt
from train.storage import LocalStore, open_store


def _result(job="image") -> FlowResult:
    summary = run_summary(steps=300, initial_loss=2.3, final_loss=0.4123, eval={"eval_top1": 0.878},
                          export=f"s3://p-checkpoints/exports/{job}")
    attempt = Attempt(0, summary, ["host-0"], started_at=1_796_000_000.0, ended_at=1_796_000_100.0)
    return FlowResult(job=job, succeeded=True, exit_code=0, attempts=[attempt], summary=summary, metrics=[],
                      reclaimed=[], storage=None)


def test_a_run_leaves_a_record_that_runs_lists_as_a_table_and_as_json(tmp_path, capsys):
    costs = [NodeGroupCost("a10g-spot", "SPOT", "g5.xlarge", 0.5, 1.006),
             NodeGroupCost("cb", "CAPACITY_BLOCK", None, 1.0, None)]   # a block: not priced by the hour
    for job, when in (("image", 1_796_000_000.0), ("lm", 1_795_000_000.0)):
        result = _result(job)
        result.attempts[0].started_at = when
        (tmp_path / job).mkdir()
        write_run_record(tmp_path / job, run_record(result, "aws", "dev", tmp_path / job, costs))
    records = local_runs(tmp_path)
    assert [r["job"] for r in records] == ["lm", "image"]       # oldest first
    image = records[1]
    assert image == {"job": "image", "when": "2026-11-30T00:53:20+00:00", "where": "aws:dev", "state": "done",
                     "exit_code": 0, "attempts": 1, "steps": 300, "final_loss": 0.4123,
                     "eval": {"eval_top1": 0.878}, "cost_usd": 0.503,
                     "export": "s3://p-checkpoints/exports/image", "run_dir": str(tmp_path / "image")}
    table = format_runs(records)
    assert "top-1 0.8780" in table and "$0.50" in table and "s3://p-checkpoints/exports/image" in table
    assert main(["runs", "--runs-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == records
    assert main(["runs", "--runs-dir", str(tmp_path / "none")]) == 0
    assert capsys.readouterr().out.strip() == "no runs found"


def _checkpoint(store, step: int, with_record: bool = True) -> nn.Module:
    """A checkpoint of the demo task's model, as the trainer writes it (with the export's record)."""
    from train.tasks.demo import DemoTask

    task = DemoTask(argparse.Namespace(model="mlp", width=8, dropout=0.0), None)
    torch.manual_seed(step)
    model = task.build_model()
    state = {"step": step, "model": model.state_dict(), "optimizer": {}, "loss": 0.5}
    if with_record:
        state[export.CHECKPOINT_KEY] = export.model_record("demo", task.args, task.model_info(),
                                                           {"uri": "synthetic"}, None, step, {})
    ckpt.CheckpointStore(store, keep=5).write(step, state)
    return model


def test_a_bucket_lists_its_run_records_and_jobs_with_only_checkpoints(tmp_path):
    store = LocalStore(tmp_path)
    _checkpoint(LocalStore(tmp_path / "checkpoints" / "j1"), 40)
    export.write_export(str(tmp_path / "exports" / "j1"), nn.Linear(3, 2).state_dict(),
                        {"format": export.FORMAT, "step": 40, "eval": {"eval_top1": 0.5}})
    record = run_record(_result(), "aws", "dev", Path("r"), None)
    keep_in_bucket(f"{tmp_path}/checkpoints/image", None, record)
    records = {r["job"]: r for r in bucket_runs(store, "aws:dev")}
    assert records["image"]["final_loss"] == 0.4123 and records["image"]["where"] == "aws:dev"
    assert records["j1"]["state"] == "checkpoints only" and records["j1"]["steps"] == 40
    assert records["j1"]["export"] == f"{tmp_path}/exports/j1" and records["j1"]["eval"] == {"eval_top1": 0.5}


def test_export_after_the_run_from_the_newest_or_a_given_checkpoint(tmp_path, capsys):
    checkpoints = LocalStore(tmp_path / "checkpoints" / "j1")
    _checkpoint(checkpoints, 20)
    newest = _checkpoint(checkpoints, 40)
    assert main(["export", "--job", "j1", "--store", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"exported j1 step 40 to {tmp_path}/exports/j1"
    loaded = export.load_export(str(tmp_path / "exports" / "j1"))
    assert loaded.record["step"] == 40 and loaded.record["task_args"]["width"] == 8
    for k, v in newest.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[k], v), k
    assert main(["export", "--job", "j1", "--store", str(tmp_path), "--step", "20",
                 "--export-dir", str(tmp_path / "at20")]) == 0
    assert json.loads((tmp_path / "at20" / "model.json").read_text())["step"] == 20


def test_export_from_an_s3_bucket(object_store, s3_bucket, monkeypatch):
    for k, v in LOCAL_CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    url = object_store.endpoint_url
    model = _checkpoint(open_store(f"s3://{s3_bucket}/checkpoints/j2", url), 10)
    assert main(["export", "--job", "j2", "--store", f"s3://{s3_bucket}", "--s3-endpoint-url", url]) == 0
    loaded = export.load_export(f"s3://{s3_bucket}/exports/j2", url)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[k], v), k


@pytest.mark.parametrize("args,says", [
    (["--job", "none"], r"checkpoints/none: no such directory"),
    (["--job", "j1", "--step", "30"], r"checkpoint step 30 is not usable \(no manifest.*\); steps there: 20"),
    (["--job", "old"], r"checkpoint step 5 holds no model record"),
    (["--job", "j1", "--export-dir", "FILE/ex"], r"--export-dir .*FILE/ex: cannot be written"),
    (["--job", "Bad_Name"], r"--job 'Bad_Name'"),
])
def test_bad_input_to_export_is_one_line_and_exit_2(tmp_path, capsys, args, says):
    _checkpoint(LocalStore(tmp_path / "checkpoints" / "j1"), 20)
    _checkpoint(LocalStore(tmp_path / "checkpoints" / "old"), 5, with_record=False)
    (tmp_path / "FILE").write_text("")
    args = [a.replace("FILE", str(tmp_path / "FILE")) for a in args]
    with pytest.raises(SystemExit) as exit_:
        main(["export", *args, "--store", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("export: error: ")
    assert re.search(says, err), err


def test_the_stacks_bucket_comes_from_its_outputs(tmp_path):
    outputs = tmp_path / "dev-outputs.json"   # a stack with its data layer up and its compute off
    outputs.write_text(json.dumps({"datasetsBucket": "rt-dev-datasets",
                                   "checkpointsBucket": "rt-dev-checkpoints",
                                   "ecrRepositoryUrl": "1.dkr.ecr.us-east-1.amazonaws.com/rt"}))
    a = argparse.Namespace(stack="dev", outputs=outputs, store=None, s3_endpoint_url=None,
                           location_required=True)
    assert checkpoints_root(a) == ("s3://rt-dev-checkpoints", None, "aws:dev")
    with pytest.raises(Exception, match="--stack and --store: give one"):
        checkpoints_root(argparse.Namespace(**{**vars(a), "store": "/x"}))
    with pytest.raises(Exception, match="say where the checkpoints are"):
        checkpoints_root(argparse.Namespace(**{**vars(a), "stack": None, "outputs": None}))
