"""RunSummary values for tests that script a trainer's outcome: every field a neutral default, the
test names only what it is about."""

from __future__ import annotations

from typing import Any

from train.summary import RunSummary

NEUTRAL: dict[str, Any] = {
    "steps": 0, "final_loss": None, "initial_loss": None, "samples_per_sec": 0.0, "resumed_from_step": None,
    "checkpoints_written": 0, "checkpoint_wait_s": 0.0, "checkpoints_deferred": 0, "checkpoints_aborted": 0,
    "checkpoint_deferred_steps_max": 0, "checkpoint_write_max_s": 0.0, "checkpoint_write_cpu_s": 0.0,
    "world_size": 1, "interrupted": False, "elastic_resets": 0, "cpu_affinity": None, "gradient_groups": 0,
    "eval": None,
}


def run_summary(**fields: Any) -> RunSummary:
    return RunSummary.from_record(NEUTRAL | fields)
