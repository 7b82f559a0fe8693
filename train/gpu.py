"""GPU workers' defaults: cuDNN autotuning, TF32 matmuls (opt-out), channels_last for convolutions,
and a share of the host's cores for each worker's CPU threads (torch's default is one thread per core
in every process, which oversubscribes a node of 8 GPUs).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from train.cpu import cpu_threads_per_worker


def configure_gpu_worker(tf32: bool, local_size: int, environ: Mapping[str, str] = os.environ) -> None:
    # Fixed input shapes every step: cuDNN's benchmark picks the fastest kernels once.
    torch.backends.cudnn.benchmark = True
    # TF32 runs fp32 matmuls and convolutions on tensor cores (Ampere and later) at ~10 bits of
    # mantissa; --no-tf32 keeps full fp32.
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    threads = cpu_threads_per_worker(len(os.sched_getaffinity(0)), local_size, environ)
    if threads is not None:
        torch.set_num_threads(threads)


def memory_format(model: torch.nn.Module, on_gpu: bool) -> torch.memory_format:
    """channels_last for models with 2-d convolutions on GPUs (tensor cores take NHWC without
    transposes); their 4-d inputs follow (to_device)."""
    conv = any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    return torch.channels_last if on_gpu and conv else torch.contiguous_format


def to_device(batch, device: torch.device, fmt: torch.memory_format = torch.contiguous_format):
    """On a GPU from pinned memory, without blocking the host; images in `fmt` (channels_last for
    convolutional models, train.gpu)."""
    if isinstance(batch, torch.Tensor):
        if device.type != "cuda" or batch.is_cuda:
            return batch.to(device, non_blocking=True)
        fmt = fmt if batch.dim() == 4 else torch.contiguous_format
        return batch.pin_memory().to(device, non_blocking=True, memory_format=fmt)
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(b, device, fmt) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device, fmt) for k, v in batch.items()}
    return batch
