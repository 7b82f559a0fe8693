"""Pure maths of the benchmarks: run order, medians, ratios. No timing, no processes."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence


def interleaved_order(names: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """The order to run contenders in: every repeat runs each contender once, rotated by one per repeat.

    Rotation (A B C, B C A, C A B, ...) puts every contender in every slot equally often over a full
    cycle, so a machine that gets busier or quieter during the run (other jobs, thermal state) shifts
    all contenders alike instead of favouring whoever always runs first.
    """
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: must be >= 1")
    if not names:
        raise ValueError("no contenders to run")
    if len(set(names)) != len(names):
        raise ValueError(f"contender names must be unique: {list(names)}")
    n = len(names)
    return [(r, names[(r + i) % n]) for r in range(repeats) for i in range(n)]


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def paired_ratios(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """Per-repeat ratios numerator[i] / denominator[i]: samples taken in the same repeat share the
    machine's state at that time, so their ratio cancels most of the noise that both saw."""
    if len(numerator) != len(denominator):
        raise ValueError(f"unpaired samples: {len(numerator)} vs {len(denominator)}")
    if not numerator:
        raise ValueError("no samples to compare")
    if any(d <= 0 for d in denominator):
        raise ValueError(f"denominator samples must be positive: {list(denominator)}")
    return [n / d for n, d in zip(numerator, denominator, strict=True)]


def ratio_summary(samples: Mapping[str, Sequence[float]], baseline: str) -> dict[str, dict]:
    """For every contender but the baseline: its per-repeat ratios to the baseline and their median."""
    if baseline not in samples:
        raise ValueError(f"baseline {baseline!r} is not one of the contenders {sorted(samples)}")
    out = {}
    for name, values in samples.items():
        if name == baseline:
            continue
        per_repeat = paired_ratios(values, samples[baseline])
        out[name] = {"per_repeat": per_repeat, "median": median(per_repeat)}
    return out


def throughput(samples: int, seconds: float) -> float:
    if seconds <= 0:
        raise ValueError(f"elapsed time must be positive, got {seconds}")
    return samples / seconds

