"""Evaluation: the task's metrics over its evaluation data, every worker evaluating its share.

The task says what to sum per batch (eval_sums) and how the sums over every rank become metrics
(eval_metrics); here the batches run without gradients and the sums meet in one allgather.

Every rank evaluates with rank 0's buffers (BatchNorm's running statistics). Without --sync-bn each
rank's statistics follow its own batches, and a checkpoint and an export hold rank 0's: evaluating
with those makes a resumed run's metrics the uninterrupted run's, and the metrics the export's. This
is timm's `--dist-bn broadcast`; PyTorch's DDP goes further and broadcasts them before every forward
(`broadcast_buffers=True`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from train.gpu import to_device
from train.task import Task


def evaluate(task: Task, model: torch.nn.Module, hvd, autocast: Callable[[], AbstractContextManager],
             device: torch.device, fmt: torch.memory_format) -> dict | None:
    """`eval_<name>` -> value, or None for a task without evaluation. A collective: every rank calls it
    at the same steps."""
    batches = task.eval_batches(hvd.rank(), hvd.size())
    if batches is None:
        return None
    hvd.broadcast_parameters(dict(model.named_buffers()), root_rank=0)
    was_training = model.training
    model.eval()
    sums: dict[str, float] = {}
    try:
        with torch.no_grad(), autocast():
            for batch in batches:
                batch = to_device(batch, device, fmt)
                for key, value in task.eval_sums(model, batch).items():
                    sums[key] = sums.get(key, 0.0) + float(value)
    finally:
        model.train(was_training)
    totals: dict[str, float] = {}
    for part in hvd.allgather_object(sums, name="ringtrain.eval"):  # a few numbers per rank
        for key, value in part.items():
            totals[key] = totals.get(key, 0.0) + value
    return {f"eval_{k}": float(v) for k, v in task.eval_metrics(totals).items()}
