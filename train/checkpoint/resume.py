"""Rank 0's checkpoint state on every rank, tensor by tensor.

hvd.broadcast_object pickles the whole object and sends its size in an int32 tensor
(horovod/torch/functions.py), so a state over 2 GiB (a ~180 M parameter model with Adam) could be
written but never resumed. Here only the state's structure and small values go through
broadcast_object; each tensor's bytes go through an in-place broadcast, in pieces of at most
PIECE_BYTES.
"""

from __future__ import annotations

import torch

from train.checkpoint.wire import layout, rebuild

PIECE_BYTES = 256 << 20  # well inside any 32-bit count, and within Horovod's usual fusion sizes


def broadcast_state(hvd, state: dict | None) -> dict | None:
    """`state` as rank 0 has it (None there: None everywhere); other ranks pass None."""
    skeleton = layout(state)[0] if hvd.rank() == 0 and state is not None else None
    skeleton = hvd.broadcast_object(skeleton, root_rank=0, name="ringtrain.resume.layout")
    if skeleton is None:
        return None
    if hvd.rank() != 0:
        state = rebuild(skeleton)  # empty tensors, in the same order as rank 0's below
    handles = []
    for i, (tensor, _slot) in enumerate(layout(state)[1]):
        data = tensor.reshape(-1).view(torch.uint8)  # a view: the broadcast fills `tensor` in place
        for j, start in enumerate(range(0, data.numel(), PIECE_BYTES)):
            handles.append(hvd.broadcast_async_(data[start:start + PIECE_BYTES], root_rank=0,
                                                name=f"ringtrain.resume.{i}.{j}"))
    for handle in handles:
        hvd.synchronize(handle)
    return state
