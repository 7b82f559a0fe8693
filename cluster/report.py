"""The run report: what `ringtrain run` leaves in the run's directory beside the printed summary.

    files = write_run_report(result, Path("runs/demo-20261206-060000"), costs)
    files.picture   # report.png: loss and samples/s per step, checkpoints, the reclaim and the resume
    files.summary   # summary.txt: the printed summary (and, on AWS, node-hours and cost)
    files.metrics   # metrics.jsonl: every attempt's metrics records, each tagged with its attempt
                    # (an elastic job's preflight job, cluster/preflight_gate.py, as attempt 0)

The picture is drawn from the trainer's metrics records (`--metrics-file`, JSON lines) and the flow's
attempts (cluster/flow.py). Backends that do not bring the metrics back (AWS: they stay on the rank-0
pod) get a picture of the attempts' outcome without the curves, and say so on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.flow import Attempt, FlowResult, format_summary
from cluster.run_cost import NodeGroupCost, format_costs
from train.contract import EXIT_INTERRUPTED_RESUMABLE
from train.summary import EVAL_COUNTS, RunSummary, eval_name

PICTURE_NAME = "report.png"
SIZE_INCHES = (10.0, 7.0)
DPI = 100


@dataclass
class AttemptSeries:
    """One attempt's curves and marks, in steps."""

    number: int
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    samples_per_sec: list[float] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    resumed_from: int | None = None
    # evaluation records: their steps and metrics (eval_top1, eval_loss, ...; counts left out)
    eval_steps: list[int] = field(default_factory=list)
    evals: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class ReportData:
    attempts: list[AttemptSeries]
    reclaims: list[tuple[int, str]]   # (step, host)
    title: str


def _checkpoint_steps(records: list[dict[str, Any]], summary: RunSummary | None) -> list[int]:
    """The steps of the checkpoints an attempt took: each record lists those taken since the previous
    one (`checkpoints`); the last is taken after the last record, at the attempt's last step, unless
    one is already there (train/trainer.py, after the loop), so an attempt that wrote any ends on one."""
    steps = {int(step) for r in records for step in r.get("checkpoints") or ()}
    if summary is not None and summary.checkpoints_written:
        steps.add(summary.steps)
    return sorted(steps)


def report_data(result: FlowResult) -> ReportData:
    """What the picture shows, from the flow's result (pure)."""
    series = []
    for number, attempt in enumerate(result.attempts, 1):
        records = [r for r in attempt.metrics if "loss" in r and "step" in r]   # not evaluation records
        resumed_from = attempt.summary.resumed_from_step if attempt.summary is not None else None
        s = AttemptSeries(number=number, resumed_from=resumed_from,
                          checkpoints=_checkpoint_steps(attempt.metrics, attempt.summary))
        for r in records:
            s.steps.append(int(r["step"]))
            s.loss.append(float(r["loss"]))
            s.samples_per_sec.append(float(r.get("samples_per_sec", float("nan"))))
        for r in attempt.metrics:
            names = [k for k in r if k.startswith("eval_") and k not in EVAL_COUNTS]
            if "step" not in r or not names:
                continue
            s.eval_steps.append(int(r["step"]))
            for k in names:   # (every evaluation of a task reports the same metrics)
                s.evals.setdefault(k, []).append(float(r[k]))
        series.append(s)
    state = "done" if result.succeeded else "FAILED"
    title = (f"job {result.job}: {state} (exit code {result.exit_code}, "
             f"{len(result.attempts)} attempt(s))")
    # A stop aborts a periodic write in flight (its checkpoint replaces it): the records list that
    # write when it started, so say that one mark is not in the store.
    aborted = sum(a.summary.checkpoints_aborted for a in result.attempts if a.summary is not None)
    if aborted:
        title += f"\n{aborted} marked checkpoint write(s) aborted by a stop, not in the store"
    return ReportData(series, [(r.step, r.host) for r in result.reclaims], title)


