"""Preflight: the job's collective bandwidth, measured before training, against a floor.

A node with a degraded link (an EFA device down to a quarter of its bandwidth, skypilot issue 8391; a
misconfigured NCCL, torchtitan issue 915) does not fail: it slows every step of every rank. So before
the first step every job measures:

1. allreduce bus bandwidth across all its ranks, as nccl-tests defines it
   (nccl-tests doc/PERFORMANCE.md: algbw = bytes / time; busbw = algbw x 2(n-1)/n for allreduce, the
   figure comparable with the hardware's link speed whatever the rank count). NCCL on GPUs, Gloo on
   CPUs: whatever Horovod was built with.
2. when that is below the floor: each pair of hosts alone (an alltoall in which only the pair sends),
   to name the node. A host whose every pair is below the floor is the slow one; with two hosts the
   two ends of the one link are all that can be named. When every pair is above the floor, no link is
   slow and the job goes on: a busy CPU held the allreduce back (seen on a shared 2-core test machine:
   1.4 MB/s allreduce against a 5 MB/s floor, its one pair at 70 MB/s).

The floor is per instance type, from the catalog (infra/catalog.yaml, with its source), passed as
--preflight-min-busbw; without a floor the figure is measured and reported only. Elastic jobs skip it
(train/run.py preflight(): a joining worker's collectives would meet no others); the job flow runs it
before them as a static job, `--preflight-only`, and keeps a slow node out (cluster/preflight_gate.py).
"""

from __future__ import annotations

import itertools
import os
import socket
import statistics
import time
from dataclasses import dataclass, field

import torch

HOST_ENV = "HOROVOD_HOSTNAME"   # set per worker by horovodrun (gloo_run.py) and the MPI Operator's hostfile


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' allreduce busbw in bytes/s (pure): algbw x 2(n-1)/n; algbw = nbytes / seconds."""
    if ranks < 2 or seconds <= 0:
        return float("inf")
    return nbytes / seconds * 2 * (ranks - 1) / ranks


def pair_bandwidth(nbytes: int, seconds: float) -> float:
    """Bytes/s each way between two hosts that exchanged `nbytes` each in `seconds` (pure)."""
    return nbytes / seconds if seconds > 0 else float("inf")


def slow_hosts(pairs: dict[tuple[str, str], float], floor: float) -> list[str]:
    """The hosts every one of whose pairs is below `floor` (pure). Two hosts: both ends of their link."""
    hosts = sorted({h for pair in pairs for h in pair})
    slow = []
    for h in hosts:
        mine = [bw for pair, bw in pairs.items() if h in pair]
        if mine and all(bw < floor for bw in mine):
            slow.append(h)
    return slow


@dataclass
class PreflightResult:
    ranks: int
    nbytes: int
    busbw: float                          # bytes/s, nccl-tests' definition
    floor: float | None                   # bytes/s; None: report only
    pairs: dict[tuple[str, str], float] = field(default_factory=dict)   # measured when below the floor
    slow: list[str] = field(default_factory=list)

    @property
    def links_clear(self) -> bool:
        """The allreduce was below the floor, yet every pair of hosts, measured alone, is above it: no
        link is slow (a busy CPU held the allreduce back, as on a shared test machine)."""
        return self.floor is not None and bool(self.pairs) and min(self.pairs.values()) >= self.floor

    @property
    def passed(self) -> bool:
        return self.floor is None or self.busbw >= self.floor or self.links_clear

    def record(self) -> dict:
        """For the summary and the report (GB/s, as nccl-tests prints)."""
        return {"busbw_gbps": round(self.busbw / 1e9, 4), "bytes": self.nbytes, "ranks": self.ranks,
                "floor_gbps": None if self.floor is None else round(self.floor / 1e9, 4),
                "passed": self.passed, "slow_hosts": self.slow,
                "pairs_gbps": {f"{a}-{b}": round(bw / 1e9, 4) for (a, b), bw in self.pairs.items()}}

    def describe(self) -> str:
        floor = "no floor set" if self.floor is None else f"floor {self.floor / 1e9:.3g} GB/s"
        text = (f"preflight: allreduce busbw {self.busbw / 1e9:.3g} GB/s over {self.ranks} ranks at "
                f"{self.nbytes / 2**20:.0f} MiB ({floor})")
        pairs = ", ".join(f"{a}-{b} {bw / 1e9:.3g}" for (a, b), bw in sorted(self.pairs.items()))
        if self.links_clear:
            text += f": below the floor, but every pair of hosts is above it (pairs, GB/s: {pairs}): passed"
        elif not self.passed:
            where = " and ".join(self.slow) if self.slow else "no single host (every pair is slow)"
            text += f": BELOW THE FLOOR; slow: {where} (pairs, GB/s: {pairs})"
        return text


