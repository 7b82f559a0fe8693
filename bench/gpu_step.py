"""scripts/gpu-check's measurement of the trainer's own step (issue 35, item 8): ResNet-50, batch 256,
bf16, channels_last, on one GPU, as `Trainer.train_step` runs it (the image task's loss, the step's
stats carried in the gradient reduction, the scaler and the optimizer), in two runs:

- synthetic: `--data synthetic` (one batch on the device, reused: Horovod's synthetic benchmark);
- packed JPEGs: photo-like 500x375 JPEGs packed with `python -m train.data pack images`, read by the
  image task's loader workers (decode --decode auto, and --decode nvjpeg on the GPU).

Each is reported as a ratio to a bare torch loop (the same model, batch, bf16 autocast, channels_last
and SGD, on synthetic data) timed in the same run, with NVIDIA's published figure beside it. Where
Horovod is not importable (the lent GPU machines: it is built from source), the step's Horovod calls
go to `SingleProcessHorovod`, a one-worker stand-in: with one worker they reduce nothing anyway, and
the report says so.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

# NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5, training performance (A100 80GB, AMP, DALI,
# batch 256): 2,470 images/s on 1 GPU, 16,621 on 8. No H100 figure is published there for PyTorch.
NVIDIA_FIGURE = {"images_per_sec": 2470,
                 "source": "NVIDIA DeepLearningExamples PyTorch ResNet-50 v1.5, A100 80GB, AMP + DALI, "
                           "batch 256, 1 GPU (16,621 images/s on 8)"}


class _NoCompression:
    none = fp16 = None


class SingleProcessHorovod:
    """The few Horovod calls the trainer's step makes, for one worker, where Horovod is not installed:
    rank 0 of 1; reductions return their input; DistributedOptimizer is the wrapped optimizer with
    Horovod's synchronize/skip_synchronize."""

    Compression = _NoCompression
    Average, Adasum, Sum = "average", "adasum", "sum"

    def rank(self) -> int:
        return 0

    local_rank = rank

    def size(self) -> int:
        return 1

    local_size = size

    def mpi_enabled(self) -> bool:
        return False

    def allreduce(self, tensor, **_):
        return tensor

    def allreduce_async_(self, tensor, **_):
        return tensor

    def synchronize(self, handle):
        return handle

    def allgather_object(self, obj, **_):
        return [obj]

    def broadcast_parameters(self, *_, **__) -> None:
        pass

    broadcast_optimizer_state = broadcast_parameters

    def DistributedOptimizer(self, optimizer, **_):  # noqa: N802 - Horovod's name
        return _Optimizer(optimizer)


class _Optimizer:
    def __init__(self, base):
        self._base = base
        self._grad_accs: list = []  # no per-parameter hooks (as Horovod with one worker)

    def __getattr__(self, name):
        return getattr(self._base, name)

    def synchronize(self) -> None:
        pass

    def skip_synchronize(self):
        return contextlib.nullcontext()


def horovod_or_stand_in():
    """(hvd, note): Horovod initialised for one worker, or the stand-in and why."""
    try:
        import horovod.torch as hvd
    except ImportError as e:
        return SingleProcessHorovod(), (f"Horovod is not importable here ({e}): the step's Horovod calls ran "
                                        "through a single-process stand-in (one worker reduces nothing)")
    hvd.init()
    return hvd, None


def timed_trainer_steps(args: list[str], hvd, steps: int, warmup: int):
    """(the trainer built from `args`, the seconds of each of its `steps` train_step calls after `warmup`
    untimed ones, the seconds of all `steps` together). The caller closes trainer.task."""
    import torch

    from train.config import parse_args
    from train.stop import STOP
    from train.trainer import Progress, Trainer

    trainer = Trainer(parse_args(args), hvd, STOP)
    trainer.prepare_inputs()
    trainer.build()
    progress = Progress()
    sync = torch.cuda.synchronize if trainer.on_gpu else (lambda: None)
    for _ in range(warmup):
        trainer.train_step(progress)
    sync()
    times = []
    started = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        trainer.train_step(progress)  # its loss's .tolist() waits for the step on the GPU
        times.append(time.perf_counter() - t)
    sync()
    return trainer, times, time.perf_counter() - started


def trainer_images_per_sec(data: str, *, model: str = "resnet50", batch: int = 256,
                           image_size: int = 224, precision: str = "bf16", steps: int = 30, warmup: int = 8,
                           loader_workers: int = 0, decode: str = "auto", hvd=None) -> dict:
    """Images/s of `Trainer.train_step` over `steps` after `warmup`, one worker."""
    hvd = hvd or horovod_or_stand_in()[0]
    trainer, times, elapsed = timed_trainer_steps(
        ["--task", "image", "--data", data, "--model", model, "--batch-size", str(batch),
         "--image-size", str(image_size), "--precision", precision, "--steps", str(warmup + steps),
         "--loader-workers", str(loader_workers), "--decode", decode, "--no-progress",
         "--cpu-affinity", "off", "--num-classes", "1000"], hvd, steps, warmup)
    trainer.task.close()
    return {"images_per_sec": round(batch * steps / elapsed, 1),
            "median_step_ms": round(statistics.median(times) * 1e3, 2), "steps": steps, "batch_size": batch,
            "precision": trainer.precision, "memory_format": str(trainer.memory_format),
            "loader_workers": loader_workers, "decode": decode, "data": "synthetic" if data == "synthetic"
            else "packed JPEGs"}


def packed_photos(workdir: Path, images: int = 2048) -> str:
    from bench.image_input import InputShape, write_photos
    from train.data import main as data_main

    photos, packed = workdir / "photos", workdir / "packed"
    write_photos(photos, images, InputShape())
    with contextlib.redirect_stdout(sys.stderr):
        if data_main(["pack", "images", "--src", str(photos), "--out", str(packed),
                      "--samples-per-shard", "128"]) != 0:
            raise RuntimeError("python -m train.data pack images failed")
    return str(packed)


def measure(report: dict, check, bare_loop) -> None:
    """gpu-check's checks for the trainer's step; `check(report, name, fn)` records each; `bare_loop()`
    times the bare torch loop (bench.gpu_check.resnet50 at batch 256: the same model, bf16 autocast,
    channels_last, SGD, synthetic batch on the device) and returns its images_per_sec."""
    import os

    hvd, note = horovod_or_stand_in()
    report["trainer_step_horovod"] = note or "Horovod, one worker"
    bare: list[float] = []

    def bare_run() -> dict:
        result = bare_loop()
        bare.append(result["images_per_sec"])
        return result

    def against_bare(result: dict) -> dict:
        base = statistics.mean(bare) if bare else None
        return {**result, "bare_loop_images_per_sec": base,
                "ratio_to_bare_loop": round(result["images_per_sec"] / base, 3) if base else None,
                "nvidia_published": NVIDIA_FIGURE}

    workers = max(1, min(12, (os.cpu_count() or 2) - 2))
    check(report, "bare_loop_resnet50_b256", bare_run)
    check(report, "trainer_step_synthetic",
          lambda: against_bare(trainer_images_per_sec("synthetic", hvd=hvd)))
    with tempfile.TemporaryDirectory(prefix="gpu-check-photos-") as tmp:
        data = packed_photos(Path(tmp))
        for decode in ("auto", "nvjpeg"):
            check(report, f"trainer_step_packed_jpeg_{decode}", lambda decode=decode: against_bare(
                trainer_images_per_sec(data, loader_workers=workers, decode=decode, steps=20, hvd=hvd)))
    check(report, "bare_loop_resnet50_b256_again", bare_run)  # the GPU's clocks, after the trainer's runs
