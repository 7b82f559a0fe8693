"""The training recipe's pure parts: functions of the configuration (and the world) that say how a step
runs: the learning rate at a step, each step's random seed, how gradients are reduced (groups, fp16
predivision), the autocast dtype, and the knobs Horovod reads from the environment. The trainer and
the launch call them; tests call them directly.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace

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


def lr_factor(cfg: TrainConfig, world_size: int, local_size: int, on_gpu: bool) -> float:
    """What --lr is multiplied by for this many workers: the global batch's growth (workers x backward
    passes per step) through --lr-scaling (linear: Horovod's convention and Goyal et al.'s rule for
    SGD; sqrt: the rule for Adam and AdamW; none).

    With Adasum the gradients are combined, not averaged, so the world-size factor does not apply
    (on GPUs Horovod's Adasum works across nodes after a local sum, hence local_size there)."""
    size_factor = (local_size if on_gpu else 1) if cfg.horovod.adasum else world_size
    growth = size_factor * cfg.horovod.backward_passes_per_step
    return {"linear": float(growth), "sqrt": math.sqrt(growth), "none": 1.0}[cfg.optim.lr_scaling]


def lr_at(step: int, cfg: TrainConfig, world_size: int, local_size: int, on_gpu: bool) -> float:
    """The scaled lr (lr_factor), reached by linear warmup from --lr, then the schedule (constant;
    cosine down to 0 at --steps; step: x factor every N steps after warmup). `step` is the 0-based
    index of the step about to run."""
    scaled = cfg.optim.lr * lr_factor(cfg, world_size, local_size, on_gpu)
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


def layout_change(saved: dict, cfg: TrainConfig, world_size: int, local_size: int,
                  on_gpu: bool) -> str | None:
    """What a resume under another world size or batch size changes, in one line for the log; None when
    nothing does. `saved`: the checkpoint's state (world_size, batch_size, backward passes per step)."""
    old_world = int(saved.get("world_size") or world_size)
    old_batch = int(saved.get("batch_size") or cfg.data.batch_size)
    old_k = int(saved.get("backward_passes_per_step") or cfg.horovod.backward_passes_per_step)
    new_k = cfg.horovod.backward_passes_per_step
    if (old_world, old_batch, old_k) == (world_size, cfg.data.batch_size, new_k):
        return None
    step = int(saved.get("step", 0))
    old_cfg = replace(cfg, data=replace(cfg.data, batch_size=old_batch),
                      horovod=replace(cfg.horovod, backward_passes_per_step=old_k))
    old_lr = lr_at(step, old_cfg, old_world, int(saved.get("local_size") or local_size), on_gpu)
    new_lr = lr_at(step, cfg, world_size, local_size, on_gpu)
    return (f"ringtrain: resuming step {step} under another layout: global batch {old_world} workers x "
            f"{old_batch} x {old_k} passes = {old_world * old_batch * old_k} -> {world_size} x "
            f"{cfg.data.batch_size} x {new_k} = {world_size * cfg.data.batch_size * new_k}; learning rate "
            f"at this step {old_lr:.6g} -> {new_lr:.6g} (--lr-scaling {cfg.optim.lr_scaling}); data "
            "position: the samples not yet read this epoch go to the new workers (sharded datasets; the "
            "demo task's position counts samples), so an epoch still reads each sample once")


def resolve_precision(precision: str, on_gpu: bool, bf16_supported: bool) -> str:
    """--precision auto: bf16 on GPUs that support it (Ampere and later: NVIDIA DLE and torchtitan train
    in bf16 there; it needs no loss scaler), fp32 on older GPUs and on CPU workers."""
    if precision != "auto":
        return precision
    return "bf16" if on_gpu and bf16_supported else "fp32"


def param_groups(named: list[tuple[str, torch.nn.Parameter]], weight_decay: float) -> list[dict]:
    """The model's parameters for the optimizer: with weight decay, two groups, the decay kept off
    biases and normalisation weights (every 1-d tensor), as timm's param_groups_weight_decay
    (timm/optim/_param_groups.py) and NVIDIA DLE's ResNet-50 (`--bn-weight-decay` off by default)
    do; without, one group (as checkpoints written before the split have it)."""
    params = [p for _, p in named if p.requires_grad]
    if weight_decay == 0:
        return [{"params": params}]
    decay = [p for p in params if p.ndim > 1]
    no_decay = [p for p in params if p.ndim <= 1]
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(cfg: TrainConfig, groups: list[dict]) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.name == "sgd":
        return torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    if o.name == "adamw":  # Loshchilov & Hutter 2019, decoupled weight decay
        return torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
    return torch.optim.Adam(groups, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)


def autocast_dtype(precision: str) -> torch.dtype | None:
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
