"""What the flow does when an attempt ends, and what a failure cost (pure).

The policy users of SkyPilot managed jobs (`max_restarts_on_errors`), Ray Train
(`FailureConfig(max_failures)`) and Kubeflow (`backoffLimit`) expect: a job whose workers fail for any
reason but bad input restarts from its newest verified checkpoint, a bounded number of times. Two
counts, kept apart:

- resubmits: the job stopped on a spot reclaim after its checkpoint (exit 75). Expected on spot
  capacity, not a failure.
- restarts: anything else non-zero (a worker killed hard, a hang the watchdog ended, a node lost
  without notice). Bad input (exit 2) and a failed preflight never restart: the same input or the
  same slow node would fail again.

A job whose final checkpoint (the one at `--steps`) is written is done, whatever its exit code: a
host lost after the last step costs nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from train.contract import EXIT_BAD_INPUT, EXIT_HUNG, EXIT_INTERRUPTED_RESUMABLE, EXIT_PREFLIGHT_FAILED


class Next(enum.Enum):
    DONE = "done"
    RESUBMIT = "resubmit"   # spot reclaim after a checkpoint: run the same job again
    RESTART = "restart"     # a failure: run it again from the newest verified checkpoint
    FAIL = "fail"           # stop here


@dataclass(frozen=True)
class Decision:
    next: Next
    reason: str


def decide(exit_code: int | None, *, completed: bool, resubmits_left: int, restarts_left: int) -> Decision:
    """The flow's next move after an attempt that ended with `exit_code` (None: unknown, e.g. the
    launcher vanished); `completed`: the checkpoint at --steps is written and verified."""
    if exit_code == 0:
        return Decision(Next.DONE, "")
    if completed:
        return Decision(Next.DONE, f"exit code {exit_code} after the final checkpoint: the job is done")
    if exit_code == EXIT_BAD_INPUT:
        return Decision(Next.FAIL, "bad input: not retried")
    if exit_code == EXIT_PREFLIGHT_FAILED:
        return Decision(Next.FAIL, "preflight failed: not retried on the same nodes")
    if exit_code == EXIT_INTERRUPTED_RESUMABLE:
        if resubmits_left > 0:
            return Decision(Next.RESUBMIT, "interrupted after a checkpoint: resubmitting to resume")
        return Decision(Next.FAIL,
                        "interrupted after a checkpoint, and no resubmits are left (--max-resubmits)")
    what = "hung (the watchdog ended it)" if exit_code == EXIT_HUNG else f"failed (exit code {exit_code})"
    if restarts_left > 0:
        return Decision(Next.RESTART, f"{what}: restarting from the newest verified checkpoint")
    return Decision(Next.FAIL, f"{what}, and no restarts are left (--max-restarts)")


@dataclass(frozen=True)
class FailureCost:
    """What one restart cost: the steps trained since the checkpoint it resumed from, redone, and the
    wall time from reaching that checkpoint's step to being back there after the restart."""

    reached_step: int | None     # the failed attempt's last step on record
    resumed_from: int | None     # the checkpoint the next attempt started from (None: scratch)
    steps_lost: int | None
    seconds_lost: float | None

    def describe(self) -> str:
        steps = "?" if self.steps_lost is None else str(self.steps_lost)
        secs = "?" if self.seconds_lost is None else f"{self.seconds_lost:.1f} s"
        start = f"step {self.resumed_from}" if self.resumed_from is not None else "scratch"
        return f"{steps} step(s) redone from {start}, {secs} lost"


def last_step(metrics: Sequence[dict[str, Any]]) -> int | None:
    steps = [int(r["step"]) for r in metrics if "step" in r and "loss" in r]
    return max(steps) if steps else None


def _first_time_at(metrics: Sequence[dict[str, Any]], step: int, after: bool) -> float | None:
    for r in metrics:
        if "time" in r and "step" in r and (r["step"] > step if after else r["step"] >= step):
            return float(r["time"])
    return None


def failure_cost(failed: Sequence[dict[str, Any]], failed_ended_at: float,
                 resumed_from: int | None, next_attempt: Sequence[dict[str, Any]]) -> FailureCost:
    """The cost of the failure that ended the attempt with metrics `failed` at `failed_ended_at` (epoch
    seconds), given where the next attempt resumed and its metrics (empty while unknown)."""
    reached = last_step(failed)
    base = resumed_from or 0
    steps_lost = max(0, reached - base) if reached is not None else None
    # when the failed attempt had reached the checkpoint's step (its start, if it began past it)
    at_checkpoint = _first_time_at(failed, base, after=False) if resumed_from is not None else None
    if at_checkpoint is None and failed:
        at_checkpoint = min((float(r["time"]) for r in failed if "time" in r), default=None)
    back = _first_time_at(next_attempt, base, after=True)
    seconds = None
    if at_checkpoint is not None and back is not None:
        seconds = max(0.0, back - at_checkpoint)
    elif at_checkpoint is not None:
        seconds = max(0.0, failed_ended_at - at_checkpoint)
    return FailureCost(reached, resumed_from, steps_lost, seconds)
