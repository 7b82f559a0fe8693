"""The trainer's checkpoints: when one is taken (the save policy and its deferral), the writer process
that takes it (rank 0's), the stop budget a stop's checkpoint has, and the counters the run's summary
reports. The trainer says what the state is; this decides what happens to it.

Rank 0 alone writes; the others only follow the same calls (every rank makes them at the same steps),
so nothing here is a collective.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterable

from torch import Tensor

from train.checkpoint.store import CheckpointStore, CheckpointWarning, Found
from train.checkpoint.writer import CheckpointWriter
from train.config import CheckpointConfig
from train.stop import stop_budget_s
from train.storage import open_store


class Checkpointer:
    def __init__(self, cfg: CheckpointConfig, endpoint_url: str | None, hvd, node_cpus: tuple[int, ...],
                 state_bytes: Callable[[], int]):
        """`state_bytes`: the size of the training state now (for the stop budget's estimates)."""
        self.cfg = cfg
        self.endpoint_url = endpoint_url
        self.hvd = hvd
        self.node_cpus = node_cpus  # the writer process may run on any core the node's workers share
        self.state_bytes = state_bytes
        self.store: CheckpointStore | None = None  # None: this run takes no checkpoints
        self._writer: CheckpointWriter | None = None
        self.resumed_write_rate: float | None = None  # bytes/s the resumed checkpoint's write reached
        self.stop_budget_s = stop_budget_s()
        self._slow_write_warned = False
        # By writers already closed (elastic mode may start several).
        self.written = 0
        self.wait_s = 0.0
        self.write_max_s = 0.0
        self.write_cpu_s = 0.0
        self.aborted = 0
        # Periodic checkpoints due while the previous one was still being written, taken at the first
        # step after it (rank 0; see save), and the most steps one of them was late.
        self.deferred = 0
        self.deferred_steps_max = 0
        self._deferred_since: int | None = None  # the due step of the checkpoint deferred now
        self._steps: list[int] = []  # taken by rank 0 since the last metrics record

    @property
    def enabled(self) -> bool:
        return self.store is not None

    def open(self) -> Found | None:
        """Open the store (raises BadInput); on rank 0 find the checkpoint to resume and start the
        writer process now, so its start-up overlaps the model build. None elsewhere."""
        if not self.cfg.uri:
            return None
        store = open_store(self.cfg.uri, self.endpoint_url)
        store.check(create=True)
        self.store = CheckpointStore(store, self.cfg.keep)
        if self.hvd.rank() != 0:
            return None
        found = self.store.latest_valid()
        self.resumed_write_rate = found.write_rate if found else None
        _ = self.writer
        return found

    @property
    def writer(self) -> CheckpointWriter | None:
        """Rank 0's writer process, started on first use (elastic: when this process becomes rank 0)."""
        if self._writer is None and self.store is not None and self.hvd.rank() == 0:
            self._writer = CheckpointWriter(self.store.store.uri, self.endpoint_url, self.cfg.keep,
                                            self.cfg.mode, cpus=self.node_cpus)
        return self._writer

    def wait_ready(self) -> None:
        if self.writer is not None:
            self.writer.wait_ready()

    # ---- the policy -------------------------------------------------------------------------
    def due(self, step: int, last: bool) -> bool:
        """A periodic checkpoint is due after `step`: every --checkpoint-every steps, not at the last
        step (the final checkpoint is finishing's), or a deferred one still waiting."""
        if self.store is None or not self.cfg.every or last:
            return False
        return step % self.cfg.every == 0 or self._deferred_since is not None

    def save(self, step: int, state: Callable[[], dict], forward_changes: Callable[[], Iterable[Tensor]],
             *, copy_overlaps_step: bool, defer_while_busy: bool = False) -> bool:
        """Rank 0 hands the state to its writer process, which writes it (train.checkpoint.writer); no
        collective (the random streams need no saving, see trainer.seed_step). False when rank 0
        deferred it.

        `defer_while_busy` (periodic checkpoints): while the previous checkpoint is still being
        written, training goes on and the loop calls again at the next step; the checkpoint is taken
        at the first step after that write. Waiting for it was the whole gap between the trainer and a
        bare Horovod loop where writes come as often as they take (bench/'s headline section measures
        it). The final and safety checkpoints wait.
        `copy_overlaps_step`: a pinned copy may run beside the next step's passes (trainer.build)."""
        if self.hvd.rank() != 0:
            return True
        busy = self.writer.busy()
        self._warn_if_writes_outlast_a_stop(self.writer.write_s_max, "a checkpoint write took")
        if defer_while_busy and busy:
            self._defer(step)
            return False
        if self._deferred_since is not None:
            self.deferred_steps_max = max(self.deferred_steps_max, step - self._deferred_since)
            self._deferred_since = None
        self.writer.submit(step, state(), forward_changes=forward_changes())
        self._steps.append(step)
        if not copy_overlaps_step:
            self.writer.copied()
        return True

    def copied(self) -> None:
        """The step's passes are done: the last checkpoint's copy that ran beside them is handed over."""
        if self._writer is not None:
            self._writer.copied()

    def wait(self) -> None:
        """Until the checkpoint in flight is written (re-raising its error)."""
        if self.writer is not None:
            self.writer.wait()

    def take_steps(self) -> list[int]:
        """The steps of the checkpoints taken since the last call (the metrics record marks them)."""
        steps, self._steps = self._steps, []
        return steps

    def _defer(self, step: int) -> None:
        """Count a periodic checkpoint deferred at `step` (once, however many steps it waits); warn
        the first time."""
        if self._deferred_since is not None:
            return
        self._deferred_since = step
        self.deferred += 1
        if self.deferred == 1:
            warnings.warn(f"checkpoint step {step} deferred: the previous checkpoint is still being written "
                          f"to {self.cfg.uri}; training goes on and takes it at the first step "
                          "after that write (checkpoints are due faster than the store takes them: raise "
                          "--checkpoint-every; the run's summary counts checkpoints_deferred)",
                          CheckpointWarning, stacklevel=3)

    # ---- the stop budget --------------------------------------------------------------------
    def warn_if_resumed_rate_outlasts_a_stop(self) -> None:
        """Before the first write measures it: from the rate the resumed checkpoint's write reached."""
        if self.hvd.rank() == 0 and self.store is not None and self.resumed_write_rate:
            rate = self.resumed_write_rate
            self._warn_if_writes_outlast_a_stop(
                self.state_bytes() / rate, f"the checkpoint resumed was written at {rate / 1e6:.2f} MB/s: "
                "at that rate a checkpoint write takes")

    def abort_for_stop(self, stopped_at: float) -> None:
        """A stop's checkpoint comes next: a periodic write in flight must not delay it."""
        if self._writer is not None:
            self._writer.abort()
            self.report_stop_budget(stopped_at)

    def report_stop_budget(self, stopped_at: float) -> None:
        """Say how long the stop's checkpoint should take (at the last write's rate, or the resumed
        checkpoint's) against what is left of the stop budget (RINGTRAIN_STOP_GRACE_S), so a stop that
        cannot make it is visible."""
        left = self.stop_budget_s - (time.monotonic() - stopped_at)
        nbytes, rate, whose = self.state_bytes(), self._writer.write_rate, "the last write's"
        if rate is None:
            rate, whose = self.resumed_write_rate, "the resumed checkpoint's"
        expected = f"{nbytes / rate:.1f} s at {whose} {rate / 1e6:.0f} MB/s" if rate else "unknown"
        line = (f"ringtrain: stop checkpoint of {nbytes / 1e6:.0f} MB: expected write {expected}; "
                f"{left:.0f} s of the {self.stop_budget_s:.0f} s stop budget left")
        if rate and nbytes / rate > left:
            line += " -- it may not finish before the node goes"
        print(line, file=sys.stderr, flush=True)

    def _warn_if_writes_outlast_a_stop(self, write_s: float, what: str) -> None:
        """Once: a checkpoint write longer than the stop budget means a spot stop's checkpoint is lost."""
        if self._slow_write_warned or write_s <= self.stop_budget_s:
            return
        self._slow_write_warned = True
        warnings.warn(f"{what} {write_s:.0f} s, longer than the {self.stop_budget_s:.0f} s a spot stop "
                      f"allows ({self.state_bytes() / 1e6:.1f} MB state): a stop's checkpoint would not "
                      "finish in time", CheckpointWarning, stacklevel=3)

    # ---- the end ----------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for the checkpoint in flight (re-raising its error) and end the writer process."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            try:
                writer.close()
                self._warn_if_writes_outlast_a_stop(writer.write_s_max, "a checkpoint write took")
            finally:
                self.written += writer.written
                self.wait_s += writer.waited_s
                self.write_max_s = max(self.write_max_s, writer.write_s_max)
                self.write_cpu_s += writer.write_cpu_s
                self.aborted += writer.aborted

    def summary_fields(self) -> dict:
        """The run summary's checkpoint figures (train.summary.RunSummary)."""
        return {
            "checkpoints_written": self.written,
            "checkpoint_wait_s": round(self.wait_s, 6),  # training time spent waiting for a write
            "checkpoints_deferred": self.deferred,
            # periodic writes aborted so that a stop's checkpoint starts at once
            "checkpoints_aborted": self.aborted,
            "checkpoint_deferred_steps_max": self.deferred_steps_max,
            # the longest checkpoint write (copy handed over -> uploaded), to set against the interval
            "checkpoint_write_max_s": round(self.write_max_s, 6),
            # the writer process's CPU time over all writes (serialization, hashing, the upload's client)
            "checkpoint_write_cpu_s": round(self.write_cpu_s, 6),
        }
