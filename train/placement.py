"""Where a worker runs: its device, and on CPU workers the cores it is pinned to (--cpu-affinity) and
its share of torch's threads (train.cpu); GPU workers get their GPU and its defaults (train.gpu)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from train.config import TrainConfig
from train.cpu import cpu_threads_per_worker, pin_worker
from train.gpu import configure_gpu_worker


@dataclass(frozen=True)
class Placement:
    device: torch.device
    cpus: tuple[int, ...] | None  # the cores this worker is pinned to, if any
    node_cpus: tuple[int, ...]  # the cores all workers here share

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"


def place_worker(cfg: TrainConfig, local_rank: int, local_size: int) -> Placement:
    node_cpus = tuple(sorted(os.sched_getaffinity(0)))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        configure_gpu_worker(cfg.tf32, local_size)
        return Placement(torch.device("cuda", local_rank), None, node_cpus)
    cpus = pin_worker(local_rank, local_size) if cfg.cpu_affinity == "auto" else None
    # Pinned, this process's cores are its share already; otherwise share them out here.
    sharing = 1 if cpus else local_size
    threads = cpu_threads_per_worker(len(os.sched_getaffinity(0)), sharing, os.environ)
    if threads is not None:
        torch.set_num_threads(threads)
    return Placement(torch.device("cpu"), cpus, node_cpus)
