"""What crosses from the trainer to its checkpoint writer process: the state's layout in one buffer.

The trainer copies each tensor into a buffer both processes map and sends the state with every tensor
replaced by its Slot there; the writer rebuilds the state over that memory, with no second copy.
train.checkpoint.resume lays a state out the same way to broadcast it tensor by tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ALIGN = 64  # byte alignment of each tensor in the buffer (any dtype's view needs its element size)


class CheckpointWriterError(RuntimeError):
    pass


@dataclass(frozen=True)
class Slot:
    """Where a tensor's bytes lie in the shared buffer."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def map_tensors(x, leaf):
    """`x` with every leaf `v` replaced by `leaf(v)`: dicts, lists and plain tuples are rebuilt with their
    type and attributes (a state_dict's OrderedDict carries `_metadata`, which load_state_dict uses)."""
    if isinstance(x, dict):
        out = type(x)((k, map_tensors(v, leaf)) for k, v in x.items())
        if getattr(x, "__dict__", None):
            out.__dict__.update(vars(x))
        return out
    if isinstance(x, list):
        return [map_tensors(v, leaf) for v in x]
    if type(x) is tuple:
        return tuple(map_tensors(v, leaf) for v in x)
    return leaf(x)


def layout(state) -> tuple[object, list[tuple[torch.Tensor, Slot]], int]:
    """(skeleton, (tensor, slot) pairs to copy, buffer bytes). A tensor seen twice (tied weights) gets
    one slot, so it stays shared in the checkpoint; numbers, strings and None stay in the skeleton."""
    slots: dict[int, Slot] = {}
    tensors: list[tuple[torch.Tensor, Slot]] = []
    end = 0

    def slot_of(x):
        nonlocal end
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) not in slots:
            slots[id(x)] = slot = Slot(end, x.dtype, tuple(x.shape))
            tensors.append((x, slot))
            end += -(-slot.nbytes // ALIGN) * ALIGN
        return slots[id(x)]

    return map_tensors(state, slot_of), tensors, end


def rebuild(skeleton, buffer=None) -> object:
    """The state, each Slot replaced by a tensor over `buffer` (None: a new one of its own). Each gets a
    storage of its own, so torch.save writes each separately, as it would the live tensors; one Slot
    object (a tied tensor, kept one object by pickling) is one tensor."""
    built: dict[int, torch.Tensor] = {}

    def tensor_of(x):
        if not isinstance(x, Slot):
            return x
        if id(x) not in built:  # by identity: an empty tensor's offset may equal the next one's
            built[id(x)] = (torch.empty(x.shape, dtype=x.dtype) if buffer is None or x.numel == 0 else
                            torch.frombuffer(buffer, dtype=x.dtype, count=x.numel, offset=x.offset)
                            .view(x.shape))
        return built[id(x)]

    return map_tensors(skeleton, tensor_of)
