"""The hang watchdog: a rank that sees no step complete in time says where it waits and exits.

A frozen peer (a node that stopped answering, a wedged GPU, a dead link without a reset) leaves every
other rank blocked inside a collective. NCCL has no timeout by default (NCCL issue 1324) and Gloo's is
minutes, so without a watchdog the job hangs on paid GPUs until someone notices (skypilot issue 7117).

The limit is max(K x the median of recent step times, T): K tolerates the slow steps a run has anyway
(a checkpoint copy, a straggler), T the time before enough steps are known. Evaluation and checkpoint
writes pause it. When it fires it writes every thread's stack (faulthandler) and the collective the
training thread waits in, then exits EXIT_HUNG, which the launcher restarts from the newest checkpoint
(cluster/recovery.py). It watches step progress, not a collective's own timer, so it covers NCCL on
GPUs and Gloo alike.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TextIO

from train.contract import EXIT_HUNG

RECENT_STEPS = 50   # the median is over this many recent step times
MIN_STEPS = 5       # fewer known steps: the limit is T alone


def hang_limit_s(step_times: list[float], factor: float, floor_s: float) -> float:
    """max(factor x median step time, floor_s); floor_s alone until MIN_STEPS steps are known (pure)."""
    if len(step_times) < MIN_STEPS:
        return floor_s
    return max(factor * statistics.median(step_times), floor_s)


class Watchdog:
    """Started by the trainer before its loop; `beat()` after each step, `waiting_in(name)` around the
    collectives, `paused()` around evaluation and checkpoint waits."""

    def __init__(self, *, factor: float, floor_s: float, rank: int,
                 clock: Callable[[], float] = time.monotonic, stream: TextIO | None = None,
                 on_hang: Callable[[], None] | None = None):
        if factor <= 0 or floor_s < 0:
            raise ValueError("factor must be > 0 and floor_s >= 0")
        self.enabled = floor_s > 0   # 0: no watchdog (--hang-timeout 0)
        self.factor, self.floor_s, self.rank = factor, floor_s, rank
        self._clock = clock
        self._stream = stream
        self._on_hang = on_hang or (lambda: os._exit(EXIT_HUNG))
        self._times: deque[float] = deque(maxlen=RECENT_STEPS)
        self._last = clock()
        self._step: int | None = None
        self._where = "the training loop"
        self._paused = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the trainer's side
    def beat(self, step: int) -> None:
        now = self._clock()
        with self._lock:
            if self._step is not None:
                self._times.append(now - self._last)
            self._last, self._step = now, step

    @contextlib.contextmanager
    def waiting_in(self, name: str) -> Iterator[None]:
        previous, self._where = self._where, name
        try:
            yield
        finally:
            self._where = previous

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            self._paused += 1
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1
                self._last = self._clock()  # the pause does not count as a slow step

    # ------------------------------------------------------------------ the watching side
    def limit_s(self) -> float:
        with self._lock:
            return hang_limit_s(list(self._times), self.factor, self.floor_s)

    def hung(self) -> str | None:
        """The watchdog's message if no step completed within the limit, else None."""
        with self._lock:
            if self._paused:
                return None
            waited = self._clock() - self._last
            times = list(self._times)
            step = self._step
        limit = hang_limit_s(times, self.factor, self.floor_s)
        if waited <= limit:
            return None
        median = f"{statistics.median(times):.3f} s" if len(times) >= MIN_STEPS else "not known yet"
        after = f"step {step}" if step is not None else "the start"
        return (f"train: error: rank {self.rank} hung: no step completed for {waited:.1f} s after {after} "
                f"(limit max({self.factor:g} x median step time {median}, {self.floor_s:g} s)); "
                f"waiting in {self._where}; every thread's stack is above; exiting {EXIT_HUNG} (restartable)")

    def start(self) -> None:
        """Arm it (once the first step is done: that one may compile or connect for minutes)."""
        if not self.enabled or self._thread is not None:
            return
        self._last = self._clock()
        self._thread = threading.Thread(target=self._watch, name="ringtrain-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._stop = threading.Event()   # an elastic reset re-enters the loop and may start it again

    def _watch(self) -> None:
        period = min(1.0, self.floor_s / 4)
        while not self._stop.wait(period):
            message = self.hung()
            if message is None:
                continue
            stream = self._stream or sys.stderr
            faulthandler.dump_traceback(file=stream, all_threads=True)
            print(message, file=stream, flush=True)
            self._on_hang()
            return