def _timed(fn, iters: int, device: torch.device, slowest, budget_s: float = 3.0) -> float:
    """Median seconds of `fn()` (a collective) over up to `iters` runs after one warm-up, fewer when the
    warm-up says they would take over `budget_s` (a slow link must not make the preflight slow).
    `slowest(x)`: the largest x over the ranks, so that every rank runs the same count."""

    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    warm = slowest(once())
    count = max(1, min(iters, int(budget_s / max(warm, 1e-9))))
    return statistics.median(once() for _ in range(count))


def host_name() -> str:
    """This worker's host as the job names it: the pod (first DNS label of horovodrun's host name: the MPI
    Operator's `<job>-worker-<i>.<job>.<namespace>.svc`), else the machine's name."""
    return (os.environ.get(HOST_ENV) or socket.gethostname()).split(".")[0]


def measure(hvd, nbytes: int, floor: float | None, device: torch.device, iters: int = 5) -> PreflightResult:
    """Every rank calls this at the same point (it runs collectives)."""
    n = hvd.size()
    count = max(1, nbytes // 4)
    buf = torch.ones(count, dtype=torch.float32, device=device)

    def slowest(x: float) -> float:
        return float(hvd.allreduce(torch.tensor([x]), op=hvd.Max, name="ringtrain.preflight.slowest").item())

    seconds = _timed(lambda: hvd.allreduce(buf, op=hvd.Sum, name="ringtrain.preflight.allreduce"),
                     iters, device, slowest)
    seconds = slowest(seconds)   # every rank agrees on the figure, and so on the verdict
    result = PreflightResult(ranks=n, nbytes=count * 4, busbw=bus_bandwidth(count * 4, seconds, n),
                             floor=floor)
    if result.passed or n < 2:
        return result
    hosts = hvd.allgather_object(host_name(), name="ringtrain.preflight.hosts")
    first_rank = {}
    for rank, h in enumerate(hosts):
        first_rank.setdefault(h, rank)
    pairs: dict[tuple[str, str], float] = {}
    for a, b in itertools.combinations(sorted(first_rank), 2):
        ra, rb = first_rank[a], first_rank[b]
        me = hvd.rank()
        splits = torch.zeros(n, dtype=torch.int32)
        if me in (ra, rb):
            splits[rb if me == ra else ra] = count
        data = torch.ones(int(splits.sum().item()), dtype=torch.float32, device=device)
        t = _timed(lambda d=data, s=splits: hvd.alltoall(d, splits=s, name="ringtrain.preflight.pair"),
                   max(1, iters // 2), device, slowest)
        t = slowest(t if me in (ra, rb) else 0.0)
        pairs[(a, b)] = pair_bandwidth(count * 4, t)
    result.pairs = pairs
    # a pair's one-way rate against the allreduce floor: a ring allreduce moves 2(n-1)/n of the buffer
    # over each link, so its busbw is what one link sustains; the same floor applies to a pair.
    result.slow = slow_hosts(pairs, floor) if floor is not None else []
    return result
