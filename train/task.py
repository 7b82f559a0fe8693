"""The task interface: what a user brings to the trainer, and how `--task` finds it.

A task is the model, the training data, the loss, and optionally evaluation data and metrics, with
the task's own command-line arguments. The trainer keeps everything else: Horovod, precision, the
learning rate's scaling, warmup and schedule, clipping, checkpoints (the data position included),
spot-safe stops, elastic mode, metrics and progress. The shape follows Lightning's split of a
`LightningModule` (model + training_step + evaluation) from its Trainer, and torchtitan's TrainSpec
(a registry of named builders): a class with a few methods, referenced by name.

    python -m train --task demo                 # built-in: train/tasks/demo.py (the default)
    python -m train --task image --data s3://bucket/digits/train --model resnet18
    python -m train --task my_pkg.tasks:MyTask  # an importable module
    python -m train --task ./my_task.py:MyTask  # a file anywhere

Every rank parses the arguments and imports the task itself, so a bad argument or a task that does
not load is reported by every rank alike, with exit code 2 and one message (train.errors.BadInput); so
is an error the task's constructor or `prepare` raises (task_code), named with where it was raised.

A minimal task (see tests/train/user_task.py for one that trains):

    class MyTask(Task):
        @classmethod
        def add_arguments(cls, parser):
            parser.add_argument("--hidden", type=int, default=64)

        @classmethod
        def check_arguments(cls, args):
            return [] if args.hidden >= 1 else [f"--hidden {args.hidden}: must be >= 1"]

        def build_model(self):
            return nn.Sequential(nn.Linear(8, self.args.hidden), nn.ReLU(), nn.Linear(self.args.hidden, 2))

        def train_batches(self, position, rank, size):
            step = position["step"] if position else 0
            while True:  # endless: the trainer stops after --steps
                step += 1
                yield make_batch(self.ctx.seed, rank, step), {"step": step}

        def loss(self, model, batch):
            x, y = batch
            return F.cross_entropy(model(x), y)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train.errors import BadInput

if TYPE_CHECKING:  # torch is imported by the tasks, not here: `scripts/run` checks arguments without it
    import torch
    from torch import nn

# Built-in tasks by name: `--task image` is `--task train.tasks.image:ImageTask`.
BUILTIN_TASKS = {
    "demo": "train.tasks.demo:DemoTask",
    "image": "train.tasks.image:ImageTask",
    "lm": "train.tasks.lm:LanguageModelTask",
}
DEFAULT_TASK = "demo"


@dataclass(frozen=True)
class TaskContext:
    """What the trainer tells a task about the run (fixed for the process's life)."""

    data: str  # --data: "synthetic", s3://bucket/prefix or a local directory
    batch_size: int  # samples per worker per backward pass
    seed: int
    steps: int
    device: torch.device
    s3_endpoint_url: str | None
    local_rank: int
    local_size: int


@dataclass(frozen=True)
class Example:
    """Data to try a task on and the flags that size the task for it (a small model on CPU workers): what
    `ringtrain run --task X` trains on when given no --data. The cluster's flow writes it into its datasets
    bucket once, at datasets/<name>/train and datasets/<name>/eval, by running `commands` on the machine
    that runs the flow (from the repository, with the store's environment), and adds the flags the user
    did not give."""

    name: str  # its folder in the datasets bucket
    description: str  # what it is, in a few words
    # argv lists, in order, with {python} (this interpreter), {train} and {eval} (the dataset URIs) and
    # {scratch} (an empty local directory they may use) filled in
    commands: tuple[tuple[str, ...], ...]
    flags: tuple[tuple[str, str], ...] = ()

    def argv(self, python: str, train: str, eval: str, scratch: str) -> list[list[str]]:
        fill = {"python": python, "train": train, "eval": eval, "scratch": scratch}
        return [[part.format(**fill) for part in command] for command in self.commands]


class Task:
    """Subclass this and override what your task needs (build_model, train_batches and loss at least).

    The trainer calls, in order: `check_arguments` (at parse time, pure), the constructor, `prepare`
    (I/O checks, on every rank), `build_model` (after seeding torch from --seed, so every rank builds the
    same weights), then `train_batches` and `loss` for each step, `eval_batches`/`eval_sums`/
    `eval_metrics` at each evaluation, and `close` at the end.
    """

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add the task's own flags (they appear in `python -m train --task X --help`)."""

    @classmethod
    def check_arguments(cls, args: argparse.Namespace) -> list[str]:
        """Problems with the task's flags, one message each naming the flag and what is allowed. Pure:
        every rank must reach the same verdict."""
        return []

    @classmethod
    def example(cls) -> Example | None:
        """Data to try the task on without --data (see Example), or None: the user must give --data."""
        return None

    def __init__(self, args: argparse.Namespace, ctx: TaskContext):
        self.args = args
        self.ctx = ctx

    def prepare(self, rank: int, size: int) -> None:
        """Open the data (an index, not the samples) as worker `rank` of `size`. Raise BadInput for a
        dataset that is missing, foreign, unreadable or too small for one global batch."""

    def build_model(self) -> nn.Module:
        raise NotImplementedError(f"{type(self).__name__}.build_model")

    def parameter_groups(self, model: nn.Module, weight_decay: float) -> list[dict]:
        """The optimizer's parameter groups (e.g. weight decay on some parameters only); by default one
        group of every parameter, decayed by --weight-decay."""
        return [{"params": list(model.parameters()), "weight_decay": weight_decay}]

    def tokens_per_sample(self) -> int | None:
        """Tokens one sample trains on, for a task that counts them (the trainer logs tokens/s)."""
        return None

    def flops_per_token(self, model: nn.Module) -> float | None:
        """Training FLOPs per token (forward and backward), for model FLOPs utilisation on GPUs."""
        return None

    def train_batches(self, position: dict | None, rank: int, size: int) -> Iterator[tuple[Any, dict]]:
        """Yield (batch, position after this batch) for worker `rank` of `size`, forever or until the
        data ends, starting at `position` (None: the beginning; otherwise a position this method
        yielded, possibly under another world size after an elastic change). The position is saved in
        checkpoints, so it must be JSON-like (dicts, lists, numbers, strings) and small. A batch is a
        tensor or a tuple/list/dict of tensors; the trainer moves it to the device."""
        raise NotImplementedError(f"{type(self).__name__}.train_batches")

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The scalar loss of one batch (the trainer runs this under autocast and backpropagates)."""
        raise NotImplementedError(f"{type(self).__name__}.loss")

    def eval_batches(self, rank: int, size: int) -> Iterable[Any] | None:
        """This worker's share of the evaluation data, or None for a task without evaluation."""
        return None

    def eval_sums(self, model: nn.Module, batch: Any) -> dict[str, float]:
        """Sums over one evaluation batch (e.g. correct predictions and samples); the trainer adds them
        up over the batches and the workers and hands the totals to eval_metrics."""
        raise NotImplementedError(f"{type(self).__name__}.eval_sums")

    def eval_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Metrics from the totals of eval_sums (e.g. top-1 accuracy = correct / samples)."""
        return dict(sums)

    def close(self) -> None:
        """Release what the task holds (DataLoader workers, open streams)."""

    # ---- exports (train.export): the model without the training data -------------------------
    def model_info(self) -> dict:
        """What build_model needs beyond the task's flags, JSON-like (class names, a tokenizer and
        sequence length), for an export's model.json. Called after prepare()."""
        return {}

    def use_model_info(self, info: dict) -> None:
        """Get ready for build_model from model_info()'s record instead of prepare() (loading an
        export: no training data)."""

    def prepare_eval(self) -> None:
        """Open only the evaluation data (the task's --eval-data), to evaluate a loaded export."""
        raise BadInput(f"{type(self).__name__} cannot evaluate an export (it has no prepare_eval)")


