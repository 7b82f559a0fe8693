"""Token shards: contiguous token arrays with an index of checksums, read by byte range.

Layout (same on S3 and on disk), written by `ringtrain data pack tokens` (train/pack_tokens.py):

    <uri>/index.json        {"format": "ringtrain-tokens/1", "kind": "tokens", "dtype": "uint16",
                             "vocab_size": V, "eod_token": E, "block_tokens": K, "tokens": T,
                             "documents": D, "tokenizer": "tokenizer.json",
                             "shards": [{"name": "tokens-00000.bin", "tokens": n, "bytes": b,
                                         "xxh3_128": "...", "blocks": ["...", ...]}]}
    <uri>/tokens-00000.bin  n tokens, little-endian uint16 (uint32 when V > 65,536), the documents one
                            after the other, each followed by the end-of-document token E
    <uri>/tokenizer.json    the tokenizer that wrote them

Each shard carries its whole checksum (train.checksum, as every object we write) and one per block of
K tokens (the last block may be shorter): a reader fetches a block by one ranged GET and verifies it
alone, so a worker reads the blocks it trains on and nothing else.

Samples are windows of seq_len + 1 tokens inside a block, at a stride of seq_len (the model predicts
tokens 1..n from 0..n-1; consecutive windows share one token): a block of k tokens holds
(k - 1) // seq_len of them; the tail of a block that fills no window is not trained on (with K =
262,144 and seq_len 1,024, 0.4 % of the tokens).

Position: the blocks are the units train.shards.Plan deals to the workers (an epoch's blocks in an
order drawn from (seed, epoch), dealt round-robin; each block's windows in an order drawn from (seed,
epoch, block)); after a change of world size it re-deals what no worker consumed, so a resumed run
reads what the uninterrupted one would have, on any world size.
"""

from __future__ import annotations

import collections
import functools
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from train import checksum
from train.errors import BadInput
from train.shards import Plan, sample_order
from train.storage import open_store

FORMAT = "ringtrain-tokens/1"
INDEX = "index.json"
TOKENIZER = "tokenizer.json"
BLOCK_TOKENS = 1 << 18  # 512 KiB of uint16 per ranged GET and checksum


def shard_name(i: int) -> str:
    return f"tokens-{i:05d}.bin"


def block_checksums(data: bytes | memoryview, block_bytes: int) -> list[str]:
    field = checksum.WRITTEN
    view = memoryview(data)
    return [checksum.of(view[i:i + block_bytes])[field] for i in range(0, len(view), block_bytes)]


def shard_entry(name: str, tokens: np.ndarray, block_tokens: int) -> tuple[bytes, dict]:
    """A shard's bytes and its index entry."""
    data = tokens.astype(tokens.dtype.newbyteorder("<"), copy=False).tobytes()
    return data, {"name": name, "tokens": int(tokens.size), "bytes": len(data), **checksum.of(data),
                  "blocks": block_checksums(data, block_tokens * tokens.dtype.itemsize)}


@dataclass(frozen=True)
class Block:
    """One checksummed block: `tokens` tokens of shard `shard` from token `start` on."""

    shard: int
    index: int  # within the shard
    start: int
    tokens: int
    digest: str


