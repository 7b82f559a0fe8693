"""Sharded datasets streamed from S3 or a directory: WebDataset tar shards plus an index with checksums.

Layout (same on S3 and on disk), written by `python -m train.data pack`:

    <uri>/index.json        {"format": "ringtrain-wds/1", "kind": "image" | "tokens", "samples": N,
                             "shards": [{"name": "shard-00000.tar", "samples": M, "bytes": B,
                                         "xxh3_128": "..."}], ...kind's own fields}
    <uri>/shard-00000.tar   a WebDataset shard: the files of one sample share a key
                            (000017.png + 000017.cls; 000017.tokens.npy)

Streaming (ShardStream): each worker reads only its own shards, whole objects, a few ahead on threads
of their own, each checked against its checksum (train.checksum); memory is bounded by the shards in
flight, not by the dataset. The first batch is ready once the worker's first shard has arrived.

Position (`Plan`, saved in checkpoints through the trainer): an epoch's shards in an order drawn from
(seed, epoch), dealt round-robin to the workers; each shard's samples in an order drawn from (seed,
epoch, shard). Every worker takes `batch_size` samples a step, so the position is the number of steps
into the plan. The epoch ends when the worker with the fewest samples cannot fill a batch (the
others' tails are dropped). After a change of world size, the samples that no worker consumed yet
are cut into equal runs for the new workers (elastic resume), as segments (shard, start, end) of the
shards' sample orders; with the same world size, a resumed run reads exactly what the uninterrupted
run would have read.
"""

from __future__ import annotations

import collections
import functools
import io
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from train import checksum
from train.errors import BadInput
from train.storage import open_store

FORMAT = "ringtrain-wds/1"
INDEX = "index.json"


def shard_name(i: int) -> str:
    return f"shard-{i:05d}.tar"


# ---- writing ---------------------------------------------------------------------------------
def tar_shard(samples: list[dict]) -> bytes:
    """One WebDataset shard from samples {"__key__": key, ext: bytes, ...} (webdataset's TarWriter,
    with a fixed integer mtime: the same samples give the same bytes, and no pax header for a float mtime
    doubles each sample's size)."""
    import webdataset

    buf = io.BytesIO()
    with webdataset.TarWriter(buf, mtime=0) as w:
        for s in samples:
            w.write(s)
    return buf.getvalue()


def write_dataset(uri: str, samples_by_shard: Iterator[list[dict]], meta: dict,
                  endpoint_url: str | None = None, progress=None) -> dict:
    """Write the shards, then the index (last: a reader never sees an index naming a missing shard)."""
    store = open_store(uri, endpoint_url)
    store.check(create=True)
    entries = []
    for i, samples in enumerate(samples_by_shard):
        data = tar_shard(samples)
        store.put(shard_name(i), data)
        entries.append({"name": shard_name(i), "samples": len(samples), "bytes": len(data),
                        **checksum.of(data)})
        if progress is not None:
            progress(len(samples))
    index = {"format": FORMAT, **meta, "samples": sum(e["samples"] for e in entries), "shards": entries}
    store.put(INDEX, json.dumps(index, indent=1).encode())
    return index


# ---- reading ---------------------------------------------------------------------------------
@dataclass
class ShardedDataset:
    uri: str
    endpoint_url: str | None
    index: dict

    @functools.cached_property
    def store(self):
        return open_store(self.uri, self.endpoint_url)

    @property
    def shards(self) -> list[dict]:
        return self.index["shards"]

    @property
    def kind(self) -> str:
        return self.index["kind"]

    def read_shard(self, i: int) -> list[dict]:
        """Shard i's samples in stored order, {"__key__": ..., ext: bytes}. Raises BadInput naming the
        shard when it is missing, fails its checksum or is not a readable tar."""
        import webdataset.tariterators as wt

        entry = self.shards[i]
        name = entry["name"]
        try:
            data = self.store.get(name)
        except FileNotFoundError:
            raise BadInput(f"dataset {self.uri}: shard {name} listed in {INDEX} is missing") from None
        try:
            checksum.verify(entry, data)
        except ValueError as why:
            raise BadInput(f"dataset {self.uri}: shard {name} {why} (corrupt or replaced)") from None
        try:
            files = ({**f, "__url__": name} for f in wt.tar_file_iterator(io.BytesIO(data)))
            samples = list(wt.group_by_keys(files))
        except Exception as e:  # tarfile's errors; the checksum matched, so the writer wrote it so
            raise BadInput(f"dataset {self.uri}: shard {name} is not a readable tar: {e}") from None
        if len(samples) != entry["samples"]:
            raise BadInput(f"dataset {self.uri}: shard {name} holds {len(samples)} samples, "
                           f"{INDEX} says {entry['samples']}")
        return samples


