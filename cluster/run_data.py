"""What a run trains on when the trainer is given no `--data`: the flow (cluster/flow.py) writes it into
the datasets bucket before the first attempt, unless its index is there already.

    demo    the generated dataset (`python -m train.data generate`), at the backend's dataset URI
    image   scikit-learn's handwritten digits (cluster/example_data.py) packed as image shards:
            s3://<datasets bucket>/datasets/digits/train and .../digits/eval
    lm      a few packages of this Python's standard library source packed as byte-token shards:
            .../datasets/stdlib/train and .../stdlib/eval

The example data comes with the example's sizes (EXAMPLE_FLAGS: a small model at a small resolution),
so that `ringtrain run --task image|lm` trains in a few minutes on CPU workers; a flag the user gives
after `--` wins. A `--data` given after `--` is used as is and nothing is written. Another task
without `--data` is refused before anything starts: there is no data to prepare for it.

    data = plan_run_data("image", trainer_args, DatasetSpec())   # pure
    data.dataset.uris(storage), data.dataset.commands(uris, scratch_dir)
"""

from __future__ import annotations

import abc
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.backend import Storage
from cluster.usage import UsageError
from infra.storage_layout import dataset_uri

# The standard library packages packed for `lm`: about 2.7 MB of Python source, 21 k samples of 128 + 1
# bytes; the whole library would be ~10x that, for no better example.
STDLIB_PACKAGES = ("asyncio", "email", "json", "http", "logging", "unittest", "xml")

# The examples' sizes for CPU workers: 2 workers sharing 2 cores train 300 steps with a reclaim and a
# resume in a few minutes. image: ShuffleNet V2 (1.3 M parameters for 10 classes: a 15 MB checkpoint with
# Adam's moments, 9-11 s to write on a loaded 2-core machine, inside the local reclaim's 30 s default
# grace; ResNet-18's 134 MB is not) learns the digits at 32 px (measured, 1 worker, 100 steps: loss
# 2.40 -> 1.59, top-1 0.55).
EXAMPLE_FLAGS: dict[str, tuple[tuple[str, str], ...]] = {
    "image": (("--model", "shufflenet_v2_x1_0"), ("--image-size", "32"), ("--loader-workers", "1"),
              ("--optimizer", "adam"), ("--lr", "0.002")),
    "lm": (("--layers", "2"), ("--heads", "4"), ("--dim", "64"), ("--optimizer", "adam"), ("--lr", "0.001")),
}


def given(args: Sequence[str], flag: str) -> bool:
    """Whether `flag` is among the arguments, as `--flag VALUE` or `--flag=VALUE` (pure)."""
    return any(arg == flag or arg.startswith(f"{flag}=") for arg in args)


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

    def trainer_args(self, uris: DataUris) -> list[tuple[str, str]]:
        """The trainer's flags naming it."""
        return [("--data", uris.train)] + ([("--eval-data", uris.eval)] if uris.eval else [])


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
class DigitsImages(Dataset):
    """scikit-learn's 1797 handwritten digits as image shards, a tenth set aside for evaluation."""

    samples_per_shard: int = 100
    eval_fraction: float = 0.1

    def uris(self, storage: Storage) -> DataUris:
        bucket = _datasets_bucket(storage)
        return DataUris(dataset_uri(bucket, "digits/train"), dataset_uri(bucket, "digits/eval"))

    def commands(self, uris: DataUris, scratch: Path) -> list[list[str]]:
        folder = str(scratch / "digits")
        return [[sys.executable, "-m", "cluster.example_data", "digits", "--out", folder],
                [sys.executable, "-m", "train.data", "pack", "images", "--src", folder, "--out", uris.train,
                 "--eval-out", str(uris.eval), "--eval-fraction", str(self.eval_fraction),
                 "--samples-per-shard", str(self.samples_per_shard)]]

    def describe(self) -> str:
        return "scikit-learn's handwritten digits, packed as image shards"


@dataclass(frozen=True)
class StdlibText(Dataset):
    """A few packages of this Python's standard library source as byte-token shards."""

    packages: tuple[str, ...] = STDLIB_PACKAGES
    seq_len: int = 128
    samples_per_shard: int = 1000
    eval_fraction: float = 0.02

    def uris(self, storage: Storage) -> DataUris:
        bucket = _datasets_bucket(storage)
        return DataUris(dataset_uri(bucket, f"stdlib-seq{self.seq_len}/train"),
                        dataset_uri(bucket, f"stdlib-seq{self.seq_len}/eval"))

    def commands(self, uris: DataUris, scratch: Path) -> list[list[str]]:
        from cluster.example_data import stdlib_source

        root = stdlib_source()
        return [[sys.executable, "-m", "train.data", "pack", "text",
                 "--src", *(str(root / p) for p in self.packages), "--out", uris.train,
                 "--eval-out", str(uris.eval), "--eval-fraction", str(self.eval_fraction),
                 "--seq-len", str(self.seq_len), "--samples-per-shard", str(self.samples_per_shard)]]

    def describe(self) -> str:
        return f"the Python standard library's source ({', '.join(self.packages)}), packed as byte tokens"


EXAMPLE_DATA: dict[str, Dataset] = {"image": DigitsImages(), "lm": StdlibText()}


@dataclass(frozen=True)
class RunData:
    dataset: Dataset | None                 # what the flow writes; None: the user's --data, as is
    trainer_flags: tuple[str, ...] = ()     # the example's sizes, the flags the user did not give


def plan_run_data(task: str, trainer_args: Sequence[str], demo: DatasetSpec) -> RunData:
    """The data a run of `task` trains on, given the trainer's arguments (pure). Raises UsageError for
    a task this command has no data for when the arguments give none."""
    if given(trainer_args, "--data"):
        return RunData(None)
    if task == "demo":
        return RunData(demo)
    if task in EXAMPLE_DATA:
        flags = [part for flag, value in EXAMPLE_FLAGS[task] if not given(trainer_args, flag)
                 for part in (flag, value)]
        return RunData(EXAMPLE_DATA[task], tuple(flags))
    raise UsageError(f"--task {task}: no --data after `--`, and this command prepares data only for the "
                     f"built-in tasks ({', '.join(['demo', *EXAMPLE_DATA])}); give the task's data, e.g. "
                     "`-- --data s3://bucket/prefix`, `-- --data /shared/dir` or `-- --data synthetic`")
