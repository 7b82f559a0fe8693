"""The image task's workload in the benchmarks: the same torchvision model, batches and DataLoader as
`python -m train --task image` (train/tasks/image.py), over the same shards, for the trainer and for
the bare Horovod and DDP loops (bench/worker_hvd.py, bench/worker_ddp.py with --data DIR).

The bare loops build their loader with the task's own pieces (the loader workers' dataset, its
DataLoader settings, the position count and the normalisation), so the comparison holds the input
pipeline equal by construction and measures what the trainer's loop adds around it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ImageShape:
    """One image-task workload: where its shards are (`data`, a packed image dataset), the model, the
    crop, the batch per worker, the workers, and the task's input-pipeline flags."""

    data: str
    steps: int                 # timed steps, after the warmup
    warmup: int
    model: str = "resnet18"
    image_size: int = 32
    batch_size: int = 32
    workers: int = 2
    loader_workers: int = 1    # DataLoader processes per worker (the task's --loader-workers)
    prefetch: int = 2
    readahead_shards: int = 2

    def pipeline_args(self) -> list[str]:
        """The flags the trainer's image task and the bare loops share."""
        return ["--data", self.data, "--model", self.model, "--image-size", str(self.image_size),
                "--loader-workers", str(self.loader_workers), "--prefetch", str(self.prefetch),
                "--readahead-shards", str(self.readahead_shards)]

    def args(self) -> list[str]:
        """A bare loop's arguments (bench.workerlib.worker_args)."""
        return ["--steps", str(self.steps), "--warmup", str(self.warmup),
                "--batch-size", str(self.batch_size), *self.pipeline_args()]

    def trainer_task_args(self) -> list[str]:
        """The trainer's task and data flags (bench.trainer_run.TrainerRun adds steps, batch, metrics)."""
        return ["--task", "image", *self.pipeline_args()]


def image_workload(args, rank: int, world: int) -> tuple[torch.nn.Module, Callable[[], tuple]]:
    """The model and a next-batch function for a bare loop's worker: the task's DataLoader over this
    worker's share of the shards, as the trainer's ImageTask.train_batches builds it (on CPU: no
    pinned memory; the task's defaults: augmentation "standard", --decode auto, --shuffle-buffer)."""
    from train import decode, shards
    from train.tasks.image import ImageShards, make_loader, normalize, start_forkserver_ignoring_stop_signals
    from train.tasks.vision import import_torchvision

    ds = shards.open_dataset(args.data, None, "image")
    loaders = max(args.loader_workers, 1)
    shards.check_fits(ds, args.batch_size, world, loaders)
    model = import_torchvision().models.get_model(args.model, weights=None,
                                                  num_classes=len(ds.index["classes"]))
    plan = shards.Plan.from_state(None, world, loaders, shards.DEFAULT_SHUFFLE_BUFFER)
    positions = shards.RankPositions(ds, args.seed, args.batch_size, plan)
    if args.loader_workers:
        start_forkserver_ignoring_stop_signals()
    dataset = ImageShards(ds, args.seed, args.batch_size, rank, world, plan, decode.resolve("auto", False),
                          args.image_size, "standard", args.readahead_shards)
    loader = iter(make_loader(dataset, args.loader_workers, args.prefetch, pin_memory=False))

    def next_batch() -> tuple:
        x, y = next(loader)
        positions.advance()  # the trainer counts each batch's position too
        return normalize(x), y

    return model, next_batch


def pack_digits(workdir, samples_per_shard: int = 100) -> str:
    """scikit-learn's handwritten digits (cluster/example_data.py) packed into shards with
    `python -m train.data pack images` (its entry point, in this process) under `workdir`; returns
    the dataset's directory."""
    from pathlib import Path

    from cluster.example_data import write_digits
    from train.data import main as data_main

    images, packed = Path(workdir) / "digits", Path(workdir) / "digits-shards"
    write_digits(images)
    argv = ["pack", "images", "--src", str(images), "--out", str(packed),
            "--samples-per-shard", str(samples_per_shard)]
    with contextlib.redirect_stdout(sys.stderr):  # its report line; the bench's stdout is its table
        status = data_main(argv)
    if status != 0:
        raise RuntimeError(f"python -m train.data {' '.join(argv)} failed")
    return str(packed)
