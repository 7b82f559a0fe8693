"""The bare Horovod loop: `horovodrun --gloo -np 2 -H localhost:2 python -m bench.worker_hvd ...`.

Horovod's tuning knobs (HOROVOD_CYCLE_TIME, HOROVOD_FUSION_THRESHOLD, HOROVOD_AUTOTUNE) arrive as
environment variables from the harness; threads, pinning and compression as arguments.
"""

from __future__ import annotations

import os

import horovod.torch as hvd
import torch
import torch.nn.functional as F

from bench.workerlib import apply_pin, apply_threads, report, timed_loop, worker_args, workload

_TUNING_ENV = ("HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_AUTOTUNE", "OMP_NUM_THREADS")


def main() -> None:
    args = worker_args()
    apply_threads(args.threads)
    hvd.init()
    cpus = apply_pin(args.pin, hvd.local_rank(), hvd.local_size())
    torch.manual_seed(args.seed)
    model, next_batch = workload(args, hvd.rank(), hvd.size())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9)
    compression = hvd.Compression.fp16 if args.compression == "fp16" else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, groups=args.groups or None)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def step(i: int) -> None:
        x, y = next_batch()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    def barrier() -> None:
        hvd.allreduce(torch.zeros(1), name="bench.barrier")

    times, window = timed_loop(step, args.warmup, args.steps, barrier)
    report(hvd.rank(), hvd.size(), args.batch_size, times, window, {
        "framework": "horovod",
        "compression": args.compression,
        "groups": args.groups,
        "cpus": cpus,
        "env": {k: os.environ[k] for k in _TUNING_ENV if k in os.environ},
    })
    hvd.shutdown()


if __name__ == "__main__":
    main()
