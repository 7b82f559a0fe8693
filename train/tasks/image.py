"""The built-in `image` task: a torchvision classifier (ResNet-50 by default) over image shards.

    python -m train.data digits --out /tmp/digits                      # sklearn's 8x8 digits as PNGs
    python -m train.data pack images --src /tmp/digits --out s3://bucket/digits/train \
        --eval-out s3://bucket/digits/eval --eval-fraction 0.1 --samples-per-shard 100
    python -m train --task image --data s3://bucket/digits/train --eval-data s3://bucket/digits/eval \
        --model resnet18 --image-size 32 --lr-schedule cosine --warmup-steps 20 --weight-decay 5e-5

Images are decoded and augmented in DataLoader worker processes (pinned memory on GPUs, persistent
workers, prefetch), fed by the worker's shard stream (train.shards: each worker reads its own
shards, with read-ahead). Each sample's augmentation draws come from a seed that is a function of
(seed, epoch, shard, sample), so a resumed run sees the same crops and flips. `--data synthetic` is
Horovod's pytorch_synthetic_benchmark.py: one random batch per worker, reused every step.
Evaluation is top-1 accuracy over --eval-data, each worker evaluating its share, summed over all.
"""

from __future__ import annotations

import argparse
import collections
import io
import signal

import torch
import torch.nn.functional as F

from train import shards
from train.errors import BadInput
from train.task import Example, Task
from train.tasks.vision import import_torchvision

IMAGE_EXTS = ("png", "jpg", "jpeg", "webp", "bmp")
AUGMENTS = ("standard", "none")
# ImageNet's channel statistics, as torchvision's reference scripts use.
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _transforms(size: int, train: bool, augment: str):
    import_torchvision()
    from torchvision.transforms import v2
    if train and augment == "standard":
        head = [v2.RandomResizedCrop(size, scale=(0.35, 1.0), antialias=True), v2.RandomHorizontalFlip()]
    else:
        head = [v2.Resize(round(size * 8 / 7), antialias=True), v2.CenterCrop(size)]
    return v2.Compose([v2.ToImage(), *head, v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])


def image_bytes(sample: dict) -> bytes:
    for ext in IMAGE_EXTS:
        if ext in sample:
            return sample[ext]
    raise BadInput(f"sample {sample.get('__key__')} in shard {sample.get('__url__')} has no image "
                   f"({', '.join(IMAGE_EXTS)}); it holds "
                   f"{sorted(k for k in sample if not k.startswith('__'))}")


class DecodeSamples:
    """A map-style dataset whose "indices" are the samples themselves, (sample, seed) pairs sent to the
    DataLoader's workers by the batch sampler below; decoding and augmentation run there."""

    def __init__(self, size: int, train: bool, augment: str):
        self.size, self.train, self.augment = size, train, augment
        self._tf = None

    def __getstate__(self) -> dict:
        # The transforms are rebuilt where they run: unpickled, torchvision's objects would import
        # torchvision in the worker without import_torchvision's repair (train/tasks/vision.py).
        return {**self.__dict__, "_tf": None}

    def __getitem__(self, item) -> tuple[torch.Tensor, int]:
        from PIL import Image

        sample, seed = item
        if self._tf is None:
            self._tf = _transforms(self.size, self.train, self.augment)
        torch.default_generator.manual_seed(seed)  # this sample's crop and flip, whichever process
        with Image.open(io.BytesIO(image_bytes(sample))) as img:
            x = self._tf(img.convert("RGB"))
        return x, int(sample["cls"])