def draw(data: ReportData, path: Path, costs: list[NodeGroupCost] | None = None) -> Path:
    """Write the picture as PNG."""
    fig = figure(data, costs)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def figure(data: ReportData, costs: list[NodeGroupCost] | None = None):
    """The picture: loss above, samples/s below, on matplotlib's Agg canvas (no display, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=SIZE_INCHES, dpi=DPI)
    FigureCanvasAgg(fig)
    loss_ax, speed_ax = fig.subplots(2, 1, sharex=True)
    fig.suptitle(data.title)
    colours = ["tab:blue", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
    has_curves = any(s.steps for s in data.attempts)
    for s in data.attempts:
        colour = colours[(s.number - 1) % len(colours)]
        label = f"attempt {s.number}" + (f" (resumed from {s.resumed_from})" if s.resumed_from else "")
        if s.steps:
            loss_ax.plot(s.steps, s.loss, color=colour, marker=".", label=label)
            speed_ax.plot(s.steps, s.samples_per_sec, color=colour, marker=".", label=label)
        for i, step in enumerate(s.checkpoints):
            for ax in (loss_ax, speed_ax):
                ax.axvline(step, color="grey", linestyle=":", linewidth=1,
                           label="checkpoint" if i == 0 and s.number == 1 and ax is loss_ax else None)
        if s.resumed_from is not None:
            for ax in (loss_ax, speed_ax):
                ax.axvline(s.resumed_from, color="tab:green", linestyle="--", linewidth=2,
                           label=f"resume (attempt {s.number})" if ax is loss_ax else None)
    draw_evaluations(loss_ax, data.attempts, colours)
    for step, host in data.reclaims:
        for ax in (loss_ax, speed_ax):
            ax.axvline(step, color="tab:red", linestyle="--", linewidth=2,
                       label=f"reclaim {host}" if ax is loss_ax else None)
    loss_ax.set_ylabel("loss")
    speed_ax.set_ylabel("samples/s")
    speed_ax.set_xlabel("step")
    for ax in (loss_ax, speed_ax):
        ax.grid(True, alpha=0.3)
    if not has_curves:
        loss_ax.text(0.5, 0.5, "no per-step metrics from this backend", transform=loss_ax.transAxes,
                     ha="center", va="center")
    if loss_ax.get_legend_handles_labels()[0]:
        loss_ax.legend(loc="upper right", fontsize="small")
    if costs:
        fig.text(0.01, 0.005, format_costs(costs).strip(), fontsize="x-small", va="bottom",
                 family="monospace", parse_math=False)   # "$" is money here, not TeX
    fig.tight_layout(rect=(0, 0.06 if costs else 0, 1, 1))
    return fig


def draw_evaluations(loss_ax, attempts: list[AttemptSeries], colours: list[str]) -> None:
    """Evaluation points over the loss curve: an evaluation loss on the loss axis, the other metrics
    (top-1, perplexity) on an axis of their own on the right; diamonds, labelled with their value."""
    other_ax = None
    for s in attempts:
        colour = colours[(s.number - 1) % len(colours)]
        for name, values in s.evals.items():
            label = f"{eval_name(name)} (eval, attempt {s.number})"
            if name == "eval_loss":
                ax = loss_ax
            else:
                other_ax = other_ax or loss_ax.twinx()
                other_ax.set_ylabel(", ".join(eval_name(n) for n in s.evals if n != "eval_loss"))
                ax = other_ax
            ax.plot(s.eval_steps, values, color=colour, marker="D", linestyle="--", linewidth=1, label=label)
            ax.annotate(f"{values[-1]:.3f}", (s.eval_steps[-1], values[-1]), textcoords="offset points",
                        xytext=(4, 4), fontsize="small", color=colour)
    if other_ax is not None and other_ax.get_legend_handles_labels()[0]:
        other_ax.legend(loc="center right", fontsize="small")


@dataclass(frozen=True)
class RunFiles:
    picture: Path
    summary: Path
    metrics: Path


def result_from_log(job: str, lines: list[str]) -> FlowResult:
    """A finished job's result rebuilt from its launcher's log (pure): the summary line and the
    `--metrics-lines` records in it (train/metrics.py), as one attempt. `ringtrain logs --run-dir`
    draws the report from it after the run."""
    from cluster.exit_codes import worker_exit_codes
    from train.metrics import metrics_from_log
    from train.summary import last_summary

    summary = last_summary(lines)
    if summary is not None:
        code = EXIT_INTERRUPTED_RESUMABLE if summary.interrupted else 0
    else:  # no summary: the first worker's failure, if the log says
        code = next((c for c in worker_exit_codes(lines).values() if c), None)
    metrics = metrics_from_log(lines)
    attempt = Attempt(code, summary, [], metrics=metrics)
    return FlowResult(job=job, succeeded=code == 0, exit_code=code, attempts=[attempt], summary=summary,
                      metrics=metrics, reclaimed=[], storage=None)


def write_run_report(result: FlowResult, run_dir: Path,
                     costs: list[NodeGroupCost] | None = None) -> RunFiles:
    """Write the picture, the summary and every attempt's metrics into `run_dir` (created)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics = run_dir / "metrics.jsonl"
    numbered = [(0, result.preflight)] if result.preflight is not None else []
    with metrics.open("w") as f:
        for number, attempt in [*numbered, *enumerate(result.attempts, 1)]:
            for record in attempt.metrics:
                f.write(json.dumps({"attempt": number, **record}) + "\n")
    summary = run_dir / "summary.txt"
    text = format_summary(result)
    if costs:
        text += "\n" + format_costs(costs)
    summary.write_text(text + "\n")
    picture = draw(report_data(result), run_dir / PICTURE_NAME, costs)
    return RunFiles(picture=picture, summary=summary, metrics=metrics)
