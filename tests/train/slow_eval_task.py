"""A task whose evaluation takes seconds (tests/train/test_recipe_standard.py): the trainer's samples/s
must leave it out. Training is the parity task's (tests/train/user_task.py)."""

from __future__ import annotations

import time

from tests.train.user_task import ParityTask

EVAL_S = 2.0


class SlowEvalTask(ParityTask):
    def eval_sums(self, model, batch):
        time.sleep(EVAL_S / 2)  # two batches per evaluation
        return super().eval_sums(model, batch)
