"""A model's parameters and its optimizer's state kept in shared memory that the checkpoint writer's
process maps, so that a checkpoint costs the training thread a short message instead of a copy.

Handing the writer a copy (train.checkpoint_writer, `submit`) costs the training thread Python work
per checkpoint (the state dicts, their layout, pickling it) and the copy itself, with the caches cold
after the step: at 0.7 MB that cost more than a step of 0.7 ms (bench/, checkpoint stall, a core to
spare: 1.1 ms lost per checkpoint, the step after it +0.7 ms). Here the state's tensors live in one
region (a memfd) from the first checkpoint on. At a checkpoint the trainer sends the step and the
state's small values (a few hundred bytes); the writer process copies the whole region into memory
of its own while the next step's forward and backward passes run, which only read the parameters,
and replies before the optimizer step changes them (`CheckpointWriter.copied()`). The layout (a
template of the whole state, its tensors as RegionSlots) goes to the writer once, and again only
when a tensor has moved.

A tensor moves when something replaces it: `optimizer.load_state_dict` makes new state tensors, an
optimizer makes a parameter's state at its first step, `param.data = ...` rebinds. `current()`
checks, per checkpoint, that every tensor is still the one in the region (a pointer comparison per
tensor, no state dicts), and the next checkpoint relocates otherwise.

For states on the CPU whose tensors only the optimizer step changes: not with module buffers (batch
norm's statistics change in the forward pass), not with Adasum (whose backward pass runs the
optimizer), not in elastic mode (a reset restores the state mid-step); the trainer decides
(`Trainer.copy_overlaps_step`). GPU states are copied to the host as before.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable

import torch
from torch import nn

from train.checkpoint_writer import ALIGN, RegionSlot, map_tensors


class ResidentState:
    """The tensors of `model` and `optimizer`, in a region the writer process maps.

    `state_of(values)`: the whole checkpoint state (tensors included) for a checkpoint's small values
    (`values`: everything but the model's and optimizer's tensors); called at relocation only, to
    make the template the writer overlays each checkpoint's values on."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, state_of: Callable[[dict], dict]):
        self.model = model
        self.optimizer = optimizer
        self.state_of = state_of
        self.region: mmap.mmap | None = None
        self.template = None  # the state with each tensor replaced by its RegionSlot
        self.relocations = 0
        self._params: list[tuple[torch.Tensor, int]] = []  # (parameter, its data_ptr in the region)
        # The optimizer's state mapping (load_state_dict replaces it), and per parameter with state:
        # (parameter, its state dict, the dict's size, (key, data_ptr) of each tensor in it).
        self._optimizer_state: dict | None = None
        self._states: list[tuple[torch.Tensor, dict, int, list[tuple[str, int]]]] = []

    def current(self) -> bool:
        """Whether every tensor of the state is still the one in the region (nothing moved since)."""
        if self.template is None:
            return False
        for p, ptr in self._params:
            if p.data_ptr() != ptr:
                return False
        state = self.optimizer.state
        if state is not self._optimizer_state or len(state) != len(self._states):
            return False
        for p, holder, n, tensors in self._states:
            if state.get(p) is not holder or len(holder) != n:
                return False
            for key, ptr in tensors:
                value = holder[key]
                if not isinstance(value, torch.Tensor) or value.data_ptr() != ptr:
                    return False
        return True

    def relocate(self, values: dict) -> int:
        """Move every tensor into a new region and make the template; returns the region's memfd (the
        caller sends it to the writer process and closes it). Raises ValueError, before moving
        anything, for a state it cannot keep (see the module's doc)."""
        params = list({id(p): p for p in self.model.parameters()}.values())
        holders = [(p, holder) for p, holder in self.optimizer.state.items()]
        moving: list[torch.Tensor] = params + [v for _, h in holders for v in h.values()
                                               if isinstance(v, torch.Tensor)]
        _check_movable(moving)
        offsets, end = [], 0
        for t in moving:
            offsets.append(end)
            end += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
        fd = os.memfd_create("ringtrain-resident-state", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, max(end, 1))
            region = mmap.mmap(fd, max(end, 1))
        except BaseException:
            os.close(fd)
            raise
        views = {}
        with torch.no_grad():
            for t, offset in zip(moving, offsets, strict=True):
                if t.numel():
                    flat = torch.frombuffer(region, dtype=t.dtype, count=t.numel(), offset=offset)
                    views[id(t)] = flat.view(t.shape).copy_(t)
        # Rebound only now, every copy done: a failure above leaves training on its own tensors.
        for p in params:
            if id(p) in views:
                p.data = views[id(p)]
        for _, holder in holders:
            for key, value in list(holder.items()):
                if isinstance(value, torch.Tensor) and id(value) in views:
                    holder[key] = views[id(value)]
        self.region = region
        self.template = self._template(values)
        self._params = [(p, p.data_ptr()) for p in params]
        self._optimizer_state = self.optimizer.state
        self._states = [(p, h, len(h), [(k, v.data_ptr()) for k, v in h.items()
                                        if isinstance(v, torch.Tensor)]) for p, h in holders]
        self.relocations += 1
        return fd

    def _template(self, values: dict):
        base = _address(self.region)
        size = len(self.region)
        slots: dict[tuple, RegionSlot] = {}

        def slot_of(x):
            if not isinstance(x, torch.Tensor):
                return x
            shape = tuple(x.shape)
            offset = x.data_ptr() - base if x.numel() else 0
            if x.numel() and not (0 <= offset < size and x.is_contiguous()):
                raise ValueError(f"a tensor of the checkpoint state ({x.dtype}, {shape}) is not one of the "
                                 "model's parameters or the optimizer's state: it cannot be kept resident")
            # By place: tied weights, one tensor per name in the state dict, stay one tensor.
            return slots.setdefault((offset, x.dtype, shape), RegionSlot(offset, x.dtype, shape))

        return map_tensors(self.state_of(values), slot_of)


def _check_movable(tensors: list[torch.Tensor]) -> None:
    storages: set[int] = set()
    for t in tensors:
        if t.device.type != "cpu" or t.layout != torch.strided or t.is_sparse:
            raise ValueError(f"resident state needs dense CPU tensors, not {t.device.type} {t.layout}")
        if t.numel():
            ptr = t.untyped_storage().data_ptr()
            if ptr in storages:  # views of one storage would become separate tensors
                raise ValueError("resident state needs tensors with storages of their own; two share one")
            storages.add(ptr)


def _address(region: mmap.mmap) -> int:
    """The region's start address (a tensor over it, made and dropped, reads it)."""
    return torch.frombuffer(region, dtype=torch.uint8, count=1).data_ptr()