def load_task(spec: str) -> type[Task]:
    """The Task class named by `spec`: a built-in name, `pkg.module:Class` or `path/to/file.py:Class`.
    Raises BadInput naming what is wrong."""
    target = BUILTIN_TASKS.get(spec, spec)
    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr:
        raise BadInput(f"--task {spec!r}: use a built-in task ({', '.join(BUILTIN_TASKS)}), "
                       "pkg.module:ClassName or path/to/file.py:ClassName")
    if where.endswith(".py") or "/" in where:
        path = Path(where).expanduser()
        if not path.is_file():
            raise BadInput(f"--task {spec!r}: file {where} not found")
        # A name of its own so two task files called task.py do not collide in sys.modules.
        mod_name = "ringtrain_user_task_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
        try:
            module_spec = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[mod_name] = module
            module_spec.loader.exec_module(module)
        except Exception as e:  # the user's code: any error it raises is bad input of the run
            sys.modules.pop(mod_name, None)
            raise BadInput(f"--task {spec!r}: importing {where} failed: {type(e).__name__}: {e}") from None
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as e:
            if e.name and where.startswith(e.name):
                raise BadInput(f"--task {spec!r}: no module named {where!r} (is it on PYTHONPATH?)") from None
            raise BadInput(f"--task {spec!r}: importing {where} failed: {type(e).__name__}: {e}") from None
        except Exception as e:
            raise BadInput(f"--task {spec!r}: importing {where} failed: {type(e).__name__}: {e}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise BadInput(f"--task {spec!r}: {where} has no {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise BadInput(f"--task {spec!r}: {attr} is not a subclass of train.task.Task")
    return cls


@contextmanager
def task_code(spec: str, call: str):
    """Run a call into the task's own code (its constructor, prepare). Whatever it raises is bad input
    of the run, like a task that does not import: BadInput in one line naming the task, the call, the
    cause and where it was raised, so every rank agrees on it and exits 2 with that line, not a
    traceback and exit 1 that the launcher's output buries."""
    try:
        yield
    except BadInput:
        raise
    except Exception as e:  # noqa: BLE001 - the user's code: any error it raises is reported, in one line
        text = str(e).strip().splitlines()
        frames = traceback.extract_tb(e.__traceback__)
        where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
        raise BadInput(f"--task {spec!r}: {call} raised {type(e).__name__}"
                       f"{': ' + text[0] if text else ''}{where}") from None
