"""`horovodrun --gloo -np 2 python -m tests.train.allreduce_probe [train args]`: two real training steps
with every allreduce DistributedOptimizer starts recorded (it starts none at size 1); rank 0 prints one
line, PROBE_PREFIX and JSON.

Step 1 runs as usual; in step 2 rank 1 is asked to stop. For each step: the allreduces started (grouped
ones as the list of their tensor counts, single ones as a count), the stop fraction train_step
returned, and the loss it reported.
"""

from __future__ import annotations

import json
import sys

import horovod.torch as hvd
import horovod.torch.optimizer as hvd_optimizer

from train.config import parse_args
from train.stop import StopRequest
from train.trainer import Progress, Trainer

PROBE_PREFIX = "ALLREDUCE_PROBE "


def main(argv: list[str]) -> None:
    seen: dict = {"grouped": [], "single": 0}
    grouped, single = hvd_optimizer.grouped_allreduce_async_, hvd_optimizer.allreduce_async_

    def grouped_spy(tensors, *args, **kwargs):
        seen["grouped"].append(len(tensors))
        return grouped(tensors, *args, **kwargs)

    def single_spy(tensor, *args, **kwargs):
        seen["single"] += 1
        return single(tensor, *args, **kwargs)

    hvd_optimizer.grouped_allreduce_async_ = grouped_spy
    hvd_optimizer.allreduce_async_ = single_spy

    hvd.init()
    stop = StopRequest()
    trainer = Trainer(parse_args(["--steps", "2", *argv]), hvd, stop)
    trainer.build()
    progress = Progress()
    steps = []
    for stop_requested in (False, True):
        stop.requested = stop_requested and hvd.rank() == 1
        seen["grouped"], seen["single"] = [], 0
        fraction = trainer.train_step(progress)
        steps.append({**seen, "stop": fraction, "loss": trainer.last_loss})
    params = sum(1 for p in trainer.model.parameters() if p.requires_grad)
    if hvd.rank() == 0:
        print(PROBE_PREFIX + json.dumps({"model_parameters": params, "steps": steps}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
