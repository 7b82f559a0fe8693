"""The built-in `image` task: a torchvision classifier (ResNet-50 by default) over image shards.

    python -m train.data digits --out /tmp/digits                      # sklearn's 8x8 digits as PNGs
    python -m train.data pack images --src /tmp/digits --out s3://bucket/digits/train \
        --eval-out s3://bucket/digits/eval --eval-fraction 0.1 --samples-per-shard 100
    python -m train --task image --data s3://bucket/digits/train --eval-data s3://bucket/digits/eval \
        --model resnet18 --image-size 32 --lr-schedule cosine --warmup-steps 20 --weight-decay 5e-5

The DataLoader's worker processes carry the data (`ImageShards`): each streams its own shards
(train.shards.WorkerStream: fetch, verify, unpack, a shuffle block across shards), decodes, crops and
flips them (train.decode, chosen by --decode) and hands uint8 batches over; the training process
receives finished batches and counts positions. Each sample's crop and flip come from a seed that is a
function of (seed, epoch, shard, sample), so a resumed run sees the same crops, with any number of
loader workers. On the device the batch becomes float and normalised (`normalize`); on GPUs the next
batch's copy runs from pinned memory on a stream of its own (train.prefetch). Evaluation runs through
the same workers. `--data synthetic` is Horovod's pytorch_synthetic_benchmark.py: one random batch per
worker, reused every step.
"""

from __future__ import annotations

import argparse
import contextlib
import signal

import torch
import torch.nn.functional as F

from train import decode, shards
from train.errors import BadInput
from train.gpu import memory_format, to_device
from train.prefetch import prefetched
from train.recipe import param_groups
from train.task import Example, Task
from train.tasks.vision import import_torchvision

IMAGE_EXTS = ("png", "jpg", "jpeg", "webp", "bmp")
AUGMENTS = ("standard", "none")
# ImageNet's channel statistics, as torchvision's reference scripts use, on the 0-255 scale.
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# NVIDIA DLE ResNet-50 v1.5 (PyTorch, "Label smoothing: 0.1") and Szegedy et al. 2016 ("Rethinking the
# Inception architecture", section 7) train ImageNet with a label smoothing of 0.1.
DEFAULT_LABEL_SMOOTHING = 0.1


def image_bytes(sample: dict) -> bytes:
    for ext in IMAGE_EXTS:
        if ext in sample:
            return sample[ext]
    raise BadInput(f"sample {sample.get('__key__')} in shard {sample.get('__url__')} has no image "
                   f"({', '.join(IMAGE_EXTS)}); it holds "
                   f"{sorted(k for k in sample if not k.startswith('__'))}")


def normalize(x: torch.Tensor, fmt: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    """A uint8 batch [B, 3, H, W] as float, normalised with ImageNet's statistics, where it is (on the
    device); a float batch (synthetic data) is taken as normalised already."""
    if x.dtype != torch.uint8:
        return x
    mean = torch.tensor(MEAN, device=x.device).mul_(255).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=x.device).mul_(255).view(1, 3, 1, 1)
    return x.to(dtype=torch.float32, memory_format=fmt).sub_(mean).div_(std)


