"""What a run trains on when the trainer is given no `--data`: the flow (cluster/flow.py) writes it into
the datasets bucket before the first attempt, unless its index is there already.

    demo        the generated dataset (`python -m train.data generate`), at the backend's dataset URI,
                sized by `ringtrain run --dataset-shards/--samples-per-shard`
    other tasks the task's own example (train.task.Task.example: e.g. image, scikit-learn's digits; lm,
                the standard library's source), at s3://<datasets bucket>/datasets/<name>/train and
                .../eval, with the example's flags (a small model), so that `ringtrain run --task X`
                trains in a few minutes on CPU workers

A flag the user gives after `--` wins over the example's (train.config.with_flags). A `--data` given after
`--` is used as is and nothing is written. A task without an example and without `--data` is refused
before anything starts.

    data = plan_run_data("image", trainer_config, DatasetSpec())
    data.dataset.uris(storage), data.dataset.commands(uris, scratch_dir)
"""

from __future__ import annotations

import abc
import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from cluster.backend import Storage
from cluster.usage import UsageError
from infra.storage_layout import dataset_uri
from train.config import TrainConfig
from train.errors import BadInput
from train.task import BUILTIN_TASKS, DEFAULT_TASK, Example, Task, load_task


@dataclass(frozen=True)
class DataUris:
    train: str
    eval: str | None = None

    def all(self) -> list[str]:
        return [self.train] + ([self.eval] if self.eval else [])


class Dataset(abc.ABC):
    """A dataset the flow writes into the datasets bucket."""

    @abc.abstractmethod
    def uris(self, storage: Storage) -> DataUris:
        """Where it lives in `storage`'s datasets bucket."""

    @abc.abstractmethod
    def commands(self, uris: DataUris, scratch: Path) -> list[list[str]]:
        """The commands that write it to `uris`, in order (run from the repository, with the store's
        environment); `scratch` is an empty directory they may use."""

    @abc.abstractmethod
    def describe(self) -> str:
        """What it is, in a few words."""

    def trainer_args(self, uris: DataUris, task_args: argparse.Namespace) -> list[tuple[str, str]]:
        """The trainer's flags naming it: --data, and --eval-data for a task that takes one (`task_args`,
        the task's parsed flags, has eval_data)."""
        takes_eval = uris.eval is not None and hasattr(task_args, "eval_data")
        return [("--data", uris.train)] + ([("--eval-data", uris.eval)] if takes_eval else [])


def _datasets_bucket(storage: Storage) -> str:
    return storage.dataset_uri.removeprefix("s3://").partition("/")[0]


@dataclass(frozen=True)
class DatasetSpec(Dataset):
    """The demo task's generated dataset, at the backend's dataset URI."""

    shards: int = 4
    samples_per_shard: int = 1024
    seed: int = 0

    def uris(self, storage: Storage) -> DataUris:
        return DataUris(storage.dataset_uri)

    def commands(self, uris: DataUris, scratch: Path) -> list[list[str]]:
        return [[sys.executable, "-m", "train.data", "generate", "--out", uris.train,
                 "--shards", str(self.shards), "--samples-per-shard", str(self.samples_per_shard),
                 "--seed", str(self.seed)]]

    def describe(self) -> str:
        return f"the demo's generated data, {self.shards} shards x {self.samples_per_shard} samples"


@dataclass(frozen=True)
class TaskExample(Dataset):
    """A task's example data (train.task.Example) in the datasets bucket: datasets/<name>/train and /eval."""

    example: Example

    def uris(self, storage: Storage) -> DataUris:
        bucket = _datasets_bucket(storage)
        return DataUris(dataset_uri(bucket, f"{self.example.name}/train"),
                        dataset_uri(bucket, f"{self.example.name}/eval"))

    def commands(self, uris: DataUris, scratch: Path) -> list[list[str]]:
        return self.example.argv(sys.executable, uris.train, str(uris.eval), str(scratch))

    def describe(self) -> str:
        return self.example.description


@dataclass(frozen=True)
class RunData:
    dataset: Dataset | None                 # what the flow writes; None: the user's --data, as is
    # the example's sizes (option, value); those the user gives win (train.config.with_flags)
    trainer_flags: tuple[tuple[str, str], ...] = ()


def plan_run_data(task: str, trainer: TrainConfig, demo: DatasetSpec) -> RunData:
    """The data a run of `task` trains on, given the trainer's configuration. Raises UsageError for a task
    without an example when the configuration names no data (and for a task that does not load)."""
    if "--data" in trainer.named:
        return RunData(None)
    if task == DEFAULT_TASK:
        return RunData(demo)
    example = _task_class(task).example()
    if example is not None:
        return RunData(TaskExample(example), tuple(example.flags))
    with_examples = [DEFAULT_TASK] + [n for n in BUILTIN_TASKS if n != DEFAULT_TASK
                                      and _task_class(n).example() is not None]
    raise UsageError(f"--task {task}: no --data after `--`, and this command prepares data only for the "
                     f"built-in tasks ({', '.join(with_examples)}); give the task's data, e.g. "
                     "`-- --data s3://bucket/prefix`, `-- --data /shared/dir` or `-- --data synthetic`")


def _task_class(task: str) -> type[Task]:
    try:
        return load_task(task)
    except BadInput as e:
        raise UsageError(str(e)) from None
