"""The trainer's weights in and out, besides checkpoints: --init-from's weights at the start
(train.init_from) and the export at the end (train.export). Rank 0's; the other ranks get the weights
by broadcast (train.run) or state.sync() (train.elastic).

A resume from a checkpoint wins over --init-from: the weights are then not read, and the summary says
so ({"uri": ..., "applied": False}). Every checkpoint carries the export's record (model.json less the
weights), so `ringtrain export` can make an export from any checkpoint later.
"""

from __future__ import annotations

import sys
import warnings

from torch import nn

from train import export, init_from
from train.config import TrainConfig
from train.errors import BadInput
from train.task import Task


class Weights:
    def __init__(self, cfg: TrainConfig, task: Task):
        self.cfg, self.task = cfg, task
        self._init: dict | None = None          # --init-from's tensors until applied
        self.init_report: dict | None = None    # what the summary says of --init-from
        self._record: dict | None = None        # model.json's fixed part, read once
        self.exported_to: str | None = None

    @property
    def export_uri(self) -> str | None:
        w = self.cfg.weights
        return (w.export_dir or export.default_export_uri(self.cfg.checkpoint.uri)) if w.export else None

    def prepare(self, resuming: bool) -> None:
        """Rank 0, before training: the export's destination must be writable; --init-from's weights
        are read unless a resume wins. BadInput otherwise."""
        cfg, w = self.cfg, self.cfg.weights
        self.record(0, None)  # its I/O (the dataset's index, git) now, not at the first checkpoint
        if self.export_uri is not None:
            export.check_writable(self.export_uri, cfg.s3_endpoint_url)
        if w.init_from and resuming:
            self.init_report = {"uri": w.init_from, "applied": False}
        elif w.init_from:
            self._init = init_from.read_weights(w.init_from, cfg.s3_endpoint_url)

    def apply(self, model: nn.Module) -> None:
        """Rank 0, after the model is built and when no checkpoint is resumed: --init-from's weights into
        it; BadInput under strict loading. What partial loading left as built is said on stderr."""
        if self._init is None:
            return
        w = self.cfg.weights
        weights, self._init = self._init, None
        report = init_from.apply_weights(model, weights, w.init_from, w.init_partial)
        self.init_report = {**report.record(), "applied": True}
        skipped = {k: v for k, v in report.record().items() if isinstance(v, list) and v}
        if skipped:
            print(f"ringtrain: --init-from {w.init_from}: loaded {report.loaded} tensors; left as built: "
                  + "; ".join(f"{k} {', '.join(v[:5])}" + (" ..." if len(v) > 5 else "")
                              for k, v in skipped.items()), file=sys.stderr, flush=True)

    def record(self, step: int, eval_metrics: dict | None) -> dict:
        """model.json's record at `step` (rank 0)."""
        cfg = self.cfg
        if self._record is None:
            self._record = export.model_record(
                cfg.task.name, cfg.task.args, self.task.model_info(),
                export.dataset_record(cfg.data.source, cfg.s3_endpoint_url), None, 0, export.provenance())
        return {**self._record, "eval": eval_metrics, "step": step}

    def write_export(self, model: nn.Module, step: int, eval_metrics: dict | None) -> None:
        """Rank 0 at the end. A failure now is a warning: the training is done and its checkpoint
        written (the destination was checked before training)."""
        uri = self.export_uri
        if uri is None:
            return
        try:
            export.write_export(uri, model.state_dict(), self.record(step, eval_metrics),
                                self.cfg.s3_endpoint_url)
            self.exported_to = uri
        except (BadInput, OSError) as e:
            warnings.warn(f"the export to {uri} failed: {e}; `ringtrain export` makes one from the last "
                          "checkpoint", stacklevel=2)
