"""Evaluation everywhere (issue 39 item 4): the printed summary shows the last evaluation and where the
weights came from; the report draws the evaluation points over the loss curve."""

from __future__ import annotations

from cluster.flow import Attempt, FlowResult, attempt_start, format_summary
from cluster.report import draw_evaluations, report_data
from tests.summaries import run_summary
from train.summary import format_eval


def _result(eval_metrics, metrics, **fields) -> FlowResult:
    summary = run_summary(steps=300, initial_loss=2.3, final_loss=0.4, eval=eval_metrics, **fields)
    attempt = Attempt(0, summary, ["host-0"], metrics=metrics)
    return FlowResult(job="image", succeeded=True, exit_code=0, attempts=[attempt], summary=summary,
                      metrics=metrics, reclaimed=[], storage=None)


def test_the_summary_shows_the_last_evaluation_and_the_export():
    text = format_summary(_result({"eval_top1": 0.878, "eval_samples": 180.0}, [],
                                  export="s3://p-checkpoints/exports/image"))
    assert "  evaluation         top-1 0.8780 (180 samples) (step 300)" in text
    assert "  export             s3://p-checkpoints/exports/image" in text
    lm = format_eval({"eval_loss": 2.0, "eval_perplexity": 7.389, "eval_tokens": 4096.0})
    assert lm == "loss 2.0000, perplexity 7.3890 (4096 tokens)"
    plain = format_summary(_result(None, []))
    assert "evaluation" not in plain and "export" not in plain


def test_the_summary_says_whether_init_from_or_a_resume_applied():
    init = {"uri": "runs/x/export", "applied": True, "loaded": 52, "missing": [], "unexpected": [],
            "mismatched": ["fc.weight", "fc.bias"]}
    assert attempt_start(run_summary(init_from=init)) == (
        "initialized from runs/x/export (52 tensors; 2 mismatched key(s) left as built)")
    assert attempt_start(run_summary(resumed_from_step=50, init_from={**init, "applied": False})) == (
        "resumed from step 50 (a resume wins over --init-from runs/x/export)")
    assert attempt_start(run_summary()) == "from scratch"
    assert "attempt 1: initialized from runs/x/export" in format_summary(_result(None, [], init_from=init))


def test_the_report_draws_evaluation_points_over_the_loss_curve():
    metrics = [{"step": 100, "loss": 1.0}, {"step": 100, "eval_top1": 0.5, "eval_samples": 180.0},
               {"step": 200, "loss": 0.5}, {"step": 200, "eval_top1": 0.8, "eval_loss": 0.6,
                                              "eval_samples": 180.0}]
    series = report_data(_result(None, metrics)).attempts[0]
    assert series.steps == [100, 200] and series.eval_steps == [100, 200]
    assert series.evals["eval_top1"] == [0.5, 0.8]

    from matplotlib.figure import Figure

    loss_ax = Figure().subplots()
    one = report_data(_result(None, [{"step": 5, "loss": 1.0}, {"step": 5, "eval_top1": 0.7,
                                                                "eval_loss": 0.9}])).attempts[0]
    draw_evaluations(loss_ax, [one], ["tab:blue"])
    on_loss = [line for line in loss_ax.get_lines() if line.get_marker() == "D"]
    assert [list(line.get_ydata()) for line in on_loss] == [[0.9]]        # the eval loss, beside the loss
    (right,) = [ax for ax in loss_ax.figure.axes if ax is not loss_ax]   # top-1 on an axis of its own
    assert [list(line.get_ydata()) for line in right.get_lines()] == [[0.7]]
    assert right.get_ylabel() == "top-1"


def test_a_launchers_log_rebuilds_the_report_with_curves(tmp_path):
    from cluster.report import result_from_log, write_run_report
    from train.metrics import metrics_line

    records = [{"step": 10, "loss": 2.0, "samples_per_sec": 100.0, "checkpoints": []},
               {"step": 20, "loss": 1.0, "samples_per_sec": 110.0, "checkpoints": [20]},
               {"step": 20, "eval_top1": 0.75, "eval_samples": 180.0}]
    summary = run_summary(steps=20, initial_loss=2.3, final_loss=1.0, eval={"eval_top1": 0.75},
                          checkpoints_written=1)
    lines = ["[1]<stderr>:noise", *(f"[0]<stdout>:{metrics_line(r)}" for r in records),
             f"[0]<stdout>:{summary.line()}"]
    result = result_from_log("j1", lines)
    assert result.succeeded and result.exit_code == 0 and result.summary == summary
    series = report_data(result).attempts[0]
    assert series.steps == [10, 20] and series.loss == [2.0, 1.0] and series.evals == {"eval_top1": [0.75]}
    files = write_run_report(result, tmp_path)
    assert "top-1 0.7500" in files.summary.read_text()
    failed = result_from_log("j1", ["Process 1 exit with status code 2."])
    assert failed.exit_code == 2 and not failed.succeeded and failed.summary is None