def ignore_stop_signals(_worker_id: int = 0) -> None:
    """In a DataLoader worker: SIGTERM and SIGINT are the trainer's to act on (it stops at a step
    boundary after a checkpoint, and its loader then ends the workers). A node going away signals every
    process on it (the local backend's reclaim does; so does Ctrl-C to a terminal's process group); a
    worker that died of it would fail the step instead of letting the trainer stop cleanly."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_forkserver_ignoring_stop_signals() -> None:
    """Start multiprocessing's forkserver with SIGTERM and SIGINT ignored: an ignored signal stays
    ignored across its exec, and the workers it forks inherit that. The forkserver must outlive a
    SIGTERM: a DataLoader worker takes the process that started it (the forkserver) for its manager
    and exits when that one is gone (torch.utils.data._utils.worker.ManagerWatchdog). The trainer
    ignores the two signals only while the server is spawned, once, before training starts."""
    import multiprocessing.forkserver

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, signal.SIG_IGN)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class StreamBatches:
    """The DataLoader's batch sampler: the shard stream's batches, in order; the position after each
    batch waits in `positions` until the DataLoader delivers that batch (in order, as it does)."""

    def __init__(self):
        self.stream: shards.ShardStream | None = None
        self.positions: collections.deque = collections.deque()

    def __iter__(self):
        for samples, position in self.stream:
            self.positions.append(position)
            yield samples


def train_loader(decode: DecodeSamples, batches: StreamBatches, workers: int, prefetch: int,
                 pin_memory: bool) -> torch.utils.data.DataLoader:
    """The training DataLoader: `workers` processes decoding the batches `batches` deals out (0: in
    this process). The benchmarks' bare loops build theirs here too (bench/image_loop.py)."""
    return torch.utils.data.DataLoader(
        decode, batch_sampler=batches, num_workers=workers, pin_memory=pin_memory,
        persistent_workers=workers > 0, prefetch_factor=prefetch if workers else None,
        worker_init_fn=ignore_stop_signals if workers else None,
        # forkserver, as Horovod's pytorch_imagenet_resnet50.py: a fork of a process running
        # Horovod's and the interconnect's threads is not safe everywhere
        multiprocessing_context="forkserver" if workers else None)


