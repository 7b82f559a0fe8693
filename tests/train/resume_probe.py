"""`horovodrun --gloo -np 2 python -m tests.train.resume_probe [train args]`: resume as the trainer does
(rank 0 reads the checkpoint, broadcast_state, apply_checkpoint on every rank), then rank 0 prints
PROBE_PREFIX and JSON: each rank's sha256 over its model's and optimizer's tensors, and the step."""

from __future__ import annotations

import hashlib
import json
import sys

import horovod.torch as hvd
import torch

from train.checkpoint.resume import broadcast_state
from train.config import parse_args
from train.stop import StopRequest
from train.trainer import Progress, Trainer

PROBE_PREFIX = "RESUME_PROBE "


def state_digest(model_state: dict, optimizer_state: dict) -> str:
    """sha256 over the model's tensors in order, then each parameter's optimizer tensors by index."""
    h = hashlib.sha256()
    tensors = list(model_state.values())
    for pid in sorted(optimizer_state):
        tensors += [v for _k, v in sorted(optimizer_state[pid].items())]
    for t in tensors:
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def main(argv: list[str]) -> None:
    cfg = parse_args(argv)
    hvd.init()
    trainer = Trainer(cfg, hvd, StopRequest())
    found = trainer.prepare_inputs()
    trainer.build()
    state = broadcast_state(hvd, found.state if found else None)
    found = None
    progress = Progress()
    trainer.apply_checkpoint(state, progress)
    del state
    digest = state_digest(trainer.model.state_dict(), trainer.optimizer.state_dict()["state"])
    everyone = hvd.allgather_object({"rank": hvd.rank(), "digest": digest, "step": progress.step})
    trainer.checkpointer.close()
    if hvd.rank() == 0:
        print(PROBE_PREFIX + json.dumps(everyone), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
