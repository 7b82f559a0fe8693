"""The image task's data path against a bare WebDataset loop (`python -m bench.image_input`, outside
`scripts/bench`; issue 35's input rows, read in bench/reading.md). Interleaved, repeated, in one run:

- `task-2w`: the task's own loader (train/tasks/image.py `ImageShards` through `make_loader`): 2
  DataLoader workers, each streaming, verifying, shuffling, decoding and cropping its own shards,
  the training process counting positions;
- `task-1w`: the same with 1 worker;
- `bare-wds-2w`: a bare WebDataset loop, `wds.WebDataset(urls, workersplitter=split_by_worker)` with
  the same shuffle size, the same decoder and the same crops (train.decode.sample_tensor), batched in
  the workers, 2 DataLoader workers.

Each reports images/s from its first batch on (the workers' start is not timed) and the training
process's own CPU time per image (time.process_time: its threads, not its workers'). The images are
photo-like: 500x375 crops of scikit-learn's two sample photographs, JPEG quality 90, packed with
`python -m train.data pack images`.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench.compare import Contender, run_comparison
from bench.figures import Ratio
from bench.stats import paired_ratios

# Issue 35's targets: the task's data path against the bare loop, its own CPU per image against the
# bare loop's, 2 workers against 1.
IMAGES_PER_S_TARGET = 0.95
MAIN_CPU_PER_IMAGE_MAX = 1.5
TWO_WORKERS_TARGET = 1.7


@dataclass(frozen=True)
class InputShape:
    shards: int = 16
    per_shard: int = 32
    width: int = 500
    height: int = 375
    quality: int = 90
    size: int = 224        # the crop fed to the model
    batch: int = 32
    images_per_run: int = 384
    prefetch: int = 2
    shuffle: int = 256     # samples mixed per worker (both contenders)


def write_photos(folder: Path, n: int, shape: InputShape) -> None:
    """`n` JPEGs cut from scikit-learn's sample photographs (china.jpg, flower.jpg), two class folders."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(0)
    for i in range(n):
        img = photos[i % len(photos)]
        y = int(rng.integers(0, img.shape[0] - shape.height + 1))
        x = int(rng.integers(0, img.shape[1] - shape.width + 1))
        out = folder / str(i % 2) / f"{i:05d}.jpg"
        out.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img[y:y + shape.height, x:x + shape.width]).save(out, "JPEG", quality=shape.quality)


class BareSample:
    """The bare loop's per-sample map (picklable for the forkserver workers): the task's decoder and
    crop, the crop's seed from the sample's key."""

    def __init__(self, decoder: str, size: int):
        self.decoder, self.size = decoder, size

    def __call__(self, sample: dict):
        from train import decode
        from train.tasks.image import image_bytes

        return (decode.sample_tensor(image_bytes(sample), int(sample["__key__"]), self.decoder, True,
                                     "standard", self.size), int(sample["cls"]))


def stack(samples: list):
    import torch

    return torch.stack([x for x, _ in samples]), torch.tensor([y for _, y in samples])


def compare(shape: InputShape, repeats: int, progress: Callable[[str], None]) -> dict:
    """run_comparison's result (baseline "bare-wds-2w") and the three ratios against their targets."""
    import torch
    import webdataset as wds

    from train import decode, shards
    from train.data import main as data_main
    from train.tasks.image import ImageShards, make_loader, start_forkserver_ignoring_stop_signals

    with tempfile.TemporaryDirectory(prefix="bench-image-input-") as tmp:
        photos, packed = Path(tmp) / "photos", Path(tmp) / "packed"
        write_photos(photos, shape.shards * shape.per_shard, shape)
        with contextlib.redirect_stdout(sys.stderr):
            status = data_main(["pack", "images", "--src", str(photos), "--out", str(packed),
                                "--samples-per-shard", str(shape.per_shard)])
        if status != 0:
            raise RuntimeError("python -m train.data pack images failed")
        ds = shards.open_dataset(str(packed), None, "image")
        urls = [str(packed / s["name"]) for s in ds.shards]
        decoder = decode.resolve("auto", cuda=False)
        start_forkserver_ignoring_stop_signals()

        def timed(loader) -> dict:
            batches = iter(loader)
            next(batches)  # the workers are up
            t, cpu, got = time.perf_counter(), time.process_time(), 0
            for x, _ in batches:
                got += len(x)
                if got >= shape.images_per_run:
                    break
            wall, cpu = time.perf_counter() - t, time.process_time() - cpu
            del batches  # ends the workers before the next contender starts its own
            return {"samples_per_sec": got / wall, "main_cpu_us_per_image": cpu / got * 1e6}

        def task(workers: int) -> Callable[[], dict]:
            def run() -> dict:
                plan = shards.Plan.from_state(None, 1, workers, shape.shuffle)
                dataset = ImageShards(ds, 0, shape.batch, 0, 1, plan, decoder, shape.size, "standard", 2)
                return timed(make_loader(dataset, workers, shape.prefetch, pin_memory=False))
            return run

        def bare() -> dict:
            pipeline = (wds.WebDataset(urls, shardshuffle=False, workersplitter=wds.split_by_worker,
                                       nodesplitter=None, empty_check=False, repeat=True)
                        .shuffle(shape.shuffle).map(BareSample(decoder, shape.size))
                        .batched(shape.batch, collation_fn=stack, partial=False))
            return timed(torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=2,
                                                     prefetch_factor=shape.prefetch,
                                                     multiprocessing_context="forkserver"))

        config = {**asdict(shape), "decoder": decoder}
        records: dict[str, list[dict]] = {"bare-wds-2w": [], "task-2w": [], "task-1w": []}

        def kept(name: str, run: Callable[[], dict]) -> Callable[[], dict]:
            def go() -> dict:
                records[name].append(run())
                return records[name][-1]
            return go

        comparison = run_comparison(
            [Contender("bare-wds-2w", kept("bare-wds-2w", bare),
                       {"what": "WebDataset + split_by_worker, 2 workers", **config}),
             Contender("task-2w", kept("task-2w", task(2)),
                       {"what": "the image task's loader, 2 workers", **config}),
             Contender("task-1w", kept("task-1w", task(1)),
                       {"what": "the image task's loader, 1 worker", **config})],
            "bare-wds-2w", repeats, progress=progress)
    return {"comparison": comparison, "records": records, **ratios(records)}


