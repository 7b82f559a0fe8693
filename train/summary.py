"""The run's summary: what rank 0 reports when the trainer ends, as one line `RINGTRAIN_SUMMARY {json}`.

One type for every side of that line: the trainer writes it (RunSummary.line), and whoever reads a
run's output parses it here: the tests and the benchmark read a run's own output (parse_summary,
exactly one line), the local and AWS backends a launcher's log (last_summary: horovodrun prefixes
every line with `[rank]<stdout>:`, and a log may hold noise or a cut line). cluster/ imports this;
it imports nothing from cluster/.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

SUMMARY_PREFIX = "RINGTRAIN_SUMMARY"


@dataclass(frozen=True)
class RunSummary:
    steps: int                               # the step the run reached
    final_loss: float | None
    initial_loss: float | None
    samples_per_sec: float                   # over this run's training time, all workers
    resumed_from_step: int | None            # the checkpoint's step it started from (None: from scratch)
    checkpoints_written: int
    checkpoint_wait_s: float                 # time the training loop waited for a previous write
    checkpoints_deferred: int                # checkpoints started late: the previous write was still going
    checkpoints_aborted: int                 # periodic writes aborted so that a stop's checkpoint starts
    checkpoint_deferred_steps_max: int
    checkpoint_write_max_s: float            # the longest write (copy handed over -> uploaded)
    checkpoint_write_cpu_s: float            # the writer process's CPU time over all writes
    world_size: int
    interrupted: bool                        # stopped by SIGTERM after a checkpoint (exit 75, resumable)
    elastic_resets: int
    cpu_affinity: list[int] | None           # rank 0's cores, as the trainer pinned them
    gradient_groups: int
    eval: dict[str, Any] | None              # the task's metrics at the last evaluation (None: none ran)
    # tokens_per_sec (and on GPUs mfu) over the run's training time, for tasks that count tokens (lm)
    throughput: dict[str, float] | None = None
    # Later fields have defaults: a summary from an older image lacks them.
    # --init-from: {"uri", "applied" (False: a checkpoint's resume won), "loaded", "missing",
    # "unexpected", "mismatched"} (train/init_from.py); None: not given
    init_from: dict[str, Any] | None = None
    export: str | None = None                # where rank 0 wrote the export (train/export.py); None: none

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def line(self) -> str:
        return f"{SUMMARY_PREFIX} {json.dumps(self.record(), sort_keys=True)}"

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RunSummary:
        """A summary from its JSON record. Every field without a default must be there; keys it does not
        know are left out (a newer image's trainer may report more than this checkout reads)."""
        fields = dataclasses.fields(cls)
        names = [f.name for f in fields if f.name in record or f.default is dataclasses.MISSING]
        missing = [n for n in names if n not in record]
        if missing:
            raise ValueError(f"summary lacks {missing}")
        return cls(**{f.name: record[f.name] for f in fields if f.name in record})


# How the summary names an evaluation metric (the task's eval_* keys); counts are left out.
EVAL_NAMES = {"eval_top1": "top-1", "eval_perplexity": "perplexity", "eval_loss": "loss"}
EVAL_COUNTS = ("eval_samples", "eval_tokens")


def eval_name(key: str) -> str:
    """'eval_top1' -> 'top-1'; a task's own metric without its prefix (pure)."""
    return EVAL_NAMES.get(key, key.removeprefix("eval_"))


def format_eval(metrics: Mapping[str, Any] | None) -> str | None:
    """'top-1 0.8780 (180 samples)' from a summary's eval (pure); None without one."""
    if not metrics:
        return None
    shown = [f"{eval_name(k)} {v:.4f}" for k, v in metrics.items()
             if k not in EVAL_COUNTS and isinstance(v, int | float)]
    counts = [f"{int(metrics[k])} {k.removeprefix('eval_')}" for k in EVAL_COUNTS if k in metrics]
    return ", ".join(shown) + (f" ({', '.join(counts)})" if counts else "")


def _from_line(line: str) -> RunSummary | None:
    """The summary on one line of output (after any prefix), or None if the line holds none."""
    if SUMMARY_PREFIX not in line:
        return None
    try:
        record = json.loads(line.split(SUMMARY_PREFIX, 1)[1])
        return RunSummary.from_record(record) if isinstance(record, dict) else None
    except ValueError:  # a cut line (json.JSONDecodeError is a ValueError) or a record of another shape
        return None


def parse_summary(output: str) -> RunSummary:
    """The summary of one run from its own output: exactly one complete summary line, or ValueError."""
    lines = [ln for ln in output.splitlines() if SUMMARY_PREFIX in ln]
    if len(lines) != 1:
        raise ValueError(f"expected exactly one {SUMMARY_PREFIX} line, found {len(lines)}")
    record = json.loads(lines[0].split(SUMMARY_PREFIX, 1)[1])
    if not isinstance(record, dict):
        raise ValueError(f"the {SUMMARY_PREFIX} line holds no JSON object: {lines[0][:200]!r}")
    return RunSummary.from_record(record)


def last_summary(lines: Iterable[str]) -> RunSummary | None:
    """The last complete summary in a launcher's log, or None (pure)."""
    for line in reversed(list(lines)):
        summary = _from_line(line)
        if summary is not None:
            return summary
    return None
