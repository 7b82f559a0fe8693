"""The workload every benchmark trains: the trainer's own model on the trainer's synthetic batch.

The bare Horovod and DDP loops import these from `train/` so "the same model, batch and workers"
holds by construction. Synthetic data (one fixed batch per worker, as Horovod's synthetic benchmark
does) keeps data loading out of the comparisons: they are about the framework, not the disk.
"""

from __future__ import annotations

import torch
from torch import nn

from train.data import INPUT_SHAPE, NUM_CLASSES, synthetic_batch
from train.model import build_model

MODELS = ("cnn", "mlp")


def build(model: str, width: int) -> nn.Module:
    return build_model(model, INPUT_SHAPE, NUM_CLASSES, width, dropout=0.0)


def batch(seed: int, rank: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return synthetic_batch(seed, rank, batch_size)