class ImageShards(torch.utils.data.IterableDataset):
    """What each DataLoader worker of a rank does: stream its own shards (its plan worker's), decode,
    crop and flip each sample, and yield uint8 batches (x [B, 3, size, size], y [B]); with --decode
    nvjpeg, the JPEG bytes and each sample's crop instead, for the GPU to decode. Evaluation
    (`train=False`): this worker's share of the evaluation shards in stored order, centre crops, the
    last batch short."""

    def __init__(self, ds: shards.ShardedDataset, seed: int, batch_size: int, rank: int, world: int,
                 plan: shards.Plan | None, decoder: str, size: int, augment: str, readahead: int,
                 train: bool = True, loader_workers: int = 1):
        self.ds, self.seed, self.batch_size, self.rank, self.world = ds, seed, batch_size, rank, world
        self.plan, self.decoder, self.size, self.augment = plan, decoder, size, augment
        self.readahead, self.train, self.loader_workers = readahead, train, loader_workers

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        loader_worker = info.id if info is not None else 0
        if self.train:
            worker = self.plan.worker_for(self.rank, loader_worker)
            for batch in shards.WorkerStream(self.ds, self.seed, self.batch_size, self.plan, worker,
                                             self.readahead):
                yield self.collate(batch)
        else:
            workers = self.world * self.loader_workers
            batch = []
            for sample in shards.eval_samples(self.ds, self.rank * self.loader_workers + loader_worker,
                                              workers):
                batch.append((sample, 0))
                if len(batch) == self.batch_size:
                    yield self.collate(batch)
                    batch = []
            if batch:
                yield self.collate(batch)

    def collate(self, batch: list[tuple[dict, int]]):
        labels = torch.tensor([int(s["cls"]) for s, _ in batch], dtype=torch.int64)
        if self.decoder == "nvjpeg":
            datas, crops = [], []
            for sample, seed in batch:
                data = image_bytes(sample)
                with _naming(sample):
                    crops.append(decode.crop_params(*decode.image_size(data), seed, self.train, self.augment,
                                                    self.size).as_list())
                datas.append(torch.frombuffer(bytearray(data), dtype=torch.uint8))
            return datas, torch.tensor(crops, dtype=torch.int64), labels
        images = []
        for sample, seed in batch:
            with _naming(sample):
                images.append(decode.sample_tensor(image_bytes(sample), seed, self.decoder, self.train,
                                                   self.augment, self.size))
        return torch.stack(images), labels


@contextlib.contextmanager
def _naming(sample: dict):
    """A sample that does not decode is bad input naming its shard and key (`pack images` refuses
    such files; a dataset written otherwise may still hold one)."""
    try:
        yield
    except BadInput:
        raise
    except Exception as e:  # the decoders raise many types (OSError, ValueError, RuntimeError, ...)
        raise BadInput(f"sample {sample.get('__key__')} in shard {sample.get('__url__')} cannot be "
                       f"decoded: {type(e).__name__}: {e}") from None


def loader_error(e: BadInput) -> BadInput:
    """A BadInput raised in a DataLoader worker comes back with the worker's traceback in its text: its
    own one line again."""
    lines = [ln for ln in str(e).splitlines() if ln.startswith(("BadInput: ", "train.errors.BadInput: "))]
    return BadInput(lines[-1].split(": ", 1)[1]) if lines else e


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
    import multiprocessing
    import multiprocessing.forkserver

    # The server imports torch, torchvision and the decoders once; each worker it forks starts with
    # them (importing them costs each worker seconds of CPU; elastic resets and evaluation start
    # workers too).
    multiprocessing.set_forkserver_preload(["train.tasks.image", "train.decode"])
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, signal.SIG_IGN)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def make_loader(dataset: ImageShards, workers: int, prefetch: int, pin_memory: bool,
                persistent: bool = False) -> torch.utils.data.DataLoader:
    """The DataLoader over `dataset`: `workers` processes, each yielding whole batches (0: in this
    process). The benchmarks' loops build theirs here too (bench/image_loop.py)."""
    return torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=workers, pin_memory=pin_memory,
        persistent_workers=persistent and workers > 0, prefetch_factor=prefetch if workers else None,
        worker_init_fn=ignore_stop_signals if workers else None,
        # forkserver, as Horovod's pytorch_imagenet_resnet50.py: a fork of a process running
        # Horovod's and the interconnect's threads is not safe everywhere
        multiprocessing_context="forkserver" if workers else None)


def convert_sync_batchnorm(module: torch.nn.Module, sync_bn: type) -> torch.nn.Module:
    """Every BatchNorm*d of `module` as `sync_bn` (hvd.SyncBatchNorm), its parameters and statistics
    kept: what torch.nn.SyncBatchNorm.convert_sync_batchnorm does for torch.distributed's."""
    out = module
    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(module, sync_bn):
        out = sync_bn(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats)
        out.load_state_dict(module.state_dict())
        out.train(module.training)
    for name, child in module.named_children():
        out.add_module(name, convert_sync_batchnorm(child, sync_bn))
    return out


