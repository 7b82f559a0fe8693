"""Run the real trainer (`python -m train`) under horovodrun, exactly as the backends launch it, and
read its steady-state throughput from its own metrics over a chosen step window."""

from __future__ import annotations

import json
import statistics
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.image_loop import ImageShape
from bench.launch import BenchError, run_command, venv_bin
from bench.lm_loop import LmShape
from bench.peer import HorovodSettings, LoopShape
from bench.stats import median_interval
from cluster.job import JobSpec, trainer_config
from cluster.launch import horovodrun_command
from infra.storage_layout import checkpoint_uri

LOG_EVERY = 10  # the trainer's metrics cadence; the timed window starts and ends on logged steps


def window_rate(records: list[dict], start_step: int, end_step: int, samples_per_step: int) -> float:
    """Samples/s between two logged steps, from the trainer's own records (their "time" is taken on
    rank 0 after the step's loss allreduce, i.e. when every rank has finished that step)."""
    if end_step <= start_step:
        raise ValueError(f"empty window: steps {start_step}..{end_step}")
    by_step = {int(r["step"]): float(r["time"]) for r in records if "step" in r and "time" in r}
    missing = [s for s in (start_step, end_step) if s not in by_step]
    if missing:
        raise ValueError(f"no metrics record for step(s) {missing} (logged: {sorted(by_step)[:8]}...)")
    elapsed = by_step[end_step] - by_step[start_step]
    if elapsed <= 0:
        raise ValueError(f"non-increasing record times between steps {start_step} and {end_step}")
    return (end_step - start_step) * samples_per_step / elapsed


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class TrainerRun:
    """One trainer configuration to run; `checkpoint_every` 0 means no checkpoint store at all;
    `settings` None means the trainer's own defaults (no tuning flag or environment at all)."""

    shape: LoopShape | ImageShape | LmShape  # the demo task on synthetic data, the image or the lm task
    settings: HorovodSettings | None
    checkpoint_every: int
    endpoint_url: str | None = None
    bucket: str | None = None
    log_every: int = LOG_EVERY

    def __post_init__(self) -> None:
        if self.shape.warmup % self.log_every or self.shape.steps % self.log_every:
            raise ValueError(f"warmup and steps must be multiples of {self.log_every} (the metrics cadence)")
        if self.checkpoint_every and not (self.endpoint_url and self.bucket):
            raise ValueError("checkpoints need the object store's endpoint and a bucket")

    def trainer_args(self, metrics_file: Path, run_id: str) -> list[str]:
        s, h = self.shape, self.settings
        args = [*s.trainer_task_args(), "--batch-size", str(s.batch_size), "--steps", str(s.warmup + s.steps),
                "--metrics-file", str(metrics_file), "--log-every", str(self.log_every), "--no-progress"]
        if h is not None:
            args += ["--compression", h.compression]
            if h.cycle_time_ms is not None:
                args += ["--cycle-time-ms", f"{h.cycle_time_ms:g}"]
            if h.fusion_mb is not None:
                args += ["--fusion-threshold-mb", f"{h.fusion_mb:g}"]
            if not h.pin:  # the trainer pins CPU workers by default
                args += ["--cpu-affinity", "off"]
        if self.checkpoint_every:
            args += ["--checkpoint-dir", checkpoint_uri(self.bucket, run_id),
                     "--checkpoint-every", str(self.checkpoint_every), "--s3-endpoint-url", self.endpoint_url]
        return args

    def env(self, store_env: dict[str, str]) -> dict[str, str]:
        # Knobs the trainer has flags for go as flags (above); threads and autotune have none.
        knobs = {k: v for k, v in (self.settings.env() if self.settings else {}).items()
                 if k not in ("HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD")}
        return {**store_env, **knobs}

    def run(self, label: str, workdir: Path, store_env: dict[str, str], timeout_s: float) -> dict:
        from train.summary import parse_summary

        run_id = f"{label}-{uuid.uuid4().hex[:8]}"
        metrics_file = workdir / f"{run_id}.jsonl"
        job = JobSpec(name="bench", num_hosts=1, slots_per_host=self.shape.workers,
                      trainer=trainer_config(self.trainer_args(metrics_file, run_id)))
        cmd = horovodrun_command(job, hosts=["localhost"], python=sys.executable)
        cmd[0] = venv_bin("horovodrun")
        out = run_command(label, cmd, self.env(store_env), timeout_s)
        try:
            summary = parse_summary(out)
            records = read_metrics(metrics_file)
            world = int(summary.world_size)
            rate = window_rate(records, self.shape.warmup, self.shape.warmup + self.shape.steps,
                               world * self.shape.batch_size)
        except (ValueError, KeyError) as e:
            raise BenchError(f"{label}: could not read the trainer's results: {e}") from None
        return {
            "samples_per_sec": rate,
            "window_s": self.shape.steps * world * self.shape.batch_size / rate,
            "steps": self.shape.steps,
            "world_size": world,
            "batch_size": self.shape.batch_size,
            "summary_samples_per_sec": summary.samples_per_sec,
            "checkpoints_written": summary.checkpoints_written,
            # training time spent waiting for the previous checkpoint's write (see train.checkpoint.writer)
            "checkpoint_wait_s": summary.checkpoint_wait_s,
            # periodic checkpoints due while the previous write went on, taken late (train.trainer)
            "checkpoints_deferred": summary.checkpoints_deferred,
            "checkpoint_write_max_s": summary.checkpoint_write_max_s,
            "checkpoint_write_cpu_s": summary.checkpoint_write_cpu_s,  # the writer process's CPU
            "cpus": summary.cpu_affinity,  # rank 0's cores, as the trainer pinned them (or None)
            "run_id": run_id,
            "records": records,
        }


