"""The lm task's workload in the benchmarks: the same GPT as `python -m train --task lm`
(train/tasks/lm.py, train/gpt.py), trained on the same windows of the same token shards, for the
trainer and for the bare Horovod loop (bench/worker_hvd.py with --task lm).

The bare loop reads its windows the simplest way, through a numpy memmap of each shard or by one
ranged read per block (no checksum, no read-ahead thread), in the order the task's stream deals them:
the same batches, bit for bit, so the comparison holds the model and the data equal and measures what
the trainer adds around them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import argparse

    import torch

    from train.tokens import WindowView


@dataclass(frozen=True)
class LmShape:
    """One lm workload: the token shards (`data`), the GPT's size and context, the batch per worker,
    the workers, and the steps (timed steps after the untimed warmup)."""

    data: str
    steps: int
    warmup: int
    layers: int
    heads: int
    dim: int
    seq_len: int
    batch_size: int
    workers: int = 2

    def model_args(self) -> list[str]:
        """The flags the trainer's lm task and the bare loop share."""
        return ["--data", self.data, "--layers", str(self.layers), "--heads", str(self.heads),
                "--dim", str(self.dim), "--seq-len", str(self.seq_len)]

    def args(self) -> list[str]:
        """A bare loop's arguments (bench.workerlib.worker_args)."""
        return ["--steps", str(self.steps), "--warmup", str(self.warmup),
                "--batch-size", str(self.batch_size), "--task", "lm", *self.model_args()]

    def trainer_task_args(self) -> list[str]:
        """The trainer's task flags (bench.trainer_run.TrainerRun adds steps, batch, metrics)."""
        return ["--task", "lm", *self.model_args()]


def tokens_per_s(record: dict, seq_len: int) -> dict:
    """A run's record with its tokens/s over the timed window: samples/s times the tokens each sample
    trains on (the seq_len targets of a window of seq_len + 1, as the lm task counts them)."""
    return {**record, "tokens_per_s": float(record["samples_per_sec"]) * seq_len}


def block_readers(view: WindowView) -> dict[str, Callable[[int], np.ndarray]]:
    """The two bare ways to get block b's tokens, with no checksum and no thread: `memmap`, a slice of
    a numpy memmap of its shard (local datasets only: a memmap needs a file), and `range`, one ranged
    read of its bytes through the dataset's store, as the task's stream reads S3."""
    ds = view.ds
    maps: dict[int, np.memmap] = {}

    def memmap(b: int) -> np.ndarray:
        block = ds.blocks[b]
        if block.shard not in maps:
            maps[block.shard] = np.memmap(ds.store.root / ds.index["shards"][block.shard]["name"],
                                          dtype=ds.dtype, mode="r")
        return maps[block.shard][block.start:block.start + block.tokens]

    def ranged(b: int) -> np.ndarray:
        return np.frombuffer(ds.fetch_block(b), dtype=ds.dtype)   # the stream's read, unverified

    return {"memmap": memmap, "range": ranged}


def bare_batches(view: WindowView, seed: int, batch_size: int, rank: int, world: int,
                   reads: str = "memmap") -> Iterator[np.ndarray]:
    """Worker `rank`'s batches of windows, [batch_size, seq_len + 1] int64, epoch after epoch, each
    block's tokens got by `reads` (block_readers): the blocks the task's plan deals this worker in a
    fresh epoch (train.shards.Plan), each block's windows in its sample order, and each epoch cut where
    the worker with the fewest windows runs out of full batches, as train.tokens.WindowStream does."""
    from train.shards import Plan, sample_order

    read = block_readers(view)[reads]
    n_tokens = view.seq_len + 1
    for epoch in itertools.count():
        plan = Plan(epoch, world, None, 0)
        left = plan.length(view, seed, batch_size)
        batch, filled = np.empty((batch_size, n_tokens), dtype=np.int64), 0
        for b, start, end in plan.rank_segments(view, seed, rank):
            tokens, n = read(b), view.shards[b]["samples"]
            windows = np.lib.stride_tricks.as_strided(tokens, (n, n_tokens),
                                                      (view.seq_len * tokens.itemsize, tokens.itemsize))
            order, i = sample_order(seed, epoch, b, n), start
            while i < end and left:
                j = min(end, i + batch_size - filled)
                batch[filled:filled + j - i] = windows[order[i:j]]
                filled, i = filled + j - i, j
                if filled == batch_size:
                    yield batch
                    batch, filled, left = np.empty((batch_size, n_tokens), dtype=np.int64), 0, left - 1
            del windows, tokens  # before the next read: its buffer can reuse this one's memory
            if not left:
                break


def lm_workload(args: argparse.Namespace, rank: int,
                world: int) -> tuple[torch.nn.Module, Callable[[], tuple]]:
    """The model and a next-batch function for a bare loop's worker: the lm task's GPT (dropout 0, the
    task's default) with its logits flattened over batch and positions, so the loop's
    cross_entropy(model(x), y) is the task's loss; x a batch's first seq_len tokens, y the next ones."""
    import torch
    from torch import nn

    from train import gpt, tokens

    view = tokens.open_dataset(args.data, None).windows(args.seq_len)
    tokens.check_fits(view, args.batch_size, world)
    model = nn.Sequential(gpt.GPT(view.ds.index["vocab_size"], args.seq_len,
                                  gpt.Shape(args.layers, args.heads, args.dim)),
                          nn.Flatten(0, 1))
    batches = bare_batches(view, args.seed, args.batch_size, rank, world)

    def next_batch() -> tuple:
        batch = torch.from_numpy(next(batches))
        return batch[:, :-1], batch[:, 1:].reshape(-1)

    return model, next_batch
