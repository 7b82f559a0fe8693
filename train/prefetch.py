"""The next batch's host-to-device copy on a CUDA stream of its own, while the current step computes.

The pattern of NVIDIA DeepLearningExamples' ResNet-50 loader (PyTorch/Classification/ConvNets/image_
classification/dataloaders.py, `PrefetchedWrapper.prefetched_loader`): the batch after the one handed
out is copied from pinned memory with non_blocking copies issued on a side stream; before a batch is
handed out, the compute stream waits for that side stream, and the batch's memory is recorded as used
by the compute stream (so the caching allocator does not reuse it while the step still reads it).
On a CPU device there is nothing to overlap: batches pass through unchanged (the trainer's own move
to the device is a no-op there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from train.gpu import to_device


def _record(batch: Any, stream) -> None:
    if isinstance(batch, torch.Tensor):
        if batch.is_cuda:
            batch.record_stream(stream)
    elif isinstance(batch, (tuple, list)):
        for b in batch:
            _record(b, stream)
    elif isinstance(batch, dict):
        for b in batch.values():
            _record(b, stream)


def prefetched(pairs: Iterator[tuple[Any, Any]], device: torch.device,
               move: Callable[[Any], Any] | None = None) -> Iterator[tuple[Any, Any]]:
    """(batch, extra) pairs with each batch on `device`, the next one's copy (`move`, default
    train.gpu.to_device) running on a side stream while the caller computes on the current one."""
    if device.type != "cuda":
        yield from pairs
        return
    move = move or (lambda batch: to_device(batch, device))  # 4-d inputs keep their layout here
    side = torch.cuda.Stream(device=device)

    def load():
        batch, extra = next(pairs)
        with torch.cuda.stream(side):
            return move(batch), extra

    try:
        upcoming = load()
    except StopIteration:
        return
    while True:
        compute = torch.cuda.current_stream(device)
        compute.wait_stream(side)
        batch, extra = upcoming
        _record(batch, compute)
        try:
            upcoming = load()
        except StopIteration:
            yield batch, extra
            return
        yield batch, extra
