"""A user's task as a user would write it, outside the trainer's package: the tests copy this file
into a directory outside the repository and train it with `--task /that/dir/user_task.py:ParityTask`.

The model learns the parity of the first two bits of an 8-bit vector (XOR: not linearly separable, so
the loss falls only if the hidden layer trains). Batches are a pure function of (seed, rank, index),
so the position is just how many batches this worker drew.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from train.task import Task


class ParityTask(Task):
    @classmethod
    def add_arguments(cls, parser):
        parser.add_argument("--hidden", type=int, default=32, help="hidden units")

    @classmethod
    def check_arguments(cls, args):
        return [] if args.hidden >= 2 else [f"--hidden {args.hidden}: must be >= 2"]

    def build_model(self):
        return nn.Sequential(nn.Linear(8, self.args.hidden), nn.Tanh(), nn.Linear(self.args.hidden, 2))

    def _batch(self, rank: int, index: int, size: int = 0):
        g = torch.Generator().manual_seed(self.ctx.seed * 1_000_003 + rank * 10_007 + index + size * 17)
        x = torch.randint(0, 2, (self.ctx.batch_size, 8), generator=g).float()
        return x, (x[:, 0] + x[:, 1]).remainder(2).long()

    def train_batches(self, position, rank, size):
        drawn = position["batches"] if position else 0
        while True:
            drawn += 1
            yield self._batch(rank, drawn), {"batches": drawn}

    def loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    def eval_batches(self, rank, size):
        return [self._batch(rank, -1 - i, size) for i in range(2)]

    def eval_sums(self, model, batch):
        x, y = batch
        return {"correct": (model(x).argmax(1) == y).sum().item(), "samples": len(y)}

    def eval_metrics(self, sums):
        return {"accuracy": sums["correct"] / sums["samples"], "samples": sums["samples"]}
