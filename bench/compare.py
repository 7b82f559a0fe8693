"""Interleaved comparisons: run every contender once per repeat, in rotated order, and summarise."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench.stats import interleaved_order, median, ratio_summary


@dataclass(frozen=True)
class Contender:
    """One side of a comparison. `run` performs one measurement and returns its record, which must
    hold the compared metric; `config` describes the contender in the results."""

    name: str
    run: Callable[[], dict]
    config: dict = field(default_factory=dict)


# Keys of a run's record kept in the results (per-step arrays are summarised, not stored).
_KEPT = ("samples_per_sec", "window_s", "steps", "median_step_s", "torch_threads", "world_size", "batch_size",
         "cpus", "env", "summary_samples_per_sec", "checkpoints_written", "checkpoint_wait_s",
         "checkpoints_deferred", "checkpoint_write_max_s", "checkpoint_write_cpu_s", "run_id", "tokens_per_s",
         "mb_per_cpu_s", "command_mb_per_cpu_s")


def run_comparison(
    contenders: Sequence[Contender],
    baseline: str,
    repeats: int,
    metric: str = "samples_per_sec",
    progress: Callable[[str], None] = lambda _msg: None,
) -> dict:
    """Measure all contenders interleaved; returns raw samples, medians and median paired ratios to the
    baseline. Any failed run raises (a comparison with a missing sample would not be paired)."""
    by_name = {c.name: c for c in contenders}
    if len(by_name) != len(contenders):
        raise ValueError("contender names must be unique")
    if baseline not in by_name:
        raise ValueError(f"baseline {baseline!r} is not a contender")
    order = interleaved_order([c.name for c in contenders], repeats)
    samples: dict[str, list[float]] = {c.name: [] for c in contenders}
    runs: dict[str, list[dict]] = {c.name: [] for c in contenders}
    for i, (rep, name) in enumerate(order, 1):
        record = by_name[name].run()
        if metric not in record:
            raise ValueError(f"run of {name!r} returned no {metric!r}")
        samples[name].append(float(record[metric]))
        runs[name].append(summarise_run(record))
        progress(f"[{i}/{len(order)}] repeat {rep + 1} {name}: {metric}={record[metric]:.1f}")
    return {
        "metric": metric,
        "baseline": baseline,
        "repeats": repeats,
        "order": [name for _, name in order],
        "contenders": {
            c.name: {"config": c.config, "samples": samples[c.name], "median": median(samples[c.name]),
                     "runs": runs[c.name]}
            for c in contenders
        },
        "ratios": ratio_summary(samples, baseline),
    }


def summarise_run(record: dict) -> dict:
    out = {k: record[k] for k in _KEPT if k in record}
    if "step_times_s" in record and record["step_times_s"]:
        out["median_step_s"] = median(record["step_times_s"])
    return out
