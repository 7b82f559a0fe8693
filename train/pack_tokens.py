"""`ringtrain data pack tokens` and `ringtrain data tokenizer train`: a text corpus -> token shards.

    ringtrain data tokenizer train --src corpus/ --column text --vocab-size 32768 --out tokenizer.json
    ringtrain data pack tokens --src corpus/ --column text --tokenizer tokenizer.json \
        --out s3://bucket/corpus/train --eval-out s3://bucket/corpus/eval --eval-fraction 0.001 \
        --workers 8 --memory-mb 2048

The corpus streams (train.text_source) in batches of documents to `--workers` processes, each running
the tokenizer on its own core; the token arrays come back in corpus order and fill fixed-size shards
(train.tokens), each with its checksums, written as it fills. What is held at once is bounded by
--memory-mb, not by the corpus: the shards being filled (two with --eval-out) and the batches in
flight, whose size follows from what the shards leave (`Budget`); a document larger than a batch goes
alone. The shards are the same whatever --workers and --memory-mb: documents keep their order, and
each goes to the evaluation set by a draw from (seed, its number in the corpus).

Bad input (a missing column, a tokenizer that is missing or malformed, a vocabulary beyond uint32, an
empty corpus, a destination that holds a dataset already) is one line and exit code 2; whatever was
written by then is deleted, so nothing half-written is left behind.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from train import text_source, tokenizer, tokens
from train.errors import BadInput
from train.storage import Store, open_store

MIN_BATCH_BYTES = 64 << 10
MAX_BATCH_BYTES = 16 << 20  # beyond this a batch only adds latency before the first shard fills
BATCHES_PER_WORKER = 2  # in flight: one being tokenized, one waiting


@dataclass(frozen=True)
class Budget:
    """How --memory-mb is spent: `writers` shard buffers of `shard_bytes` (each copied once on its way
    out), and `in_flight` batches of up to `batch_bytes` of text, each held as the text, its copy in the
    worker and its tokens (itemsize bytes per byte of text at most: a byte-level BPE never makes more
    tokens than bytes, and the end-of-document token comes once per document)."""

    shard_tokens: int
    batch_bytes: int
    in_flight: int

    @classmethod
    def plan(cls, memory_mb: int, shard_mb: float, block_tokens: int, itemsize: int, workers: int,
             writers: int) -> Budget:
        shard_tokens = max(int(shard_mb * (1 << 20)) // itemsize // block_tokens, 1) * block_tokens
        in_flight = workers * BATCHES_PER_WORKER
        left = memory_mb * (1 << 20) - writers * 2 * shard_tokens * itemsize
        batch_bytes = min(left // (in_flight * (2 + itemsize)), MAX_BATCH_BYTES) if left > 0 else 0
        if batch_bytes < MIN_BATCH_BYTES:
            need = writers * 2 * shard_tokens * itemsize + in_flight * (2 + itemsize) * MIN_BATCH_BYTES
            raise BadInput(f"--memory-mb {memory_mb} is too small for {writers} shard(s) of --shard-mb "
                           f"{shard_mb} and --workers {workers}: needs at least {(need >> 20) + 1} MB "
                           "(or lower --shard-mb)")
        return cls(shard_tokens, int(batch_bytes), in_flight)


def is_eval(first_document: int, count: int, seed: int, fraction: float) -> np.ndarray:
    """Whether each of documents first..first+count-1 goes to the evaluation set: a uniform draw from
    (seed, document number), SplitMix64's finaliser (Steele et al., "Fast splittable pseudorandom number
    generators", OOPSLA 2014), so the split does not depend on how the corpus was batched."""
    if fraction <= 0:
        return np.zeros(count, dtype=bool)
    with np.errstate(over="ignore"):
        z = (np.arange(first_document, first_document + count, dtype=np.uint64)
             + np.uint64(seed % (1 << 64)) * np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53) < fraction


def batches(documents: Iterable[str], batch_bytes: int) -> Iterator[list[str]]:
    """Documents in lists of about batch_bytes characters (a longer document alone)."""
    batch: list[str] = []
    size = 0
    for doc in documents:
        if batch and size + len(doc) > batch_bytes:
            yield batch
            batch, size = [], 0
        batch.append(doc)
        size += len(doc)
    if batch:
        yield batch


