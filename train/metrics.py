"""What rank 0 reports: a progress bar for people, JSON lines for machines, TensorBoard, the summary."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from train.errors import BadInput

SUMMARY_PREFIX = "RINGTRAIN_SUMMARY"
SUMMARY_KEYS = (
    "steps", "final_loss", "initial_loss", "samples_per_sec", "resumed_from_step",
    "checkpoints_written", "world_size", "interrupted", "elastic_resets", "cpu_affinity", "gradient_groups",
)


def summary_line(summary: dict) -> str:
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    if missing:
        raise ValueError(f"summary lacks {missing}")
    return f"{SUMMARY_PREFIX} {json.dumps(summary, sort_keys=True)}"


def parse_summary(output: str) -> dict:
    """The summary from a run's output (for tests, the benchmark and the cluster backends)."""
    lines = [ln for ln in output.splitlines() if SUMMARY_PREFIX in ln]
    if len(lines) != 1:
        raise ValueError(f"expected exactly one {SUMMARY_PREFIX} line, found {len(lines)}")
    return json.loads(lines[0].split(SUMMARY_PREFIX, 1)[1])


def check_tensorboard_available() -> None:
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        raise BadInput("--tensorboard-dir needs the 'tensorboard' package (pip install tensorboard); "
                       "omit the flag to log JSON lines only") from None


class MetricsLog:
    """Opened on rank 0 only."""

    def __init__(self, metrics_file: str | None, tensorboard_dir: str | None, progress: bool,
                 total_steps: int, initial_step: int):
        self._file = None
        self._tb = None
        self._bar = None
        if metrics_file:
            path = Path(metrics_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", buffering=1)
        if tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(tensorboard_dir)
        if progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=initial_step, unit="step", file=sys.stderr,
                             mininterval=1.0, dynamic_ncols=True)

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def log(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key in record:
                if key in ("loss", "samples_per_sec", "lr", "world_size") or key.startswith("eval_"):
                    self._tb.add_scalar(key, record[key], record["step"])
        if self._bar is not None and "loss" in record:
            self._bar.set_postfix(loss=f"{record['loss']:.4f}", refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._file is not None:
            self._file.close()
