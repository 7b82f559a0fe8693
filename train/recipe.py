"""The training recipe's pure parts: functions of the configuration (and the world) that say how a step
runs: the learning rate at a step, each step's random seed, how gradients are reduced (groups, fp16
predivision), the autocast dtype, and the knobs Horovod reads from the environment. The trainer and
the launch call them; tests call them directly.
"""

from __future__ import annotations

import math
import os

import torch

from train.config import NCCL_ALGOS, TrainConfig
from train.cpu import CPU_CYCLE_TIME_MS, CPU_GRADIENT_GROUPS


def configure_horovod_env(cfg: TrainConfig, on_gpu: bool, environ=os.environ) -> None:
    """Horovod reads its tuning knobs from the environment at hvd.init(), NCCL its NCCL_ALGO when Horovod
    creates its communicators (after hvd.init()). A flag wins over the environment; the environment wins
    over our CPU default."""
    if cfg.horovod.nccl_algo is not None:
        environ["NCCL_ALGO"] = NCCL_ALGOS[cfg.horovod.nccl_algo]
    if cfg.horovod.fusion_threshold_mb is not None:
        environ["HOROVOD_FUSION_THRESHOLD"] = str(int(cfg.horovod.fusion_threshold_mb * 1024 * 1024))
    if cfg.horovod.cycle_time_ms is not None:
        environ["HOROVOD_CYCLE_TIME"] = str(cfg.horovod.cycle_time_ms)
    elif not on_gpu:
        environ.setdefault("HOROVOD_CYCLE_TIME", str(CPU_CYCLE_TIME_MS))


def lr_at(step: int, cfg: TrainConfig, world_size: int, local_size: int, on_gpu: bool) -> float:
    """Horovod's convention: lr x workers x backward passes per step, reached by linear warmup, then
    the schedule (constant; cosine down to 0 at --steps; step: x factor every N steps after warmup).

    With Adasum the gradients are combined, not averaged, so the world-size factor does not apply
    (on GPUs Horovod's Adasum works across nodes after a local sum, hence local_size there).
    `step` is the 0-based index of the step about to run.
    """
    size_factor = (local_size if on_gpu else 1) if cfg.horovod.adasum else world_size
    scaled = cfg.optim.lr * size_factor * cfg.horovod.backward_passes_per_step
    warmup = cfg.optim.warmup_steps
    if step < warmup:
        return cfg.optim.lr + (scaled - cfg.optim.lr) * step / warmup
    if cfg.optim.schedule == "cosine":
        span = max(cfg.steps - warmup, 1)
        return scaled * 0.5 * (1.0 + math.cos(math.pi * min(step - warmup, span) / span))
    if cfg.optim.schedule == "step":
        return scaled * cfg.optim.step_factor ** ((step - warmup) // cfg.optim.step_every)
    return scaled


def step_seed(seed: int, rank: int, step: int) -> int:
    """The seed of a rank's random stream for one step: a function of (seed, rank, step) only.

    So a resumed run draws exactly what the uninterrupted one drew, with no generator state in the
    checkpoint (saving every rank's state cost a collective on the training path at each checkpoint),
    and every rank draws its own dropout masks.
    """
    return ((seed * 1_000_003 + 7919 * (rank + 1)) * 1_000_033 + step) % (1 << 63)


def gradient_groups(cfg: TrainConfig, on_gpu: bool) -> int:
    """The groups DistributedOptimizer reduces the gradients in; 0: one allreduce per gradient.

    GPUs keep Horovod's way, which overlaps each gradient's reduction with the rest of the backward
    pass; elastic mode and Adasum cannot use groups (config.validate says why)."""
    if cfg.horovod.gradient_groups is not None:
        return cfg.horovod.gradient_groups
    if on_gpu or cfg.horovod.elastic or cfg.horovod.adasum:
        return 0
    return CPU_GRADIENT_GROUPS


def predivide_factor(cfg: TrainConfig, size: int) -> float:
    """With fp16 compression the gradients are summed in fp16: divided by the worker count before the
    sum (Horovod's gradient_predivide_factor), the sum of N loss-scaled gradients cannot overflow
    where one does not. Only for averaging (Horovod refuses it with Adasum)."""
    return float(size) if cfg.horovod.compression == "fp16" and not cfg.horovod.adasum else 1.0


def autocast_dtype(precision: str) -> torch.dtype | None:
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
