"""The bare torch DDP (Gloo) loop: `torchrun --standalone --nproc-per-node 2 -m bench.worker_ddp ...`."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from bench.workerlib import apply_pin, apply_threads, report, timed_loop, worker_args, workload


def main() -> None:
    args = worker_args()
    apply_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cpus = apply_pin(args.pin, int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"]))
    torch.manual_seed(args.seed)
    module, next_batch = workload(args, rank, world)
    model = DistributedDataParallel(module)  # broadcasts rank 0's parameters
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * world, momentum=0.9)

    def step(i: int) -> None:
        x, y = next_batch()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    times, window = timed_loop(step, args.warmup, args.steps, dist.barrier)
    report(rank, world, args.batch_size, times, window, {
        "framework": "ddp",
        "cpus": cpus,
        "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS",) if k in os.environ},
    })
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