class ImageTask(Task):
    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model", default="resnet50", help="a torchvision classification model by name")
        parser.add_argument("--image-size", type=int, default=224, help="crop size fed to the model")
        parser.add_argument("--eval-data", default=None, help="packed evaluation images (top-1 accuracy)")
        parser.add_argument("--augment", choices=AUGMENTS, default="standard",
                            help="standard: random resized crop + horizontal flip; "
                                 "none: resize + center crop")
        parser.add_argument("--loader-workers", type=int, default=4,
                            help="DataLoader worker processes decoding images (0: in the training process)")
        parser.add_argument("--prefetch", type=int, default=2,
                            help="batches each loader worker prepares ahead")
        parser.add_argument("--readahead-shards", type=int, default=2, help="shards fetched ahead per worker")
        parser.add_argument("--num-classes", type=int, default=1000, help="--data synthetic only")

    @classmethod
    def check_arguments(cls, args: argparse.Namespace) -> list[str]:
        problems = []
        models = import_torchvision().models.list_models(module=import_torchvision().models)
        if args.model not in models:
            problems.append(f"--model {args.model!r}: not a torchvision classification model (e.g. resnet18, "
                            "resnet50, mobilenet_v3_small; torchvision.models.list_models())")
        for flag, value, least in (("--image-size", args.image_size, 8),
                                   ("--loader-workers", args.loader_workers, 0),
                                   ("--prefetch", args.prefetch, 1),
                                   ("--readahead-shards", args.readahead_shards, 1),
                                   ("--num-classes", args.num_classes, 2)):
            if value < least:
                problems.append(f"{flag} {value}: must be >= {least}")
        return problems

    @classmethod
    def example(cls) -> Example:
        """scikit-learn's 1797 handwritten digits as image shards, a tenth set aside for evaluation (their
        PNGs are written by cluster/example_data.py: scikit-learn stays out of the trainer's image). The
        sizes: ShuffleNet V2 (1.3 M parameters for 10 classes: a 15 MB checkpoint with Adam's moments,
        9-11 s to write on a loaded 2-core machine, inside the local reclaim's 30 s default grace;
        ResNet-18's 134 MB is not) learns the digits at 32 px (measured, 1 worker, 100 steps: loss
        2.40 -> 1.59, top-1 0.55)."""
        return Example(
            "digits", "scikit-learn's handwritten digits, packed as image shards",
            (("{python}", "-m", "cluster.example_data", "digits", "--out", "{scratch}/digits"),
             ("{python}", "-m", "train.data", "pack", "images", "--src", "{scratch}/digits",
              "--out", "{train}", "--eval-out", "{eval}", "--eval-fraction", "0.1",
              "--samples-per-shard", "100")),
            (("--model", "shufflenet_v2_x1_0"), ("--image-size", "32"), ("--loader-workers", "1"),
             ("--optimizer", "adam"), ("--lr", "0.002")))

    train_set: shards.ShardedDataset | None = None
    eval_set: shards.ShardedDataset | None = None

    def prepare(self, rank: int, size: int) -> None:
        ctx = self.ctx
        if ctx.data != "synthetic":
            self.train_set = shards.open_dataset(ctx.data, ctx.s3_endpoint_url, "image")
            shards.check_fits(self.train_set, ctx.batch_size, size)
            self.num_classes = len(self.train_set.index["classes"])
        else:
            self.num_classes = self.args.num_classes
        if self.args.eval_data:
            self.eval_set = shards.open_dataset(self.args.eval_data, ctx.s3_endpoint_url, "image")
            classes = self.eval_set.index["classes"]
            if self.train_set is not None and classes != self.train_set.index["classes"]:
                raise BadInput(f"--eval-data {self.args.eval_data}: its classes differ from "
                               f"--data {ctx.data}'s")
        self._loader = None
        self._batches = StreamBatches()
        if self.train_set is not None and self.args.loader_workers:
            start_forkserver_ignoring_stop_signals()

    def prepare_eval(self) -> None:
        self.eval_set = shards.open_dataset(self.args.eval_data, self.ctx.s3_endpoint_url, "image")
        classes = getattr(self, "classes", None)
        if classes is not None and self.eval_set.index["classes"] != classes:
            raise BadInput(f"--eval-data {self.args.eval_data}: its classes differ from the model's")

    def model_info(self) -> dict:
        classes = (self.train_set.index["classes"] if self.train_set is not None
                   else [str(i) for i in range(self.num_classes)])
        # what inference needs to prepare an image as evaluation does (train/export.py)
        return {"classes": classes, "image_size": self.args.image_size, "mean": MEAN, "std": STD}

    def use_model_info(self, info: dict) -> None:
        self.classes = info["classes"]
        self.num_classes = len(self.classes)

    def build_model(self) -> torch.nn.Module:
        tv = import_torchvision()
        return tv.models.get_model(self.args.model, weights=None, num_classes=self.num_classes)

    def train_batches(self, position, rank, size):
        ctx, a = self.ctx, self.args
        if self.train_set is None:  # Horovod's synthetic benchmark: one random batch, every step
            g = torch.Generator().manual_seed(ctx.seed * 100_003 + rank)
            x = torch.randn((ctx.batch_size, 3, a.image_size, a.image_size), generator=g)
            y = torch.randint(0, self.num_classes, (ctx.batch_size,), generator=g)
            batch, position = (x.to(ctx.device), y.to(ctx.device)), {}
            while True:
                yield batch, position
        if self._batches.stream is not None:
            self._batches.stream.close()
        self._batches.stream = shards.ShardStream(self.train_set, ctx.seed, ctx.batch_size, rank, size,
                                                  position, readahead=a.readahead_shards)
        self._batches.positions.clear()
        if self._loader is None:
            self._loader = train_loader(DecodeSamples(a.image_size, train=True, augment=a.augment),
                                        self._batches, a.loader_workers, a.prefetch,
                                        pin_memory=ctx.device.type == "cuda")
        for batch in self._loader:
            yield batch, self._batches.positions.popleft()

    def loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    def eval_batches(self, rank, size):
        return None if self.eval_set is None else self._eval_batches(rank, size)

    def _eval_batches(self, rank, size):
        decode = DecodeSamples(self.args.image_size, train=False, augment="none")
        batch: list = []
        for sample in shards.eval_samples(self.eval_set, rank, size):
            batch.append(decode[(sample, 0)])
            if len(batch) == self.ctx.batch_size:
                yield torch.utils.data.default_collate(batch)
                batch = []
        if batch:
            yield torch.utils.data.default_collate(batch)

    def eval_sums(self, model, batch):
        x, y = batch
        return {"correct": (model(x).argmax(1) == y).sum().item(), "samples": len(y)}

    def eval_metrics(self, sums):
        return {"top1": sums.get("correct", 0.0) / max(sums.get("samples", 0.0), 1.0),
                "samples": sums.get("samples", 0.0)}

    def close(self) -> None:
        batches = getattr(self, "_batches", None)
        if batches is not None and batches.stream is not None:
            batches.stream.close()
        self._loader = None  # its persistent workers end with it
