"""`python -m bench.input_pipeline`: samples/s the image task's input pipeline delivers with one
DataLoader worker (shard stream -> forkserver worker decoding and augmenting -> batches), against a
bare loop decoding the same shards with the same transforms in one process. Interleaved, repeated;
prints one JSON line. Not a section of `python -m bench` (yet).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time

import numpy as np
import torch

from train import shards
from train.tasks.image import DecodeSamples, StreamBatches


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.input_pipeline")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--per-shard", type=int, default=256)
    p.add_argument("--image-px", type=int, default=64, help="stored image side (PNG)")
    p.add_argument("--size", type=int, default=56, help="crop fed to the model")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    from PIL import Image

    rng = np.random.default_rng(0)
    torch.set_num_threads(1)

    def png() -> bytes:
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (a.image_px, a.image_px, 3), dtype=np.uint8)).save(buf, "PNG")
        return buf.getvalue()

    with tempfile.TemporaryDirectory() as tmp:
        samples = [[{"__key__": f"{s:03d}{i:05d}", "png": png(), "cls": b"1"} for i in range(a.per_shard)]
                   for s in range(a.shards)]
        shards.write_dataset(tmp, iter(samples), {"kind": "image", "classes": ["0", "1"]})
        ds = shards.open_dataset(tmp, None, "image")
        n = a.shards * a.per_shard // a.batch * a.batch
        decode = DecodeSamples(a.size, train=True, augment="standard")
        batches = StreamBatches()
        loader = torch.utils.data.DataLoader(decode, batch_sampler=batches, num_workers=1, prefetch_factor=4,
                                             persistent_workers=True, multiprocessing_context="forkserver")

        def bare() -> float:
            t = time.perf_counter()
            got = 0
            for samples_, _ in shards.ShardStream(ds, 0, a.batch, 0, 1, None):
                torch.utils.data.default_collate([decode[s] for s in samples_])
                got += len(samples_)
                if got >= n:
                    break
            return got / (time.perf_counter() - t)

        def worker() -> float:
            batches.stream = shards.ShardStream(ds, 0, a.batch, 0, 1, None)
            t = time.perf_counter()
            got = 0
            for x, _ in loader:
                got += len(x)
                if got >= n:
                    break
            return got / (time.perf_counter() - t)

        bare(), worker()  # start the worker, warm both
        runs = {"bare_loop": [], "one_loader_worker": []}
        for _ in range(a.repeats):
            runs["bare_loop"].append(bare())
            runs["one_loader_worker"].append(worker())
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(json.dumps({"samples": n, "median_samples_per_s": {k: round(v, 1) for k, v in med.items()},
                      "ratio_worker_over_bare": round(med["one_loader_worker"] / med["bare_loop"], 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
