"""The demo task's data (the synthetic benchmark batch, the generated npz dataset and its sampler), and
the `python -m train.data` command: `generate` (that dataset) and `pack` (train.pack: WebDataset shards
for the image and lm tasks, streamed by train.shards).

Dataset layout (same on S3 and on disk), written by `python -m train.data generate`:

    <uri>/index.json           {"format": "ringtrain-shards/1", "input_shape": [1, 8, 8],
                                "num_classes": 10, "samples": N, "seed": S,
                                "shards": [{"name": "shard-00000.npz", "samples": M, "xxh3_128": "..."}]}
    <uri>/shard-00000.npz      x: float32 [M, *input_shape], y: int64 [M]

The task is learnable by both models: labels come from a fixed random linear "teacher" over the
pixels, so the loss visibly falls within a few dozen steps. Nothing is downloaded from a hub.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from train import checksum
from train.errors import BadInput
from train.storage import open_store

if TYPE_CHECKING:  # imported where used: `pack tokens` spawns processes that import this module
    import torch

FORMAT = "ringtrain-shards/1"
INPUT_SHAPE = (1, 8, 8)
NUM_CLASSES = 10
INDEX = "index.json"


@dataclass
class Dataset:
    x: torch.Tensor  # [N, *input_shape] float32
    y: torch.Tensor  # [N] int64

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    @property
    def num_classes(self) -> int:
        return NUM_CLASSES

    def __len__(self) -> int:
        return self.x.shape[0]


def teacher_weights(seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 0x7EAC]).standard_normal((int(np.prod(INPUT_SHAPE)), NUM_CLASSES))


def make_samples(seed: int, shard: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n samples of shard `shard`, a pure function of (seed, shard)."""
    w = teacher_weights(seed)
    rng = np.random.default_rng([seed, shard])
    x = rng.standard_normal((n, *INPUT_SHAPE)).astype(np.float32)
    y = np.argmax(x.reshape(n, -1) @ w, axis=1).astype(np.int64)
    return x, y


def generate(uri: str, shards: int, samples_per_shard: int, seed: int,
             endpoint_url: str | None = None) -> dict:
    """Write the dataset; the index goes last so a reader never sees a dataset with missing shards."""
    if shards < 1 or samples_per_shard < 1:
        raise BadInput(f"--shards {shards} --samples-per-shard {samples_per_shard}: both must be >= 1")
    store = open_store(uri, endpoint_url)
    store.check(create=True)
    entries = []
    for i in range(shards):
        x, y = make_samples(seed, i, samples_per_shard)
        buf = io.BytesIO()
        np.savez(buf, x=x, y=y)
        data = buf.getvalue()
        name = f"shard-{i:05d}.npz"
        store.put(name, data)
        entries.append({"name": name, "samples": samples_per_shard, **checksum.of(data)})
    index = {
        "format": FORMAT,
        "input_shape": list(INPUT_SHAPE),
        "num_classes": NUM_CLASSES,
        "samples": shards * samples_per_shard,
        "seed": seed,
        "shards": entries,
    }
    store.put(INDEX, json.dumps(index, indent=1).encode())
    return index


def load(uri: str, endpoint_url: str | None = None) -> Dataset:
    """Read and verify every shard. Raises BadInput for a missing, foreign or corrupt dataset."""
    store = open_store(uri, endpoint_url)
    store.check(create=False)
    try:
        index = json.loads(store.get(INDEX))
    except FileNotFoundError:
        raise BadInput(f"no dataset at {uri}: {INDEX} not found "
                       f"(write one with `python -m train.data generate --out {uri}`)") from None
    except ValueError as e:
        raise BadInput(f"dataset index {uri}/{INDEX} is not valid JSON: {e}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise BadInput(f"{uri}/{INDEX}: format {index.get('format') if isinstance(index, dict) else None!r}, "
                       f"expected {FORMAT!r}")
    if tuple(index.get("input_shape", ())) != INPUT_SHAPE or index.get("num_classes") != NUM_CLASSES:
        raise BadInput(f"{uri}/{INDEX}: input_shape {index.get('input_shape')} / num_classes "
                       f"{index.get('num_classes')}; this trainer takes {list(INPUT_SHAPE)} / {NUM_CLASSES}")
    xs, ys = [], []
    for entry in index.get("shards", []):
        name = entry["name"]
        try:
            data = store.get(name)
        except FileNotFoundError:
            raise BadInput(f"dataset {uri}: shard {name} listed in {INDEX} is missing") from None
        try:
            checksum.verify(entry, data)
        except ValueError as why:
            raise BadInput(f"dataset {uri}: shard {name} {why} (corrupt or replaced)") from None
        with np.load(io.BytesIO(data)) as z:
            x, y = z["x"], z["y"]
        if x.shape[0] != entry["samples"] or y.shape != (x.shape[0],):
            raise BadInput(f"dataset {uri}: shard {name} holds {x.shape[0]} samples, "
                           f"index says {entry['samples']}")
        xs.append(x)
        ys.append(y)
    if not xs:
        raise BadInput(f"dataset {uri}: {INDEX} lists no shards")
    import torch

    return Dataset(torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)))