def step_durations(records: list[dict]) -> dict[int, float]:
    """step -> seconds since the previous step, from per-step metrics records (--log-every 1)."""
    times = {int(r["step"]): float(r["time"]) for r in records}
    return {s: t - times[s - 1] for s, t in times.items() if s - 1 in times}


def stall_estimate(runs: list[dict[int, float]], checkpoint_steps: list[int], every: int,
                   write_s: float = 0.0, after: int | None = None) -> dict:
    """Training time lost per checkpoint, from per-step durations of runs that checkpoint every `every`
    steps, after each step in `checkpoint_steps`; `write_s` is the longest write the trainer reported.

    Each checkpoint is measured against its own interval. Its "after" steps hold the copy on the
    training thread and whatever the write takes from training while it runs: the fewest steps, at
    least half the interval, whose time covers the longest write after every checkpoint. The rest of
    the interval, up to the next checkpoint, is its baseline: the loss is the time of the after steps
    less as many baseline steps (their mean). The two parts run back to back in the same processes,
    so a machine that gets busier or quieter over a run shifts both alike; the figure is the median
    over all checkpoints of all runs (a neighbour's burst hits one checkpoint, not the median). When
    no such split leaves a fifth of the interval for the baseline, the write outlasts what can be
    measured: `write_within_after` is False and the figure is a lower bound. `after` fixes the after
    steps instead: the same estimate over runs that wrote no checkpoints (at the same steps) reads
    what the method finds where there is nothing to find.

    `lost_interval_s`: a distribution-free 95 % interval for that median (stats.median_interval),
    None with fewer than 6 checkpoints.

    Also, position p (1..every) is the p-th step after a checkpoint: its excess is the median over all
    checkpoints of its duration, less the median baseline step (`baseline_step_s`); the first
    position's excess is what the training thread pays itself.
    """
    if every < 4:
        raise ValueError(f"every={every}: need at least 4 steps between checkpoints to find a baseline")
    windows = []
    for durations in runs:
        for c in checkpoint_steps:
            window = [durations.get(c + p) for p in range(1, every + 1)]
            if None in window:
                missing = [c + p for p, d in enumerate(window, 1) if d is None]
                raise ValueError(f"no step durations for steps {missing[:5]} after checkpoint step {c} "
                                 f"(positions 1..{every} are needed)")
            windows.append(window)
    if not windows:
        raise ValueError("no checkpoints to measure")
    longest_after = every - max(1, every // 5)
    if after is not None:
        if not 1 <= after <= longest_after:
            raise ValueError(f"after={after}: must be 1..{longest_after} for every={every}")
        contained = True
    else:
        after = next((k for k in range(every // 2, longest_after + 1)
                      if all(sum(w[:k]) > write_s for w in windows)), None)
        contained = after is not None
        if after is None:
            after = longest_after
    lost = [sum(w[:after]) - after * statistics.fmean(w[after:]) for w in windows]
    baseline = statistics.median(d for w in windows for d in w[after:])
    excess = [statistics.median(w[p] for w in windows) - baseline for p in range(every)]
    interval = median_interval(lost)
    return {
        "baseline_step_s": baseline,
        "first_step_excess_s": excess[0],
        "lost_per_checkpoint_s": statistics.median(lost),
        "lost_per_checkpoint_samples_s": lost,
        "lost_interval_s": None if interval is None else [interval.low, interval.high],
        "after_steps": after,
        "write_within_after": contained,
        "excess_by_position_s": excess,
        "checkpoints_measured": len(lost),
    }