@dataclass
class TokenDataset:
    uri: str
    endpoint_url: str | None
    index: dict

    @functools.cached_property
    def store(self):
        return open_store(self.uri, self.endpoint_url)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.index["dtype"]).newbyteorder("<")

    @functools.cached_property
    def blocks(self) -> list[Block]:
        k = self.index["block_tokens"]
        return [Block(s, j, j * k, min(k, entry["tokens"] - j * k), digest)
                for s, entry in enumerate(self.index["shards"]) for j, digest in enumerate(entry["blocks"])]

    def read_block(self, b: int) -> np.ndarray:
        """Block b's tokens, verified. Raises BadInput naming the shard when it is missing, short or
        fails its checksum."""
        return self.verify_block(b, self.fetch_block(b))

    def fetch_block(self, b: int) -> bytes:
        """Block b's bytes, by one ranged read (the part of read_block that waits on the store)."""
        block = self.blocks[b]
        name = self.index["shards"][block.shard]["name"]
        size = self.dtype.itemsize
        try:
            return self.store.get_range(name, block.start * size, (block.start + block.tokens) * size)
        except FileNotFoundError:
            raise BadInput(f"dataset {self.uri}: shard {name} listed in {INDEX} is missing") from None

    def verify_block(self, b: int, data: bytes) -> np.ndarray:
        """Block b's tokens from its fetched bytes, once they pass the block's checksum."""
        block = self.blocks[b]
        if checksum.of(data)[checksum.WRITTEN] != block.digest:
            name = self.index["shards"][block.shard]["name"]
            raise BadInput(f"dataset {self.uri}: shard {name} block {block.index} (tokens {block.start}.."
                           f"{block.start + block.tokens}) fails its {checksum.WRITTEN} check (corrupt, "
                           "truncated or replaced)")
        return np.frombuffer(data, dtype=self.dtype)

    def windows(self, seq_len: int) -> WindowView:
        return WindowView(self, seq_len)


def open_dataset(uri: str, endpoint_url: str | None) -> TokenDataset:
    """Read and check the index only. Raises BadInput."""
    store = open_store(uri, endpoint_url)
    store.check(create=False)
    try:
        index = json.loads(store.get(INDEX))
    except FileNotFoundError:
        raise BadInput(f"no token dataset at {uri}: {INDEX} not found (write one with `ringtrain data pack "
                       f"tokens --src ... --tokenizer ... --out {uri}`)") from None
    except ValueError as e:
        raise BadInput(f"dataset index {uri}/{INDEX} is not valid JSON: {e}") from None
    found = index.get("format") if isinstance(index, dict) else None
    if found != FORMAT:
        raise BadInput(f"{uri}/{INDEX}: format {found!r}, expected {FORMAT!r} (token shards written by "
                       "`ringtrain data pack tokens`)")
    if not index.get("shards"):
        raise BadInput(f"dataset {uri}: {INDEX} lists no shards")
    return TokenDataset(uri, endpoint_url, index)


