"""The image task's decoding, one DataLoader worker against a bare loop (the `input_pipeline` section
of `python -m bench`): samples/s the task's DataLoader (train/tasks/image.py make_loader over
ImageShards: one forkserver worker streaming, decoding and augmenting its shards) delivers, against a
bare loop decoding the same shards with the same transforms in one process. Interleaved, repeated.

The images are generated PNGs of `image_px` pixels, larger than the digits' 8x8 so that decoding,
not the loop around it, is what is timed; the shards sit in a temp directory, so the store is not.
"""

from __future__ import annotations

import io
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from bench.compare import Contender, run_comparison

SETTLE_S = 0.5


@dataclass(frozen=True)
class DecodeShape:
    shards: int
    per_shard: int
    image_px: int = 64    # stored image side (PNG)
    size: int = 56        # crop fed to the model
    batch: int = 32
    prefetch: int = 2     # the task's --prefetch default


def loader_vs_bare(shape: DecodeShape, repeats: int, progress: Callable[[str], None]) -> dict:
    """run_comparison's result: contenders "bare-loop" (the baseline) and "loader-worker"."""
    import torch
    from PIL import Image

    from train import decode, shards
    from train.tasks.image import ImageShards, image_bytes, make_loader

    rng = np.random.default_rng(0)
    torch.set_num_threads(1)

    def png() -> bytes:
        buf = io.BytesIO()
        pixels = rng.integers(0, 256, (shape.image_px, shape.image_px, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buf, "PNG")
        return buf.getvalue()

    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        samples = [[{"__key__": f"{s:03d}{i:05d}", "png": png(), "cls": b"1"} for i in range(shape.per_shard)]
                   for s in range(shape.shards)]
        shards.write_dataset(tmp, iter(samples), {"kind": "image", "classes": ["0", "1"]})
        ds = shards.open_dataset(tmp, None, "image")
        n = shape.shards * shape.per_shard // shape.batch * shape.batch
        plan = shards.Plan.from_state(None, 1, 1, 0)
        decoder = decode.resolve("auto", False)
        # persistent: each run iterates it again, from the plan's start, in the same worker
        loader = make_loader(ImageShards(ds, 0, shape.batch, 0, 1, plan, decoder, shape.size, "standard", 2),
                             workers=1, prefetch=shape.prefetch, pin_memory=False, persistent=True)

        def bare() -> dict:
            t = time.perf_counter()
            got = 0
            for samples_ in shards.WorkerStream(ds, 0, shape.batch, plan, 0):
                torch.stack([decode.sample_tensor(image_bytes(s), seed, decoder, True, "standard", shape.size)
                             for s, seed in samples_])
                got += len(samples_)
                if got >= n:
                    break
            rate = got / (time.perf_counter() - t)
            time.sleep(SETTLE_S)  # as after the worker's runs, so both contenders see the same pauses
            return {"samples_per_sec": rate}

        def worker() -> dict:
            t = time.perf_counter()
            got = 0
            for x, _ in loader:
                got += len(x)
                if got >= n:
                    break
            rate = got / (time.perf_counter() - t)
            # the batches the worker prefetched past the window (2) must not
            # overlap the next run
            time.sleep(SETTLE_S)
            return {"samples_per_sec": rate}

        bare(), worker()  # start the (persistent) worker, warm both
        config = {"samples_per_run": n, **asdict(shape)}
        return run_comparison(
            [Contender("bare-loop", bare, {"what": "decode + collate in this process", **config}),
             Contender("loader-worker", worker, {"what": "the task's loader, 1 forkserver worker",
                                                 **config})],
            "bare-loop", repeats, progress=progress)