# ---- the worker processes --------------------------------------------------------------------
_WORKER: dict = {}


def _start_worker(tokenizer_json: str, eod: int, dtype: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per process: the processes are the parallelism
    from tokenizers import Tokenizer

    _WORKER.update(tokenizer=Tokenizer.from_str(tokenizer_json), eod=eod, dtype=dtype)


def encode(texts: list[str], tok=None, eod: int | None = None, dtype: str | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    """(every document's tokens followed by the end-of-document token, each document's token count)."""
    tok = tok or _WORKER["tokenizer"]
    eod = _WORKER["eod"] if eod is None else eod
    ids: list[int] = []
    lengths = np.empty(len(texts), dtype=np.int64)
    for i, enc in enumerate(tok.encode_batch_fast(texts, add_special_tokens=False)):
        ids += enc.ids
        ids.append(eod)
        lengths[i] = len(enc.ids) + 1
    return np.array(ids, dtype=dtype or _WORKER["dtype"]), lengths


# ---- writing ---------------------------------------------------------------------------------
@dataclass
class ShardWriter:
    """Fills shards of `shard_tokens` and writes each when full; remembers every key it wrote."""

    store: Store
    shard_tokens: int
    block_tokens: int
    dtype: str
    buffer: np.ndarray = field(init=False)
    filled: int = 0
    entries: list = field(default_factory=list)
    written: list = field(default_factory=list)
    documents: int = 0

    def __post_init__(self):
        self.buffer = np.empty(self.shard_tokens, dtype=self.dtype)

    def add(self, toks: np.ndarray, documents: int) -> None:
        self.documents += documents
        while toks.size:
            take = min(toks.size, self.shard_tokens - self.filled)
            self.buffer[self.filled:self.filled + take] = toks[:take]
            self.filled += take
            toks = toks[take:]
            if self.filled == self.shard_tokens:
                self.flush()

    def flush(self) -> None:
        if self.filled:
            name = tokens.shard_name(len(self.entries))
            data, entry = tokens.shard_entry(name, self.buffer[:self.filled], self.block_tokens)
            self.written.append(name)
            self.store.put(name, data)
            self.entries.append(entry)
            self.filled = 0

    def finish(self, meta: dict, tokenizer_json: str) -> dict:
        self.flush()
        index = {"format": tokens.FORMAT, "kind": "tokens", **meta, "block_tokens": self.block_tokens,
                 "tokens": sum(e["tokens"] for e in self.entries), "documents": self.documents,
                 "tokenizer": tokens.TOKENIZER, "shards": self.entries}
        self.written.append(tokens.TOKENIZER)
        self.store.put(tokens.TOKENIZER, tokenizer_json.encode())
        self.written.append(tokens.INDEX)
        # last: a reader never sees a partial dataset
        self.store.put(tokens.INDEX, json.dumps(index, indent=1).encode())
        return index


def _open_destination(uri: str, endpoint_url: str | None) -> Store:
    store = open_store(uri, endpoint_url)
    store.check(create=True)
    try:
        store.size(tokens.INDEX)
    except FileNotFoundError:
        return store
    raise BadInput(f"--out {uri} holds a dataset already ({tokens.INDEX}); give an empty destination")


@dataclass
class PackResult:
    indexes: list[dict]
    text_bytes: int
    seconds: float
    workers: int
    budget: Budget
    held_bytes_max: int  # the most bytes of shards, text and tokens held at once (what --memory-mb bounds)


def pack_tokens(src: list[str], out: str, tokenizer_path: str, column: str = "text",
                eval_out: str | None = None, eval_fraction: float = 0.0, seed: int = 0, workers: int = 1,
                memory_mb: int = 1024, shard_mb: float = 256, block_tokens: int = tokens.BLOCK_TOKENS,
                eod_token: str = tokenizer.EOD_TOKEN, endpoint_url: str | None = None) -> PackResult:
    if workers < 1:
        raise BadInput(f"--workers {workers}: must be >= 1")
    if block_tokens < 2:
        raise BadInput(f"--block-tokens {block_tokens}: must be >= 2")
    if shard_mb <= 0:
        raise BadInput(f"--shard-mb {shard_mb}: must be > 0")
    if not 0 <= eval_fraction < 1 or (eval_fraction > 0) != (eval_out is not None):
        raise BadInput(f"--eval-fraction {eval_fraction} with --eval-out {eval_out}: give both (fraction in "
                       "(0, 1)) or neither")
    if eval_out is not None and eval_out.rstrip("/") == out.rstrip("/"):
        raise BadInput(f"--eval-out {eval_out}: the same place as --out")
    tokenizer_json, tok = tokenizer.load(tokenizer_path)
    eod = tokenizer.eod_id(tok, eod_token, tokenizer_path)
    vocab = tokenizer.vocab_size(tok)
    dtype = tokenizer.token_dtype(vocab)
    budget = Budget.plan(memory_mb, shard_mb, block_tokens, np.dtype(dtype).itemsize, workers,
                         writers=2 if eval_out else 1)
    text_source.use_system_allocator()
    sources = text_source.find_sources(src, endpoint_url)
    for source in sources:
        text_source.check_source(source, column)
    writers = [ShardWriter(_open_destination(uri, endpoint_url), budget.shard_tokens, block_tokens, dtype)
               for uri in ([out, eval_out] if eval_out else [out])]
    started = time.perf_counter()
    text_bytes = held_max = 0
    try:
        documents = 0
        pending: collections.deque = collections.deque()  # (text bytes, result) in corpus order
        shard_bytes = sum(2 * w.buffer.nbytes for w in writers)  # each buffer and its copy on the way out
        # spawn, not fork: the parent may run threads (boto3, pyarrow). An executor, not a Pool: a worker
        # that dies (or fails to start) breaks it with an error instead of being replaced forever.
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, spawn, _start_worker, (tokenizer_json, eod, dtype)) as pool:
            def collect() -> None:
                nonlocal documents, held_max
                _, result = pending.popleft()
                toks, lengths = result.result()
                # the batches in flight (their text, its copy in a worker) and the tokens just back
                in_flight = sum(2 * size for size, _ in pending) + toks.nbytes + lengths.nbytes
                held_max = max(held_max, shard_bytes + in_flight)
                evals = is_eval(documents, len(lengths), seed, eval_fraction)
                documents += len(lengths)
                if evals.any():
                    to_eval = np.repeat(evals, lengths)
                    writers[1].add(toks[to_eval], int(evals.sum()))
                    toks = toks[~to_eval]
                writers[0].add(toks, int((~evals).sum()))

            for batch in batches(text_source.corpus(sources, column), budget.batch_bytes):
                size = sum(map(len, batch))
                text_bytes += size
                pending.append((size, pool.submit(encode, batch)))
                del batch
                if len(pending) >= budget.in_flight:
                    collect()
            while pending:
                collect()
        if not writers[0].entries and not writers[0].filled:
            raise BadInput(f"--src {' '.join(src)}: an empty corpus (no text in column {column!r} of "
                           f"{len(sources)} file(s)); nothing to write to {out}")
        if eval_out and not writers[1].entries and not writers[1].filled:
            raise BadInput(f"--eval-out {eval_out}: none of the {documents} documents fell to it; raise "
                           f"--eval-fraction ({eval_fraction})")
        meta = {"dtype": dtype, "vocab_size": vocab, "eod_token": eod}
        indexes = [writer.finish(meta, tokenizer_json) for writer in writers]
    except BaseException:
        for writer in writers:
            writer.store.delete_many(writer.written)
        raise
    return PackResult(indexes, text_bytes, time.perf_counter() - started, workers, budget, held_max)


def train_tokenizer(src: list[str], out: str, column: str, vocab_size: int,
                    endpoint_url: str | None = None) -> int:
    """Train a byte-level BPE on the corpus and write its tokenizer.json to `out` (a local path or an
    S3 key), whole or not at all. Returns its vocabulary size."""
    tokenizer.check_vocab_size("--vocab-size", vocab_size)
    sources = text_source.find_sources(src, endpoint_url)
    for source in sources:
        text_source.check_source(source, column)
    seen = 0

    def counted() -> Iterator[str]:
        nonlocal seen
        for doc in text_source.corpus(sources, column):
            seen += 1
            yield doc

    tok = tokenizer.train_bpe(counted(), vocab_size)
    if not seen:
        raise BadInput(f"--src {' '.join(src)}: an empty corpus (no text in column {column!r}); nothing "
                       "to train on")
    parent, _, name = out.rstrip("/").rpartition("/")
    store = open_store(parent or ".", endpoint_url)
    store.check(create=True)
    store.put(name, tok.to_str().encode())  # a local store writes a temporary file and renames it
    return tokenizer.vocab_size(tok)


def main(argv: list[str], prog: str = "python -m train.data") -> int:
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or None
    p = argparse.ArgumentParser(prog=prog, description="Text corpora -> token shards for --task lm.")
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("pack", help="tokenize a corpus into token shards").add_subparsers(dest="kind",
                                                                                         required=True)
    k = k.add_parser("tokens", help="a corpus (Parquet, JSONL, text; local or s3://) -> token shards",
                     description=__doc__.split("\n\n")[1])
    k.add_argument("--src", nargs="+", required=True, help="files, directories or s3:// prefixes "
                   "(*.parquet, *.jsonl, *.txt)")
    k.add_argument("--column", default="text", help="the Parquet column / JSONL field with the text")
    k.add_argument("--tokenizer", required=True, help="a tokenizer.json (yours, or `tokenizer train`'s)")
    k.add_argument("--eod-token", default=tokenizer.EOD_TOKEN, help="the end-of-document token")
    k.add_argument("--out", required=True, help="s3://bucket/prefix or /local/dir (must hold no dataset)")
    k.add_argument("--eval-out", default=None, help="where the evaluation share goes (with --eval-fraction)")
    k.add_argument("--eval-fraction", type=float, default=0.0, help="share of documents held out")
    k.add_argument("--seed", type=int, default=0, help="the evaluation split's draws")
    k.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="tokenizer processes")
    k.add_argument("--memory-mb", type=int, default=1024,
                   help="bound on the shards being filled and the text and tokens in flight")
    k.add_argument("--shard-mb", type=float, default=256, help="size of a token shard")
    k.add_argument("--block-tokens", type=int, default=tokens.BLOCK_TOKENS,
                   help="tokens per checksummed block, the unit a training worker reads")
    k.add_argument("--s3-endpoint-url", default=endpoint)
    t = sub.add_parser("tokenizer", help="train a tokenizer").add_subparsers(dest="kind", required=True)
    t = t.add_parser("train", help="a byte-level BPE trained on your corpus, written as tokenizer.json")
    t.add_argument("--src", nargs="+", required=True, help="files, directories or s3:// prefixes")
    t.add_argument("--column", default="text", help="the Parquet column / JSONL field with the text")
    t.add_argument("--vocab-size", type=int, required=True, help="tokens, the end-of-document token included")
    t.add_argument("--out", required=True, help="the tokenizer.json to write (a path or s3://bucket/key)")
    t.add_argument("--s3-endpoint-url", default=endpoint)
    a = p.parse_args(argv)
    try:
        if a.cmd == "tokenizer":
            n = train_tokenizer(a.src, a.out, a.column, a.vocab_size, a.s3_endpoint_url)
            print(f"wrote a byte-level BPE of {n} tokens to {a.out}")
            return 0
        result = pack_tokens(a.src, a.out, a.tokenizer, a.column, a.eval_out, a.eval_fraction, a.seed,
                             a.workers, a.memory_mb, a.shard_mb, a.block_tokens, a.eod_token,
                             a.s3_endpoint_url)
        for uri, index in zip([a.out, a.eval_out], result.indexes, strict=False):
            print(f"wrote {index['tokens']} {index['dtype']} tokens of {index['documents']} documents in "
                  f"{len(index['shards'])} shards to {uri}")
        mb = result.text_bytes / 1e6
        print(f"packed {mb:.1f} MB of text in {result.seconds:.1f} s on {result.workers} worker(s): "
              f"{mb / result.seconds / result.workers:.2f} MB/s per worker")
    except BadInput as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    return 0
