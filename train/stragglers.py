"""Stragglers: each rank's own step time, gathered into the metrics, and who is slowest.

In synchronous data parallelism every rank waits for the slowest at each allreduce, so the job's step
time is the slowest rank's. What tells a straggler apart is the time a rank spends on its own work
(data, forward, backward) before it waits for the others: each rank measures that, rank 0 gathers them
at each metrics record (one small allgather every --log-every steps) and the report names the slowest.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any


class OwnTime:
    """One rank's time on its own work per step, averaged over a metrics window."""

    def __init__(self) -> None:
        self._sum = 0.0
        self._n = 0
        self._t0: float | None = None

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self._t0 is not None:
            self._sum += time.perf_counter() - self._t0
            self._n += 1
            self._t0 = None

    def take_mean(self) -> float:
        mean = self._sum / self._n if self._n else 0.0
        self._sum, self._n = 0.0, 0
        return mean


def straggler_fields(per_rank: Sequence[float]) -> dict[str, Any]:
    """The metrics record's fields for one window (pure): every rank's own step time in seconds, the
    slowest rank, and its time over the median rank's."""
    times = [float(t) for t in per_rank]
    if not times:
        return {}
    slowest = max(range(len(times)), key=times.__getitem__)
    median = statistics.median(times)
    return {"rank_step_s": [round(t, 6) for t in times], "slowest_rank": slowest,
            "straggle": round(times[slowest] / median, 4) if median > 0 else 1.0}


def describe(records: Sequence[dict[str, Any]]) -> str | None:
    """One line for the summary and the report, over a run's records (pure): the spread of the ranks'
    own step times and the rank that was slowest most often."""
    windows = [r["rank_step_s"] for r in records if r.get("rank_step_s")]
    if not windows:
        return None
    counts: dict[int, int] = {}
    for w in windows:
        slowest = max(range(len(w)), key=w.__getitem__)
        counts[slowest] = counts.get(slowest, 0) + 1
    rank = max(counts, key=counts.__getitem__)
    mine = [w[rank] for w in windows if rank < len(w)]
    medians = [statistics.median(w) for w in windows]
    spread = statistics.median([max(w) / min(w) for w in windows if min(w) > 0] or [1.0])
    return (f"rank {rank} slowest in {counts[rank]} of {len(windows)} windows "
            f"({statistics.median(mine) * 1e3:.1f} ms own time per step against a median rank's "
            f"{statistics.median(medians) * 1e3:.1f} ms); spread max/min {spread:.2f}x")
