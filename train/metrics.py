"""What rank 0 reports while it trains: a progress bar for people, JSON lines for machines, TensorBoard
(the summary at the end: train/summary.py).

JSON lines go to --metrics-file, or with --metrics-lines to stdout as `RINGTRAIN_METRICS {json}`: on
AWS the launcher's log is all the flow gets back from the cluster (the rank-0 pod's files stay there),
so the records ride in it, as the summary line does, and metrics_from_log reads them back.
cluster/ imports this module: it imports nothing heavy."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

METRICS_PREFIX = "RINGTRAIN_METRICS"


def metrics_line(record: dict) -> str:
    return f"{METRICS_PREFIX} {json.dumps(record, sort_keys=True)}"


def metrics_from_log(lines: Iterable[str]) -> list[dict]:
    """The metrics records in a launcher's log, in order (pure): lines may carry horovodrun's
    `[0]<stdout>:` prefix; cut or foreign lines are skipped."""
    records = []
    for line in lines:
        if METRICS_PREFIX not in line:
            continue
        try:
            record = json.loads(line.split(METRICS_PREFIX, 1)[1])
        except ValueError:
            continue
        if isinstance(record, dict) and "step" in record:
            records.append(record)
    return records


class MetricsLog:
    """Opened on rank 0 only."""

    def __init__(self, metrics_file: str | None, tensorboard_dir: str | None, progress: bool,
                 total_steps: int, initial_step: int, lines: bool = False):
        self._lines = lines
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
        if self._lines:
            print(metrics_line(record), flush=True)
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
