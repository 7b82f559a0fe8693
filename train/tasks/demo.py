"""The built-in `demo` task (the default): the small MLP or CNN over the project's generated 1x8x8
dataset (`python -m train.data generate`) or one fixed synthetic batch per worker.

torch is imported where it is used: parsing the arguments (which `scripts/run` does before it stands a
cluster up) loads this module and should not take torch's import time."""

from __future__ import annotations

import argparse

from train.errors import BadInput
from train.task import Task

MODELS = ("mlp", "cnn")


class DemoTask(Task):
    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model", choices=MODELS, default="mlp")
        parser.add_argument("--width", type=int, default=128, help="hidden units (mlp) or channels (cnn)")
        parser.add_argument("--dropout", type=float, default=0.0)

    @classmethod
    def check_arguments(cls, args: argparse.Namespace) -> list[str]:
        problems = []
        if args.width < 1:
            problems.append(f"--width {args.width}: must be >= 1")
        if not 0.0 <= args.dropout < 1.0:
            problems.append(f"--dropout {args.dropout}: must be in [0, 1)")
        return problems

    dataset = None  # train.data.Dataset; None: --data synthetic

    def prepare(self, rank: int, size: int) -> None:
        from train import data as data_mod

        if self.ctx.data == "synthetic":
            return
        self.dataset = data_mod.load(self.ctx.data, self.ctx.s3_endpoint_url)
        if size * self.ctx.batch_size > len(self.dataset):
            raise BadInput(f"dataset {self.ctx.data} has {len(self.dataset)} samples, fewer than one "
                           f"global batch ({size} workers x {self.ctx.batch_size})")

    def describe(self) -> str:
        return f"--model {self.args.model} --width {self.args.width}"

    input_shape: tuple[int, ...] | None = None  # of a loaded export

    def model_info(self) -> dict:
        from train import data as data_mod

        return {"input_shape": list(self.dataset.input_shape if self.dataset else data_mod.INPUT_SHAPE),
                "num_classes": data_mod.NUM_CLASSES}

    def use_model_info(self, info: dict) -> None:
        self.input_shape = tuple(info["input_shape"])

    def build_model(self):
        from train import data as data_mod
        from train.model import build_model

        shape = self.input_shape or (self.dataset.input_shape if self.dataset else data_mod.INPUT_SHAPE)
        return build_model(self.args.model, shape, data_mod.NUM_CLASSES, self.args.width, self.args.dropout)

    def train_batches(self, position, rank, size):
        import torch

        from train import data as data_mod

        batch_size = self.ctx.batch_size
        if self.dataset is None:
            x, y = data_mod.synthetic_batch(self.ctx.seed, rank, batch_size)
            batch = (x.to(self.ctx.device), y.to(self.ctx.device))  # once: the same batch every step
            position = {}
            while True:
                yield batch, position
        sampler = data_mod.ShardedSampler(len(self.dataset), self.ctx.seed)
        if position:
            sampler.load_state(position)
        x, y = self.dataset.x, self.dataset.y
        while True:
            idx = torch.from_numpy(sampler.next_indices(rank, size, batch_size))
            yield (x.index_select(0, idx), y.index_select(0, idx)), sampler.state()

    def loss(self, model, batch):
        import torch.nn.functional as F

        x, y = batch
        return F.cross_entropy(model(x), y)
