"""Pure maths of the benchmarks: run order, medians, ratios. No timing, no processes."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


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


@dataclass(frozen=True)
class MedianInterval:
    low: float
    high: float
    confidence: float  # the interval's exact coverage, at least the confidence asked for


def median_interval(values: Sequence[float], confidence: float = 0.95) -> MedianInterval | None:
    """A distribution-free confidence interval for the median: the k-th smallest and k-th largest
    value, with k the largest rank whose binomial tail (each value falls below the true median with
    probability 1/2) keeps the coverage at `confidence` or more. None when there are too few values
    for any such interval (fewer than 6 at 95 %).

    Per-repeat ratios of identical runs swing by a few percent on a shared machine; this says how far
    their median could be from the one a long series would give, without assuming a distribution.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence}: must be between 0 and 1")
    n = len(values)
    ordered = sorted(values)
    tail, k = 0.0, 0  # tail: P(fewer than k of the n values fall below the median): a miss on one side
    while k < n // 2:
        next_tail = tail + math.comb(n, k) / 2**n
        if 1 - 2 * next_tail < confidence:
            break
        tail, k = next_tail, k + 1
    if k == 0:
        return None
    return MedianInterval(ordered[k - 1], ordered[n - k], 1 - 2 * tail)


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

