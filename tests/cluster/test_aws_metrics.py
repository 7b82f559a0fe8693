"""Metrics from AWS (issue 39 item 3), through the kubectl stand-in: the trainer's records ride in the
launcher's log as RINGTRAIN_METRICS lines (--metrics-lines, which the AWS backend adds), so
`ringtrain run --backend aws` draws the same report with curves, `status --job` shows progress and
`ringtrain logs --run-dir` rebuilds the report afterwards."""

from __future__ import annotations

import json

import cluster.aws.stack as aws_stack
from cluster.cli import main
from cluster.report import report_data, write_run_report
from tests.cluster.kubectl_standin import JobScript
from tests.cluster.test_aws_backend import RecordingStack, aws_env, dev_exports, moto_aws  # noqa: F401
from tests.cluster.test_aws_lifecycle import JOB, backend_for, fake, flow  # noqa: F401
from tests.summaries import run_summary
from train.metrics import metrics_line

RECORDS = [{"step": 10, "loss": 2.0, "samples_per_sec": 800.0, "world_size": 8, "checkpoints": []},
           {"step": 20, "loss": 1.2, "samples_per_sec": 820.0, "world_size": 8, "checkpoints": [20]},
           {"step": 20, "eval_top1": 0.61, "eval_samples": 1000.0}]
SUMMARY = run_summary(steps=20, initial_loss=2.3, final_loss=1.2, checkpoints_written=1, world_size=8,
                      eval={"eval_top1": 0.61, "eval_samples": 1000.0})
LOG = ["[1]<stderr>:some warning", *(f"[0]<stdout>:{metrics_line(r)}" for r in RECORDS),
       f"[0]<stdout>:{SUMMARY.line()}"]


def test_the_aws_flow_brings_the_metrics_back_and_draws_the_curves(fake, dev_exports, tmp_path):  # noqa: F811
    fake.plan(JobScript(log=LOG, exit_code=0))
    backend, _, _ = backend_for(dev_exports, tmp_path)
    result, lines = flow(backend, JOB)
    assert result.succeeded, lines
    launcher = fake.mpijobs()[0]["manifest"]["spec"]["mpiReplicaSpecs"]["Launcher"]
    assert "--metrics-lines" in json.dumps(launcher), "the backend asks the trainer for its metrics lines"
    assert result.attempts[0].metrics == RECORDS
    series = report_data(result).attempts[0]
    assert series.steps == [10, 20] and series.loss == [2.0, 1.2] and series.evals == {"eval_top1": [0.61]}
    files = write_run_report(result, tmp_path / "run")
    assert "evaluation         top-1 0.6100 (1000 samples) (step 20)" in files.summary.read_text()
    assert len(files.metrics.read_text().splitlines()) == 3


def test_status_shows_progress_and_logs_rebuild_the_report(fake, dev_exports, tmp_path, monkeypatch,  # noqa: F811
                                                          capsys):
    fake.plan(JobScript(log=LOG, exit_code=0))
    backend, ops, _ = backend_for(dev_exports, tmp_path)
    handle = backend.submit(JOB)
    assert list(backend.logs(handle)) == LOG
    assert backend.progress(handle) == RECORDS[1]
    monkeypatch.setattr(aws_stack, "AutomationStack", lambda stack, create=False: ops)
    assert main(["status", "--stack", "dev", "--job", "life"]) == 0
    out = capsys.readouterr().out
    assert "step 20, loss 1.2000, 820.0 samples/s, 8 workers" in out, out
    run_dir = tmp_path / "rebuilt"
    assert main(["logs", "--stack", "dev", "--job", "life", "--run-dir", str(run_dir)]) == 0
    assert f"report {run_dir / 'report.png'}" in capsys.readouterr().out
    assert "loss               2.3000 -> 1.2000" in (run_dir / "summary.txt").read_text()
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == \
        [10, 20, 20]
