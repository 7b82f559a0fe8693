"""A task for the fp16 elastic test (tests/train/test_elastic_fp16.py): a small MLP whose loss is large
enough that the loss scaler backs off from its initial 65536 over the first steps, and which prints
every rank's parameter sum before each step, so the test can compare the replicas after a worker
rejoined. Batches are a pure function of (seed, rank, index)."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from train.task import Task

PREFIX = "RINGTRAIN_PARAMS"


class ScalerProbeTask(Task):
    def build_model(self):
        return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))

    def train_batches(self, position, rank, size):
        drawn = position["batches"] if position else 0
        self._rank = rank
        while True:
            drawn += 1
            g = torch.Generator().manual_seed(self.ctx.seed * 1_000_003 + rank * 10_007 + drawn)
            x = torch.randn(self.ctx.batch_size, 16, generator=g)
            self._step = drawn  # the batch's index: the step it trains (one backward pass per step)
            yield (x, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()), {"batches": drawn}

    def loss(self, model, batch):
        total = sum(p.detach().double().sum() for p in model.parameters())
        print(f"{PREFIX} rank={self._rank} step={self._step} sum={float(total).hex()}", file=sys.stderr,
              flush=True)
        x, y = batch
        # x 1000: scaled by 65536 the backward's float16 values overflow, so the scale backs off
        return 1000 * F.cross_entropy(model(x), y)