class ImageTask(Task):
    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model", default="resnet50", help="a torchvision classification model by name")
        parser.add_argument("--image-size", type=int, default=224, help="crop size fed to the model")
        parser.add_argument("--eval-data", default=None, help="packed evaluation images (top-1 accuracy)")
        parser.add_argument("--augment", choices=AUGMENTS, default="standard",
                            help="standard: random resized crop, area (0.08, 1), ratio (3/4, 4/3) + "
                                 "horizontal flip (torchvision's and NVIDIA DLE's ImageNet recipe); "
                                 "none: resize + center crop")
        parser.add_argument("--decode", choices=decode.DECODERS, default="auto",
                            help="auto: the fastest CPU decoder measured (simplejpeg, else pil); pil; "
                                 "simplejpeg; torchvision (its CPU image extension); nvjpeg: batches "
                                 "decoded on the GPU (refused without CUDA)")
        parser.add_argument("--label-smoothing", type=float, default=DEFAULT_LABEL_SMOOTHING,
                            help="cross-entropy label smoothing (default 0.1, NVIDIA DLE's ResNet-50 "
                                 "v1.5 and Szegedy et al. 2016)")
        parser.add_argument("--sync-bn", action="store_true",
                            help="BatchNorm statistics over all workers' batches (hvd.SyncBatchNorm; "
                                 "GPU workers only)")
        parser.add_argument("--loader-workers", type=int, default=4,
                            help="DataLoader worker processes per worker, each reading, decoding and "
                                 "batching its own shards (0: in the training process)")
        parser.add_argument("--prefetch", type=int, default=2,
                            help="batches each loader worker prepares ahead")
        parser.add_argument("--readahead-shards", type=int, default=2,
                            help="shards fetched ahead per loader worker")
        parser.add_argument("--shuffle-buffer", type=int, default=shards.DEFAULT_SHUFFLE_BUFFER,
                            help="samples each loader worker shuffles together across its shards, held "
                                 "as raw bytes (default 8192, timm's WebDataset reader's; 0: each "
                                 "shard's own order only)")
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
                                   ("--shuffle-buffer", args.shuffle_buffer, 0),
                                   ("--num-classes", args.num_classes, 2)):
            if value < least:
                problems.append(f"{flag} {value}: must be >= {least}")
        if not 0.0 <= args.label_smoothing < 1.0:
            problems.append(f"--label-smoothing {args.label_smoothing}: must be in [0, 1)")
        return problems

    @classmethod
    def example(cls) -> Example:
        """scikit-learn's 1797 handwritten digits as image shards, a tenth set aside for evaluation (their
        PNGs are written by cluster/example_data.py: scikit-learn stays out of the trainer's image). The
        sizes: ShuffleNet V2 (1.3 M parameters for 10 classes: a 15 MB checkpoint with Adam's moments,
        written well inside the local reclaim's 30 s default grace; ResNet-18's 134 MB is not) learns
        the digits at 32 px in 100 steps of one worker."""
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
    memory_format = torch.contiguous_format
    _batches = None  # the training DataLoader's iterator (its workers)
    _eval_loader = None

    @property
    def loader_workers(self) -> int:
        """Plan workers per rank: the DataLoader's workers, or the training process itself."""
        return max(self.args.loader_workers, 1)

    def prepare(self, rank: int, size: int) -> None:
        ctx = self.ctx
        cuda = ctx.device.type == "cuda"
        self.decoder = decode.resolve(self.args.decode, cuda)
        if self.args.sync_bn and not cuda:
            raise BadInput("--sync-bn uses hvd.SyncBatchNorm, which Horovod implements for GPU tensors "
                           "only; leave it out on CPU workers")
        if ctx.data != "synthetic":
            self.train_set = shards.open_dataset(ctx.data, ctx.s3_endpoint_url, "image")
            shards.check_fits(self.train_set, ctx.batch_size, size, self.loader_workers)
            self.num_classes = len(self.train_set.index["classes"])
        else:
            self.num_classes = self.args.num_classes
        if self.args.eval_data:
            self.eval_set = shards.open_dataset(self.args.eval_data, ctx.s3_endpoint_url, "image")
            classes = self.eval_set.index["classes"]
            if self.train_set is not None and classes != self.train_set.index["classes"]:
                raise BadInput(f"--eval-data {self.args.eval_data}: its classes differ from "
                               f"--data {ctx.data}'s")
        if (self.train_set is not None or self.eval_set is not None) and self.args.loader_workers:
            start_forkserver_ignoring_stop_signals()

    def prepare_eval(self) -> None:
        """Evaluation only (an export's evaluate): the decoder and the evaluation data, no training set."""
        self.decoder = decode.resolve(self.args.decode, self.ctx.device.type == "cuda")
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
        model = tv.models.get_model(self.args.model, weights=None, num_classes=self.num_classes)
        self.memory_format = memory_format(model, self.ctx.device.type == "cuda")
        if self.args.sync_bn:
            import horovod.torch as hvd

            model = convert_sync_batchnorm(model, hvd.SyncBatchNorm)
        return model

    def parameter_groups(self, model, weight_decay):
        """No weight decay on biases and normalisation weights (train.recipe.param_groups)."""
        return param_groups(list(model.named_parameters()), weight_decay)

    def _move(self, batch):
        """A batch from the loader onto the device (on the prefetch stream, train.prefetch)."""
        device = self.ctx.device
        if self.decoder == "nvjpeg":
            datas, crops, labels = batch
            x = decode.gpu_batch(datas, crops, self.args.image_size, device)
            return x, labels.to(device, non_blocking=True)
        return to_device(batch, device)

    def train_batches(self, position, rank, size):
        ctx, a = self.ctx, self.args
        if self.train_set is None:  # Horovod's synthetic benchmark: one random batch, every step
            g = torch.Generator().manual_seed(ctx.seed * 100_003 + rank)
            x = torch.randn((ctx.batch_size, 3, a.image_size, a.image_size), generator=g)
            y = torch.randint(0, self.num_classes, (ctx.batch_size,), generator=g)
            batch, position = (x.to(ctx.device), y.to(ctx.device)), {}
            while True:
                yield batch, position
        self.close_loader()
        plan = shards.Plan.from_state(position, size, self.loader_workers, a.shuffle_buffer).for_world(
            self.train_set, ctx.seed, ctx.batch_size, size, self.loader_workers, a.shuffle_buffer)
        positions = shards.RankPositions(self.train_set, ctx.seed, ctx.batch_size, plan)
        dataset = ImageShards(self.train_set, ctx.seed, ctx.batch_size, rank, size, plan, self.decoder,
                              a.image_size, a.augment, a.readahead_shards)
        loader = make_loader(dataset, a.loader_workers, a.prefetch, pin_memory=ctx.device.type == "cuda")
        self._batches = iter(loader)
        pairs = ((batch, positions.advance()) for batch in self._batches)
        try:
            yield from prefetched(pairs, ctx.device, self._move)
        except BadInput as e:
            raise loader_error(e) from None

    def loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(model(normalize(x, self.memory_format)), y,
                               label_smoothing=self.args.label_smoothing)

    def eval_batches(self, rank, size):
        if self.eval_set is None:
            return None
        a = self.args
        if self._eval_loader is None:  # kept: its workers serve every evaluation of the run
            dataset = ImageShards(self.eval_set, self.ctx.seed, self.ctx.batch_size, rank, size, None,
                                  self.decoder, a.image_size, "none", a.readahead_shards, train=False,
                                  loader_workers=self.loader_workers)
            self._eval_loader = make_loader(dataset, a.loader_workers, a.prefetch,
                                            pin_memory=self.ctx.device.type == "cuda", persistent=True)
        return self._eval(self._eval_loader)

    def _eval(self, loader):
        try:
            yield from (batch for batch, _ in prefetched(((b, None) for b in loader), self.ctx.device,
                                                         self._move))
        except BadInput as e:
            raise loader_error(e) from None

    def eval_sums(self, model, batch):
        x, y = batch
        return {"correct": (model(normalize(x, self.memory_format)).argmax(1) == y).sum().item(),
                "samples": len(y)}

    def eval_metrics(self, sums):
        return {"top1": sums.get("correct", 0.0) / max(sums.get("samples", 0.0), 1.0),
                "samples": sums.get("samples", 0.0)}

    def close_loader(self) -> None:
        """End the training loader's workers now. Left to the garbage collector they can outlive the
        run: the trainer still holds this task's batch generator at exit, and multiprocessing's exit
        handler would wait forever on workers that ignore SIGTERM (ignore_stop_signals)."""
        batches, self._batches = self._batches, None
        _shut_down(batches)

    def close(self) -> None:
        self.close_loader()
        loader, self._eval_loader = self._eval_loader, None
        _shut_down(getattr(loader, "_iterator", None))  # a persistent loader keeps its iterator there


def _shut_down(batches) -> None:
    """Stop a DataLoader iterator's workers (torch's _MultiProcessingDataLoaderIter._shutdown_workers,
    what its __del__ calls; an iterator without workers has none to stop)."""
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