@dataclass
class WindowView:
    """The dataset as train.shards.Plan sees it: its blocks as units of (k - 1) // seq_len samples."""

    ds: TokenDataset
    seq_len: int

    @functools.cached_property
    def shards(self) -> list[dict]:
        return [{"samples": max(b.tokens - 1, 0) // self.seq_len} for b in self.ds.blocks]

    def windows(self, b: int, tokens: np.ndarray | None = None) -> np.ndarray:
        """Block b's windows, [n, seq_len + 1] (views into its tokens, read here unless given)."""
        tokens = self.ds.read_block(b) if tokens is None else tokens
        n = self.shards[b]["samples"]
        return np.lib.stride_tricks.as_strided(tokens, (n, self.seq_len + 1),
                                               (self.seq_len * tokens.itemsize, tokens.itemsize),
                                               writeable=False)


def check_fits(view: WindowView, batch_size: int, world: int) -> None:
    """Raise BadInput unless every worker's share of every epoch fills a batch: each gets at least
    len(blocks) // world blocks, whichever the epoch's order, so the smallest that many must do."""
    sizes = sorted(s["samples"] for s in view.shards)
    if sum(sizes[:len(sizes) // world]) < batch_size:
        raise BadInput(f"dataset {view.ds.uri}: {len(sizes)} blocks of {sizes[0]}-{sizes[-1]} windows of "
                       f"--seq-len {view.seq_len} cannot give each of {world} workers a batch of "
                       f"{batch_size} "
                       "(a worker reads whole blocks: use a smaller --batch-size or --seq-len, fewer "
                       "workers, or pack with a smaller --block-tokens)")


class WindowStream:
    """One worker's batches of windows from `position` on, [batch_size, seq_len + 1] int64.

    Its blocks are read `readahead` blocks ahead on threads of their own: a ranged GET waits on the
    network with the GIL released. readahead 0 reads each block on the consuming thread when it is
    needed, for data on a local disk, where a read costs less than handing it over between threads.
    The checksum, the sample order and the gather are quick work under the GIL and run on the
    consuming thread in both modes, batch by batch, as a loop with no thread does them.

    Iterating yields (batch, position after it); the position is a train.shards.Plan's state.
    """

    def __init__(self, view: WindowView, seed: int, batch_size: int, rank: int, world: int,
                 position: dict | None, readahead: int = 4):
        self.view, self.seed, self.batch_size, self.rank, self.world = view, seed, batch_size, rank, world
        self.plan = Plan.from_state(position, world).for_world(view, seed, batch_size, world)
        self.readahead = readahead
        self.blocks_read = 0
        self._batches = None

    def _segments(self) -> Iterator[tuple[int, int, int, int]]:
        """(epoch, block, start, end) of this worker from the plan's position on, epoch after epoch."""
        plan = self.plan
        while True:
            skip = plan.steps * self.batch_size
            for block, start, end in plan.rank_segments(self.view, self.seed, self.rank):
                if skip >= end - start:
                    skip -= end - start
                    continue
                yield plan.epoch, block, start + skip, end
                skip = 0
            plan = Plan(plan.epoch + 1, self.world, None, 0)

    def _fetch(self, block: int) -> bytes:
        data = self.view.ds.fetch_block(block)
        self.blocks_read += 1
        return data

    def _fetched(self) -> Iterator[tuple[int, int, int, int, bytes]]:
        """The segments with their blocks' bytes, read ahead on a pool or (readahead 0) inline."""
        segments = self._segments()
        if not self.readahead:
            for epoch, block, start, end in segments:
                yield epoch, block, start, end, self._fetch(block)
            return  # (the segments never end)
        _ = self.view.ds.store  # one client, made here; boto3's clients are thread-safe
        pool = ThreadPoolExecutor(self.readahead + 1, thread_name_prefix="ringtrain-tokens")
        pending: collections.deque = collections.deque()
        try:
            while True:
                while len(pending) < self.readahead + 1:
                    epoch, block, start, end = next(segments)
                    pending.append((epoch, block, start, end, pool.submit(self._fetch, block)))
                epoch, block, start, end, fetching = pending.popleft()
                yield epoch, block, start, end, fetching.result()
        finally:
            for *_, fetching in pending:
                fetching.cancel()
            pool.shutdown(wait=False, cancel_futures=True)

    def __iter__(self):
        self._batches = self._iterate()
        return self._batches

    def _iterate(self) -> Iterator[tuple[np.ndarray, dict]]:
        fetched = self._fetched()
        plan, steps = self.plan, self.plan.steps
        length = plan.length(self.view, self.seed, self.batch_size)
        # a batch's position is this with its steps: one dict per batch, not a Plan
        position = Plan(plan.epoch, plan.world, plan.segments, 0).state()
        size, width = self.batch_size, self.view.seq_len + 1
        batch, filled = np.empty((size, width), dtype=np.int64), 0
        try:
            for epoch, block, start, end, data in fetched:
                # a BadInput naming the shard is raised here
                windows = self.view.windows(block, self.view.ds.verify_block(block, data))
                order = sample_order(self.seed, epoch, block, len(windows))
                i = start
                while i < end and epoch == plan.epoch:  # another epoch: a tail the plan drops
                    j = min(end, i + size - filled)
                    batch[filled:filled + j - i] = windows[order[i:j]]
                    filled, i = filled + j - i, j
                    if filled == size:
                        steps += 1
                        if steps >= length:
                            plan, steps = Plan(plan.epoch + 1, self.world, None, 0), 0
                            length = plan.length(self.view, self.seed, self.batch_size)
                            position = plan.state()
                        # a new array each time: the consumer may keep it
                        yield batch, {**position, "steps": steps}
                        batch, filled = np.empty((size, width), dtype=np.int64), 0
                del windows, data
        finally:
            fetched.close()

    def close(self) -> None:
        if self._batches is not None:
            self._batches.close()


def eval_windows(view: WindowView, rank: int, world: int) -> Iterator[np.ndarray]:
    """This worker's share of an evaluation set, in stored order: every world-th block."""
    for b in range(rank, len(view.shards), world):
        yield from view.windows(b)