def open_dataset(uri: str, endpoint_url: str | None, kind: str) -> ShardedDataset:
    """Read and check the index only (the shards stream later). Raises BadInput."""
    store = open_store(uri, endpoint_url)
    store.check(create=False)
    try:
        index = json.loads(store.get(INDEX))
    except FileNotFoundError:
        raise BadInput(f"no dataset at {uri}: {INDEX} not found (write one with `python -m train.data "
                       f"pack {'images' if kind == 'image' else 'text'} --src ... --out {uri}`)") from None
    except ValueError as e:
        raise BadInput(f"dataset index {uri}/{INDEX} is not valid JSON: {e}") from None
    found = index.get("format") if isinstance(index, dict) else None
    if found != FORMAT:
        raise BadInput(f"{uri}/{INDEX}: format {found!r}, expected {FORMAT!r} (pack it with "
                       "`python -m train.data pack`)")
    if index.get("kind") != kind:
        raise BadInput(f"{uri}/{INDEX}: a dataset of {index.get('kind')!r} samples; this task reads {kind!r}")
    if not index.get("shards"):
        raise BadInput(f"dataset {uri}: {INDEX} lists no shards")
    return ShardedDataset(uri, endpoint_url, index)


# ---- position --------------------------------------------------------------------------------
def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([*key])


def shard_order(seed: int, epoch: int, num_shards: int) -> list[int]:
    return _rng(seed, epoch, 0x5A4D).permutation(num_shards).tolist()


def sample_order(seed: int, epoch: int, shard: int, num_samples: int) -> np.ndarray:
    return _rng(seed, epoch, shard, 0x5A3B).permutation(num_samples)


@dataclass
class Plan:
    """Where the training data stands: see the module's docstring. JSON-like as a dict (`state`)."""

    epoch: int
    world: int  # the number of workers the segments are dealt to
    # per worker, [[shard, start, end], ...] into each shard's sample order; None: the epoch's shard
    # order dealt round-robin (a fresh epoch, the usual case, saved without a list of every shard)
    segments: list[list[list[int]]] | None
    steps: int  # steps taken in this plan

    @classmethod
    def from_state(cls, state: dict | None, world: int) -> Plan:
        if not state:
            return cls(epoch=0, world=world, segments=None, steps=0)
        return cls(epoch=int(state["epoch"]), world=int(state["world"]), segments=state["segments"],
                   steps=int(state["steps"]))

    def state(self) -> dict:
        return {"epoch": self.epoch, "world": self.world, "segments": self.segments, "steps": self.steps}

    def rank_segments(self, ds: ShardedDataset, seed: int, rank: int) -> list[list[int]]:
        if self.segments is not None:
            return self.segments[rank]
        order = shard_order(seed, self.epoch, len(ds.shards))
        return [[s, 0, ds.shards[s]["samples"]] for s in order[rank::self.world]]

    def length(self, ds: ShardedDataset, seed: int, batch_size: int) -> int:
        """Steps in this plan: the fewest full batches any worker's segments hold."""
        return min(sum(e - s for _, s, e in self.rank_segments(ds, seed, r)) // batch_size
                   for r in range(self.world))

    def remaining(self, ds: ShardedDataset, seed: int, batch_size: int) -> list[list[int]]:
        """The segments no worker has consumed yet, worker after worker."""
        out = []
        for r in range(self.world):
            skip = self.steps * batch_size
            for shard, start, end in self.rank_segments(ds, seed, r):
                if skip >= end - start:
                    skip -= end - start
                    continue
                out.append([shard, start + skip, end])
                skip = 0
        return out

    def for_world(self, ds: ShardedDataset, seed: int, batch_size: int, world: int) -> Plan:
        """This position for `world` workers: unchanged for the same world size; otherwise the samples
        no worker consumed yet, cut into `world` equal runs (elastic resume: at most one segment per
        cut is shared by two workers), or the next epoch when they cannot fill a batch each."""
        plan = self
        if world != self.world:
            left = self.remaining(ds, seed, batch_size)
            share = sum(e - s for _, s, e in left) // world
            dealt: list[list[list[int]]] = [[] for _ in range(world)]
            rank, room = 0, share
            for shard, start, end in left:
                while start < end and rank < world:
                    take = min(end - start, room)
                    if take:
                        dealt[rank].append([shard, start, start + take])
                    start += take
                    room -= take
                    if room == 0:
                        rank, room = rank + 1, share
            plan = Plan(self.epoch, world, dealt, 0)
        if plan.steps >= plan.length(ds, seed, batch_size):
            return Plan(plan.epoch + 1, world, None, 0)
        return plan