def synthetic_batch(seed: int, rank: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One fixed random batch per worker, reused every step (what Horovod's synthetic benchmark times)."""
    import torch

    g = torch.Generator().manual_seed(seed * 100_003 + rank)
    x = torch.randn((batch_size, *INPUT_SHAPE), generator=g)
    y = torch.randint(0, NUM_CLASSES, (batch_size,), generator=g)
    return x, y


@dataclass
class ShardedSampler:
    """Every worker draws a disjoint slice of one global, per-epoch permutation.

    The position is (epoch, offset): `offset` counts samples of the epoch's permutation already handed
    out to all workers together. That makes the position independent of the world size, so it can be
    checkpointed and restored exactly, and an elastic job that shrinks or grows carries on from it.
    A global batch that no longer fits in the epoch starts the next epoch (the tail is dropped).
    """

    num_samples: int
    seed: int
    epoch: int = 0
    offset: int = 0
    _perm_epoch: int = -1
    _perm: np.ndarray | None = None

    def permutation(self, epoch: int) -> np.ndarray:
        if self._perm_epoch != epoch:
            self._perm = np.random.default_rng([self.seed, epoch, 0x5A3]).permutation(self.num_samples)
            self._perm_epoch = epoch
        return self._perm  # type: ignore[return-value]

    def next_indices(self, rank: int, world_size: int, batch_size: int) -> np.ndarray:
        global_batch = world_size * batch_size
        if global_batch > self.num_samples:
            raise BadInput(f"dataset has {self.num_samples} samples, fewer than one global batch "
                           f"({world_size} workers x {batch_size}); use a smaller --batch-size or more data")
        if self.offset + global_batch > self.num_samples:
            self.epoch += 1
            self.offset = 0
        perm = self.permutation(self.epoch)
        start = self.offset + rank * batch_size
        self.offset += global_batch
        return perm[start:start + batch_size]

    def state(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])


def main(argv: list[str] | None = None, prog: str = "python -m train.data") -> int:
    import os

    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["pack", "tokens"] or argv[:1] == ["tokenizer"]:  # the lm task's text path
        from train.pack_tokens import main as text_main

        return text_main(argv, prog)
    p = argparse.ArgumentParser(
        prog=prog, description="Datasets for the trainer's tasks.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"examples:\n  {prog} generate --out /tmp/ds --shards 4 --samples-per-shard 1024\n"
               f"  {prog} pack images --src photos/ --out s3://bucket/datasets/photos\n"
               f"  {prog} tokenizer train --src corpus/ --vocab-size 32768 --out tokenizer.json\n"
               f"  {prog} pack tokens --src corpus/ --tokenizer tokenizer.json --out s3://bucket/corpus\n"
               f"(`{prog} pack --help` says more)")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="the demo task's dataset, to s3://bucket/prefix or a local directory")
    g.add_argument("--out", required=True, help="s3://bucket/prefix or /local/dir")
    g.add_argument("--shards", type=int, default=4)
    g.add_argument("--samples-per-shard", type=int, default=1024)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--s3-endpoint-url", default=os.environ.get("AWS_ENDPOINT_URL") or None)
    k = sub.add_parser("pack", help="images (a class-per-folder tree) or text files -> shards with an index "
                                    "and checksums, for --task image / --task lm")
    k.add_argument("kind", choices=("images", "tokens"),
                   help="images; tokens: a text corpus -> token shards for --task lm (`pack tokens --help`)")
    k.add_argument("--src", nargs="+", required=True,
                   help="images: the folder of class folders; text: files or folders "
                        "(*.py, *.txt, *.md, *.rst)")
    k.add_argument("--out", required=True, help="s3://bucket/prefix or /local/dir")
    k.add_argument("--eval-out", default=None, help="where the evaluation share goes (with --eval-fraction)")
    k.add_argument("--eval-fraction", type=float, default=0.0)
    k.add_argument("--samples-per-shard", type=int, default=1000)
    k.add_argument("--seed", type=int, default=0, help="the shuffle before sharding and the evaluation split")
    k.add_argument("--s3-endpoint-url", default=os.environ.get("AWS_ENDPOINT_URL") or None)
    a = p.parse_args(argv)
    try:
        if a.cmd == "generate":
            index = generate(a.out, a.shards, a.samples_per_shard, a.seed, a.s3_endpoint_url)
            print(f"wrote {index['samples']} samples in {len(index['shards'])} shards to {a.out}")
        else:
            from train.pack import pack

            written = pack(a.kind, a.src, a.out, a.eval_out, a.eval_fraction, a.samples_per_shard, a.seed,
                           a.s3_endpoint_url)
            for uri, index in zip([a.out, a.eval_out], written, strict=False):
                print(f"wrote {index['samples']} samples in {len(index['shards'])} shards to {uri}")
    except BadInput as e:
        print(f"train.data: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