def ratios(records: dict[str, list[dict]]) -> dict:
    """The three rows, paired per repeat (the i-th runs of the contenders came in the same round)."""
    rate = {name: [r["samples_per_sec"] for r in rs] for name, rs in records.items()}
    cpu = {name: [r["main_cpu_us_per_image"] for r in rs] for name, rs in records.items()}
    paired = {"images_per_s_vs_bare": paired_ratios(rate["task-2w"], rate["bare-wds-2w"]),
              "main_cpu_per_image_vs_bare": paired_ratios(cpu["task-2w"], cpu["bare-wds-2w"]),
              "two_workers_vs_one": paired_ratios(rate["task-2w"], rate["task-1w"])}
    return {**with_targets({key: {"per_repeat": values} for key, values in paired.items()}),
            "main_cpu_us_per_image": {name: float(np.median(v)) for name, v in cpu.items()}}


# Each row's target: a floor, or a ceiling (at_most) for a cost.
TARGETS = {"images_per_s_vs_bare": (IMAGES_PER_S_TARGET, False),
           "main_cpu_per_image_vs_bare": (MAIN_CPU_PER_IMAGE_MAX, True),
           "two_workers_vs_one": (TWO_WORKERS_TARGET, False)}


def with_targets(result: dict) -> dict:
    """`result` with each row as a bench.figures.Ratio against its target (its median, interval and
    verdict computed again), as this bench writes it and bench.report renders it (also from files
    written before the rows carried their interval)."""
    return {**result, **{key: Ratio.of(result[key]["per_repeat"], target, at_most).to_json()
                         for key, (target, at_most) in TARGETS.items() if key in result}}


def rows_markdown(result: dict, when: str) -> str:
    """The three rows as a table, printed by main (bench.report renders the results file's rows into
    bench/RESULTS.md with their intervals)."""
    labels = {"images_per_s_vs_bare": ("images/s: task loader / bare WebDataset loop, 2 workers each",
                                       ">="),
              "main_cpu_per_image_vs_bare": ("training process CPU per image: task / bare loop", "<="),
              "two_workers_vs_one": ("images/s: task loader, 2 workers / 1 worker", ">=")}
    repeats = len(result["images_per_s_vs_bare"]["per_repeat"])
    lines = [f"**Image input path** ({when}; photo-like 500x375 JPEGs at quality 90, crop 224, batch 32, "
             f"{repeats} interleaved repeats; the machine was shared with other sessions, so single runs "
             "swing widely):", "",
             "| row | median | per repeat | target |", "|---|---:|---|---|"]
    for key, (label, bound) in labels.items():
        r = result[key]
        each = ", ".join(f"{v:.2f}" for v in r["per_repeat"])
        lines.append(f"| {label} | {r['median']:.2f}x | {each} | {bound} {r['target']}: "
                     f"{'met' if r['met'] else 'not met'} |")
    cpu = result["main_cpu_us_per_image"]
    per_image = ", ".join(f"{k} {v:.0f} us" for k, v in cpu.items())
    lines += ["", f"Training process CPU per image, median: {per_image}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m bench.image_input", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="write the result as JSON here")
    a = p.parse_args(argv)
    result = compare(InputShape(), a.repeats, lambda msg: print(msg, file=sys.stderr, flush=True))
    for key in ("images_per_s_vs_bare", "main_cpu_per_image_vs_bare", "two_workers_vs_one"):
        r = result[key]
        bound = "<=" if "cpu" in key else ">="
        each = ", ".join(f"{v:.3f}" for v in r["per_repeat"])
        print(f"{key}: median {r['median']:.3f} (target {bound} {r['target']}; per repeat {each}) "
              f"{'met' if r['met'] else 'NOT met'}")
    print("training process CPU per image (us): " + ", ".join(
        f"{k} {v:.0f}" for k, v in result["main_cpu_us_per_image"].items()))
    print(rows_markdown(result, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

