"""Sharded datasets streamed from S3 or a directory: WebDataset tar shards plus an index with checksums.

Layout (same on S3 and on disk), written by `python -m train.data pack`:

    <uri>/index.json        {"format": "ringtrain-wds/1", "kind": "image" | "tokens", "samples": N,
                             "shards": [{"name": "shard-00000.tar", "samples": M, "bytes": B,
                                         "xxh3_128": "..."}], ...kind's own fields}
    <uri>/shard-00000.tar   a WebDataset shard: the files of one sample share a key
                            (000017.png + 000017.cls; 000017.tokens.npy)

Streaming (WorkerStream): each DataLoader worker of each rank reads only its own shards, whole
objects, a few ahead on threads of its own, each checked against its checksum (train.checksum),
unpacks and (in the task) decodes them; the training process receives finished batches and counts
positions (RankPositions). Memory is bounded by the shards in flight and the shuffle block, not by
the dataset. ShardStream is the same read in the training process, one stream per rank (the lm task).

Position (`Plan`, saved in checkpoints through the trainer): an epoch's shards in an order drawn from
(seed, epoch), dealt round-robin to the plan's workers (ranks x loader workers); each shard's samples
in an order drawn from (seed, epoch, shard); then each worker's samples shuffled in consecutive
blocks of --shuffle-buffer samples across its shards, drawn from (seed, epoch, worker, block). A
rank's loader workers yield whole batches in turn, so the position is the number of batches a rank
took in the plan. The epoch ends when the worker with the fewest samples cannot fill a batch (the
others' tails are dropped). After a change of world size or loader workers, the samples that no
worker consumed yet are cut into equal runs for the new workers (elastic resume), as segments
(shard, start, end) of the shards' sample orders; with the same layout, a resumed run reads exactly
what the uninterrupted run would have read.
"""

from __future__ import annotations

import functools
import io
import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

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

    def __getstate__(self) -> dict:
        # pickled to DataLoader workers: each opens its own store (a boto3 client is not picklable)
        return {k: v for k, v in self.__dict__.items() if k != "store"}

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
    problem = index_problem(index)
    if problem:
        raise BadInput(f"{uri}/{INDEX}: {problem} (pack it again with `python -m train.data pack`)")
    return ShardedDataset(uri, endpoint_url, index)


# A shard's name: a relative path of plain parts inside the dataset (what write_dataset writes is one
# part, shard-00000.tar); nothing that leaves it ("..", an absolute path, a URL, a backslash).
_NAME_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def shard_name_problem(name) -> str | None:
    if not isinstance(name, str):
        return f"a shard name must be a string, got {name!r}"
    if not all(_NAME_PART.fullmatch(part) for part in name.split("/")):
        return (f"shard name {name!r} leaves the dataset or is not a plain relative path (allowed: "
                "parts of letters, digits, '.', '_', '-', joined by '/', none starting with '.')")
    return None