def check_fits(ds: ShardedDataset, batch_size: int, world: int) -> None:
    """Raise BadInput unless every worker's share of every epoch fills a batch: each gets at least
    len(shards) // world shards, whichever the epoch's order."""
    sizes = sorted(s["samples"] for s in ds.shards)
    if len(sizes) // world * sizes[0] < batch_size:
        raise BadInput(f"dataset {ds.uri}: {len(ds.shards)} shards of {sizes[0]}-{sizes[-1]} samples cannot "
                       f"give each of {world} workers a batch of {batch_size} (a worker reads whole shards: "
                       "use a smaller --batch-size, fewer workers, or pack into more shards)")


# ---- streaming -------------------------------------------------------------------------------
class ShardStream:
    """One worker's batches of raw samples from `position` on, with its shards read ahead on a thread.

    Iterating yields (samples, position after them): `samples` is a list of (sample, sample_seed), where
    sample_seed is a pure function of (seed, epoch, shard, index) for the task's random augmentation.
    """

    def __init__(self, ds: ShardedDataset, seed: int, batch_size: int, rank: int, world: int,
                 position: dict | None, readahead: int = 2):
        self.ds, self.seed, self.batch_size, self.rank, self.world = ds, seed, batch_size, rank, world
        self.plan = Plan.from_state(position, world).for_world(ds, seed, batch_size, world)
        self.readahead = readahead
        self.shards_read = 0
        self._batches = None

    def _segments_from(self, plan: Plan) -> Iterator[tuple[int, int, int, int]]:
        """(epoch, shard, start, end) of this worker from `plan`'s position on, epoch after epoch."""
        while True:
            skip = plan.steps * self.batch_size
            for shard, start, end in plan.rank_segments(self.ds, self.seed, self.rank):
                n = end - start
                if skip >= n:
                    skip -= n
                    continue
                yield plan.epoch, shard, start + skip, end
                skip = 0
            plan = Plan(plan.epoch + 1, self.world, None, 0)

    def _load(self, epoch: int, shard: int) -> tuple[list[dict], np.ndarray]:
        samples = self.ds.read_shard(shard)  # fetch, verify, unpack: in a fetch thread
        self.shards_read += 1
        return samples, sample_order(self.seed, epoch, shard, len(samples))

    def __iter__(self) -> Iterator[tuple[list[tuple[dict, int]], dict]]:
        self._batches = self._iterate()
        return self._batches

    def _iterate(self) -> Iterator[tuple[list[tuple[dict, int]], dict]]:
        _ = self.ds.store  # one client, made here; boto3's clients are thread-safe
        # `readahead` shards in flight on as many threads: S3 serves concurrent GETs in parallel, and
        # the reads, the checksum and the copies release the GIL.
        pool = ThreadPoolExecutor(self.readahead + 1, thread_name_prefix="ringtrain-shards")
        segments = self._segments_from(self.plan)
        pending: collections.deque = collections.deque()
        plan = self.plan
        length = plan.length(self.ds, self.seed, self.batch_size)
        batch: list[tuple[dict, int]] = []
        try:
            while True:
                while len(pending) < self.readahead + 1:  # the next shard and `readahead` after it
                    epoch, shard, start, end = next(segments)
                    pending.append((epoch, shard, start, end, pool.submit(self._load, epoch, shard)))
                epoch, shard, start, end, loading = pending.popleft()
                samples, order = loading.result()  # a BadInput naming the shard is raised here
                for i in range(start, end):
                    if epoch != plan.epoch:
                        break  # a tail this worker drops: the plan ended on another worker's count
                    idx = int(order[i])
                    batch.append((samples[idx], _sample_seed(self.seed, epoch, shard, idx)))
                    if len(batch) == self.batch_size:
                        plan = Plan(plan.epoch, plan.world, plan.segments, plan.steps + 1)
                        if plan.steps >= length:
                            plan = Plan(plan.epoch + 1, self.world, None, 0)
                            length = plan.length(self.ds, self.seed, self.batch_size)
                        yield batch, plan.state()
                        batch = []
                del samples, loading
        finally:
            for *_, loading in pending:
                loading.cancel()
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """End the iteration (from the thread iterating): shards in flight are dropped."""
        if self._batches is not None:
            self._batches.close()


def _sample_seed(seed: int, epoch: int, shard: int, index: int) -> int:
    return (((seed * 1_000_003 + epoch) * 1_000_033 + shard) * 1_000_037 + index) % (1 << 62)


def eval_samples(ds: ShardedDataset, rank: int, world: int) -> Iterator[dict]:
    """This worker's share of an evaluation set, in stored order: its own shards when there are at
    least as many shards as workers, otherwise every world-th sample of every shard."""
    n = len(ds.shards)
    if n >= world:
        for i in range(rank, n, world):
            yield from ds.read_shard(i)
    else:
        for i in range(n):
            yield from ds.read_shard(i)[rank::world]
