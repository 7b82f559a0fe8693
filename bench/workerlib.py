"""What the bare training loops share: argument parsing, the timed loop, the result line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

import torch

from bench.model import MODELS
from bench.stats import throughput

# Rank 0 of every bench worker prints exactly one line with this prefix; the harness parses it.
RESULT_PREFIX = "BENCH_RESULT "


def worker_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="a bare training loop timed for the benchmarks")
    p.add_argument("--steps", type=int, default=200, help="timed steps (after warmup)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--task", choices=("demo", "image", "lm"), default=None,
                   help="the trainer's task whose workload this is (default: demo with synthetic data, "
                   "image with --data DIR); lm: the lm task's GPT over the token shards in --data DIR "
                   "(bench/lm_loop.py)")
    p.add_argument("--model", default="cnn",
                   help=f"synthetic data: the trainer's model ({', '.join(MODELS)}; train/model.py); "
                   "with --data DIR: a torchvision model by name")
    p.add_argument("--data", default="synthetic",
                   help="synthetic: one fixed batch per worker (bench/model.py); a directory of packed "
                   "images: the image task's input pipeline over it (bench/image_loop.py)")
    p.add_argument("--image-size", type=int, default=32, help="--data DIR: the crop fed to the model")
    p.add_argument("--loader-workers", type=int, default=1, help="--data DIR: DataLoader processes")
    p.add_argument("--prefetch", type=int, default=2, help="--data DIR: batches each loader process prepares")
    p.add_argument("--readahead-shards", type=int, default=2, help="--data DIR: shards fetched ahead")
    p.add_argument("--width", type=int, default=32, help="channels (cnn) or hidden units (mlp)")
    p.add_argument("--layers", type=int, help="--task lm: the GPT's blocks")
    p.add_argument("--heads", type=int, help="--task lm: attention heads")
    p.add_argument("--dim", type=int, help="--task lm: model width")
    p.add_argument("--seq-len", type=int, help="--task lm: tokens per sample")
    p.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: leave as is)")
    p.add_argument("--compression", choices=["none", "fp16"], default="none", help="Horovod only")
    p.add_argument("--groups", type=int, default=0,
                   help="Horovod only: DistributedOptimizer(groups=N): gradients allreduced in N "
                   "explicit groups (0: one allreduce per gradient, fused per cycle)")
    p.add_argument("--pin", action="store_true",
                   help="pin each worker's threads to its share of the cores, as the trainer does")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.task = args.task or ("demo" if args.data == "synthetic" else "image")
    if (args.task == "demo") != (args.data == "synthetic"):
        p.error(f"--task {args.task} with --data {args.data}: demo trains on synthetic data, image and lm "
                "read a dataset (--data DIR)")
    gpt_flags = ("layers", "heads", "dim", "seq_len")
    if args.task == "lm" and None in (getattr(args, name) for name in gpt_flags):
        p.error("--task lm needs --layers, --heads, --dim and --seq-len (the trainer's lm task's)")
    for name in ("steps", "batch_size", "width", *gpt_flags):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0 or args.threads < 0 or args.groups < 0 or args.loader_workers < 0:
        p.error("--warmup, --threads, --groups and --loader-workers must be >= 0")
    if args.task == "demo" and args.model not in MODELS:
        p.error(f"--model {args.model!r}: with synthetic data one of {', '.join(MODELS)}")
    return args


def workload(args: argparse.Namespace, rank: int, world: int) -> tuple[torch.nn.Module, Callable[[], tuple]]:
    """The model and a next-batch function: the trainer's model on its synthetic batch (the same batch
    every step), the image task's model and input pipeline, or the lm task's GPT and windows. Call
    after pinning: the image pipeline's DataLoader processes inherit the worker's cores."""
    if args.task == "lm":
        from bench.lm_loop import lm_workload

        return lm_workload(args, rank, world)
    if args.task == "image":
        from bench.image_loop import image_workload

        return image_workload(args, rank, world)
    from bench.model import batch, build

    model = build(args.model, args.width)
    x, y = batch(args.seed, rank, args.batch_size)
    return model, lambda: (x, y)


def apply_threads(threads: int) -> None:
    if threads:
        torch.set_num_threads(threads)


def apply_pin(pin: bool, local_rank: int, local_size: int) -> list[int] | None:
    """After the framework's init (its threads exist then): the trainer's own pinning (train/cpu.py)."""
    if not pin:
        return None
    from train.cpu import pin_worker

    cpus = pin_worker(local_rank, local_size)
    return list(cpus) if cpus else None


def timed_loop(
    step: Callable[[int], None], warmup: int, steps: int, barrier: Callable[[], None]
) -> tuple[list[float], float]:
    """Run warmup steps, then `steps` timed ones; returns each timed step's wall time and the whole
    timed window, in seconds.

    Barriers before and after the timed window make every rank start and stop together, so rank 0's
    window is the job's window.
    """
    for i in range(warmup):
        step(i)
    barrier()
    start = time.perf_counter()
    times = []
    for i in range(warmup, warmup + steps):
        t0 = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - t0)
    barrier()
    return times, time.perf_counter() - start


def report(rank: int, world: int, batch_size: int, times: list[float], window_s: float, extra: dict) -> None:
    if rank != 0:
        return
    record = {
        "world_size": world,
        "batch_size": batch_size,
        "steps": len(times),
        "window_s": window_s,
        "samples_per_sec": throughput(world * batch_size * len(times), window_s),
        "step_times_s": times,
        "torch_threads": torch.get_num_threads(),
        **extra,
    }
    sys.stdout.write(RESULT_PREFIX + json.dumps(record) + "\n")
    sys.stdout.flush()