def index_problem(index: dict) -> str | None:
    """What is wrong with an index's fields and their types, in one line; None when nothing is."""

    def count(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not count(index.get("samples")):
        return f'"samples" is {index.get("samples")!r}; expected a whole number >= 0'
    if not isinstance(index["shards"], list):
        return f'"shards" is a {type(index["shards"]).__name__}; expected a list of shard entries'
    for i, entry in enumerate(index["shards"]):
        if not isinstance(entry, dict):
            return f'shards[{i}] is {entry!r}; expected {{"name": ..., "samples": ..., "xxh3_128": ...}}'
        problem = shard_name_problem(entry.get("name"))
        if problem:
            return f"shards[{i}]: {problem}"
        if not count(entry.get("samples")) or entry["samples"] == 0:
            return (f'shards[{i}] ({entry["name"]}): "samples" is {entry.get("samples")!r}; '
                    "expected a whole number >= 1")
    held = sum(e["samples"] for e in index["shards"])
    if held != index["samples"]:
        return f'"samples" is {index["samples"]}, but the shards hold {held}'
    if index.get("kind") == "image":
        classes = index.get("classes")
        if not (isinstance(classes, list) and len(classes) >= 2 and all(isinstance(c, str) for c in classes)):
            return f'"classes" is {classes!r}; expected a list of at least 2 class names'
    if index.get("kind") == "tokens":
        for field in ("seq_len", "vocab_size"):
            if not count(index.get(field)) or index[field] == 0:
                return f'"{field}" is {index.get(field)!r}; expected a whole number >= 1'
    return None


# ---- position ---------------------------------------------------------------------------------
def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([*key])


def shard_order(seed: int, epoch: int, num_shards: int) -> list[int]:
    return _rng(seed, epoch, 0x5A4D).permutation(num_shards).tolist()


def sample_order(seed: int, epoch: int, shard: int, num_samples: int) -> np.ndarray:
    return _rng(seed, epoch, shard, 0x5A3B).permutation(num_samples)


def block_order(seed: int, epoch: int, worker: int, block: int, n: int) -> np.ndarray:
    return _rng(seed, epoch, worker, block, 0xB10C).permutation(n)


# timm's WebDataset reader mixes 8192 samples per loader worker (timm/data/readers/reader_wds.py,
# SAMPLE_SHUFFLE_SIZE = WDS_SHUFFLE_SIZE, default 8192), held as raw bytes as here.
DEFAULT_SHUFFLE_BUFFER = 8192


@dataclass
class Plan:
    """Where the training data stands: see the module's docstring. JSON-like as a dict (`state`).

    The plan's workers are the DataLoader workers of all ranks, `loader_workers` per rank: rank r's
    loader worker w is plan worker r * loader_workers + w, and each yields whole batches. A rank's
    batches come from its loader workers in turn (the DataLoader's order), so after `steps` batches of
    a rank, its loader worker w has yielded steps // loader_workers (+1 for w < steps % loader_workers).
    `shuffle` > 0: each plan worker's samples are shuffled in consecutive blocks of that many (across
    shard boundaries), a function of (seed, epoch, worker, block) -- so a position is still a count."""

    epoch: int
    world: int  # the number of plan workers the segments are dealt to (ranks x loader_workers)
    # per worker, [[shard, start, end], ...] into each shard's sample order; None: the epoch's shard
    # order dealt round-robin (a fresh epoch, the usual case, saved without a list of every shard)
    segments: list[list[list[int]]] | None
    steps: int  # batches each rank has taken in this plan
    loader_workers: int = 1  # plan workers per rank
    shuffle: int = 0  # the block shuffle's size in samples; 0: each shard's own order only
    batch: int = 0  # samples per batch the steps count; 0: not recorded (positions written before)

    @classmethod
    def from_state(cls, state: dict | None, world: int, loader_workers: int = 1, shuffle: int = 0) -> Plan:
        if not state:
            return cls(epoch=0, world=world * loader_workers, segments=None, steps=0,
                       loader_workers=loader_workers, shuffle=shuffle)
        try:
            return cls(epoch=int(state["epoch"]), world=int(state["world"]), segments=state["segments"],
                       steps=int(state["steps"]), loader_workers=int(state.get("loader_workers", 1)),
                       shuffle=int(state.get("shuffle", 0)), batch=int(state.get("batch", 0)))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise BadInput(f"the saved data position {str(state)[:200]} is not one this reader wrote "
                           f"({type(e).__name__}: {e})") from None

    def state(self) -> dict:
        return {"epoch": self.epoch, "world": self.world, "segments": self.segments, "steps": self.steps,
                "loader_workers": self.loader_workers, "shuffle": self.shuffle, "batch": self.batch}

    @property
    def ranks(self) -> int:
        return self.world // self.loader_workers

    def rank_segments(self, ds: ShardedDataset, seed: int, worker: int) -> list[list[int]]:
        """Plan worker `worker`'s segments (the name is the reader's older one: with one loader worker
        per rank, the rank's)."""
        if self.segments is not None:
            return self.segments[worker]
        order = shard_order(seed, self.epoch, len(ds.shards))
        return [[s, 0, ds.shards[s]["samples"]] for s in order[worker::self.world]]

    def worker_for(self, rank: int, loader_worker: int) -> int:
        """The plan worker a rank's DataLoader worker `loader_worker` serves: a DataLoader hands out
        its workers' batches in turn from worker 0 on, and the rank's next batch is plan worker
        (steps % loader_workers)'s."""
        return rank * self.loader_workers + (self.steps + loader_worker) % self.loader_workers

    def taken(self, worker: int) -> int:
        """Batches plan worker `worker` has yielded in this plan."""
        w = worker % self.loader_workers
        return self.steps // self.loader_workers + (1 if w < self.steps % self.loader_workers else 0)

    def length(self, ds: ShardedDataset, seed: int, batch_size: int) -> int:
        """Batches per plan worker in this plan: the fewest full batches any worker's segments hold."""
        return min(sum(e - s for _, s, e in self.rank_segments(ds, seed, r)) // batch_size
                   for r in range(self.world))

    def rank_length(self, ds: ShardedDataset, seed: int, batch_size: int) -> int:
        """Batches per rank in this plan."""
        return self.length(ds, seed, batch_size) * self.loader_workers

    def sequence(self, ds: ShardedDataset, seed: int, worker: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard, position in the shard's sample order) of every sample of plan worker `worker`, in
        the order it yields them: its segments one after the other, shuffled block by block."""
        segs = self.rank_segments(ds, seed, worker)
        none = [np.empty(0, np.int64)]
        shard = np.concatenate([np.full(e - s, sh, dtype=np.int64) for sh, s, e in segs] or none)
        pos = np.concatenate([np.arange(s, e, dtype=np.int64) for _, s, e in segs] or none)
        if self.shuffle > 0:
            blocks = range(0, len(pos), self.shuffle)
            order = np.concatenate([b + block_order(seed, self.epoch, worker, b // self.shuffle,
                                                    min(self.shuffle, len(pos) - b)) for b in blocks]
                                   or none)
            shard, pos = shard[order], pos[order]
        return shard, pos

    def remaining(self, ds: ShardedDataset, seed: int, batch_size: int) -> list[list[int]]:
        """The segments no worker has consumed yet, worker after worker. Of a block a worker is half
        way through, the rest as runs of its samples in their shards' order."""
        out: list[list[int]] = []
        for r in range(self.world):
            consumed = self.taken(r) * batch_size
            segs = self.rank_segments(ds, seed, r)
            rest_from = consumed
            if self.shuffle > 0 and consumed % self.shuffle:
                block_end = (consumed // self.shuffle + 1) * self.shuffle
                shard, pos = self.sequence(ds, seed, r)
                part = sorted(zip(shard[consumed:block_end].tolist(), pos[consumed:block_end].tolist(),
                                  strict=True))
                for sh, p in part:
                    if out and out[-1][0] == sh and out[-1][2] == p:
                        out[-1][2] = p + 1
                    else:
                        out.append([sh, p, p + 1])
                rest_from = block_end
            skip = rest_from
            for shard_i, start, end in segs:
                if skip >= end - start:
                    skip -= end - start
                    continue
                out.append([shard_i, start + skip, end])
                skip = 0
        return out

    def for_world(self, ds: ShardedDataset, seed: int, batch_size: int, world: int,
                  loader_workers: int = 1, shuffle: int | None = None) -> Plan:
        """This position for `world` ranks of `loader_workers` each, taking batches of `batch_size`:
        unchanged for the same layout; otherwise the samples no worker consumed yet (counted in the
        batches the position was saved with), cut into equal runs for the new plan workers (elastic
        resume: at most one segment per cut is shared by two workers), or the next epoch when they
        cannot fill a batch each. `shuffle` (None: keep the plan's) applies from the re-dealt plan or
        the next epoch on."""
        shuffle = self.shuffle if shuffle is None else shuffle
        saved_batch = self.batch or batch_size
        plan = self
        workers = world * loader_workers
        if (workers, loader_workers, shuffle, saved_batch) != (self.world, self.loader_workers, self.shuffle,
                                                               batch_size):
            left = self.remaining(ds, seed, saved_batch)
            share = sum(e - s for _, s, e in left) // workers
            dealt: list[list[list[int]]] = [[] for _ in range(workers)]
            rank, room = 0, share
            for shard, start, end in left:
                while start < end and rank < workers:
                    take = min(end - start, room)
                    if take:
                        dealt[rank].append([shard, start, start + take])
                    start += take
                    room -= take
                    if room == 0:
                        rank, room = rank + 1, share
            plan = Plan(self.epoch, workers, dealt, 0, loader_workers, shuffle)
        plan = replace(plan, batch=batch_size)
        if plan.steps >= plan.rank_length(ds, seed, batch_size):
            return plan.next_epoch()
        return plan

    def next_epoch(self) -> Plan:
        return Plan(self.epoch + 1, self.world, None, 0, self.loader_workers, self.shuffle, self.batch)



def check_fits(ds: ShardedDataset, batch_size: int, world: int, loader_workers: int = 1) -> None:
    """Raise BadInput unless every plan worker's share of every epoch fills a batch: each gets at least
    len(shards) // (world x loader_workers) shards, whichever the epoch's order."""
    sizes = sorted(s["samples"] for s in ds.shards)
    workers = world * loader_workers
    if len(sizes) // workers * sizes[0] < batch_size:
        who = f"{world} workers" if loader_workers == 1 else \
            f"{workers} loader workers ({world} ranks x {loader_workers})"
        raise BadInput(f"dataset {ds.uri}: {len(ds.shards)} shards of {sizes[0]}-{sizes[-1]} samples cannot "
                       f"give each of {who} a batch of {batch_size} (a worker reads whole shards: "
                       "use a smaller --batch-size, fewer workers, or pack into more shards)")


class RankPositions:
    """A rank's position after each of its batches: counted in the training process, which reads
    nothing (its loader workers do)."""

    def __init__(self, ds: ShardedDataset, seed: int, batch_size: int, plan: Plan):
        self.ds, self.seed, self.batch_size, self.plan = ds, seed, batch_size, plan
        self._length = plan.rank_length(ds, seed, batch_size)

    def advance(self) -> dict:
        """The position after one more batch of this rank."""
        p = self.plan
        self.plan = replace(p, steps=p.steps + 1)
        if self.plan.steps >= self._length:
            self.plan = self.plan.next_epoch()
            self._length = self.plan.rank_length(self.ds, self.seed, self.batch_size)
        return self.plan.state()


# ---- streaming -------------------------------------------------------------------------------
class WorkerStream:
    """One plan worker's batches of raw samples from `plan`'s position on, epoch after epoch, with its
    shards fetched, verified and unpacked on threads of its own, `readahead` shards ahead.

    Iterating yields batches: lists of (sample, sample_seed), where sample_seed is a pure function of
    (seed, epoch, shard, index) for the task's random augmentation. Within a shuffle block, every
    shard the block draws from is held; the next block's shards are fetched meanwhile."""

    def __init__(self, ds: ShardedDataset, seed: int, batch_size: int, plan: Plan, worker: int,
                 readahead: int = 2):
        self.ds, self.seed, self.batch_size, self.plan, self.worker = ds, seed, batch_size, plan, worker
        self.readahead = readahead
        self.shards_read = 0
        self._batches = None

    def _load(self, epoch: int, shard: int) -> tuple[list[dict], np.ndarray]:
        samples = self.ds.read_shard(shard)  # fetch, verify, unpack: in a fetch thread
        self.shards_read += 1
        return samples, sample_order(self.seed, epoch, shard, len(samples))

    def __iter__(self) -> Iterator[list[tuple[dict, int]]]:
        self._batches = self._iterate()
        return self._batches

    def _iterate(self) -> Iterator[list[tuple[dict, int]]]:
        _ = self.ds.store  # one client, made here; boto3's clients are thread-safe
        # `readahead` shards in flight on as many threads: S3 serves concurrent GETs in parallel, and
        # the reads, the checksum and the copies release the GIL.
        pool = ThreadPoolExecutor(self.readahead + 1, thread_name_prefix="ringtrain-shards")
        loaded: dict[tuple[int, int], object] = {}  # (epoch, shard) -> future of (samples, order)
        plan = self.plan
        try:
            while True:
                quota = plan.length(self.ds, self.seed, self.batch_size) * self.batch_size
                shard, pos = plan.sequence(self.ds, self.seed, self.worker)
                at = plan.taken(self.worker) * self.batch_size
                shard, pos = shard[:quota], pos[:quota]
                # the shards in the order first needed from `at` on, and where each is last needed
                need = list(dict.fromkeys(shard[at:].tolist()))
                rank_of = {sh: i for i, sh in enumerate(need)}
                last = {sh: i for i, sh in enumerate(shard.tolist()) if i >= at}
                fetch = 0
                batch: list[tuple[dict, int]] = []
                for i in range(at, quota):
                    sh = int(shard[i])
                    # keep the shard in use and `readahead` more in flight
                    while fetch < len(need) and fetch <= rank_of[sh] + self.readahead:
                        key = (plan.epoch, need[fetch])
                        if key not in loaded:
                            loaded[key] = pool.submit(self._load, *key)
                        fetch += 1
                    samples, order = loaded[(plan.epoch, sh)].result()  # a BadInput naming the shard
                    idx = int(order[int(pos[i])])
                    batch.append((samples[idx], _sample_seed(self.seed, plan.epoch, sh, idx)))
                    if last[sh] == i:
                        del loaded[(plan.epoch, sh)]
                    if len(batch) == self.batch_size:
                        yield batch
                        batch = []
                for future in loaded.values():
                    future.cancel()
                loaded.clear()
                plan = plan.next_epoch()
        finally:
            for future in loaded.values():
                future.cancel()
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """End the iteration (from the thread iterating): shards in flight are dropped."""
        if self._batches is not None:
            self._batches.close()


class ShardStream:
    """One rank's batches of raw samples from `position` on, read in this process (one plan worker per
    rank): what the lm task reads. Iterating yields (samples, position after them)."""

    def __init__(self, ds: ShardedDataset, seed: int, batch_size: int, rank: int, world: int,
                 position: dict | None, readahead: int = 2, shuffle: int = 0):
        self.ds, self.seed, self.batch_size, self.rank, self.world = ds, seed, batch_size, rank, world
        self.plan = Plan.from_state(position, world, 1, shuffle).for_world(ds, seed, batch_size, world, 1,
                                                                           shuffle)
        self.readahead = readahead
        self._worker = WorkerStream(ds, seed, batch_size, self.plan, rank, readahead)
        self._batches = None

    @property
    def shards_read(self) -> int:
        return self._worker.shards_read

    def __iter__(self) -> Iterator[tuple[list[tuple[dict, int]], dict]]:
        self._batches = self._iterate()
        return self._batches

    def _iterate(self):
        positions = RankPositions(self.ds, self.seed, self.batch_size, self.plan)
        for batch in self._worker:
            yield batch, positions.advance()

    def close(self) -> None:
        """End the iteration (from the thread iterating): shards in flight are dropped."""
        self._worker.close()
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
