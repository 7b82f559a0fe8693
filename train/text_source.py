"""Text corpora as a stream of documents: Parquet (by row group, with pyarrow), JSONL and plain text,
from local paths or s3:// (AWS or the local store), never read whole into memory.

    --src corpus/                  every *.parquet, *.jsonl and *.txt under it, in sorted order
    --src s3://bucket/corpus/      the same under an S3 prefix
    --src a.parquet b.jsonl c.txt  files, each read by its suffix (anything else is plain text)
    --column text                  the Parquet column / JSON field holding a document's text

A Parquet file is read one row group at a time, one column only (FineWeb, RedPajama and most public
corpora ship sharded Parquet with a `text` column); an object on S3 is read by ranged GETs, so only
the footer and that column's pages come over the wire. A JSONL line is one document (its --column
field); a plain text file is one document.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from train.errors import BadInput
from train.storage import Store, open_store

PARQUET, JSONL, TEXT = ".parquet", ".jsonl", ".txt"
DIRECTORY_SUFFIXES = (PARQUET, JSONL, TEXT)  # what a directory or prefix contributes
READ_BUFFER = 4 << 20  # bytes per ranged GET / read on the way to pyarrow and the line reader
ROWS_PER_BATCH = 1024  # Parquet rows decoded at a time within a row group


@dataclass(frozen=True)
class Source:
    """One file of the corpus: a key in a store (a local directory or an S3 prefix)."""

    store: Store
    key: str

    @property
    def where(self) -> str:
        return f"{self.store.uri.rstrip('/')}/{self.key}"

    @property
    def format(self) -> str:
        suffix = Path(self.key).suffix.lower()
        return suffix if suffix in (PARQUET, JSONL) else TEXT


class RangeFile(io.RawIOBase):
    """A read-only, seekable file over a store's object, read by ranges (what pyarrow and io's buffered
    reader need from a Python file)."""

    def __init__(self, store: Store, key: str):
        self.store, self.key = store, key
        self.length = store.size(key)
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(base + offset, 0)
        return self.pos

    def readinto(self, buffer) -> int:
        end = min(self.pos + len(buffer), self.length)
        if end <= self.pos:
            return 0
        data = self.store.get_range(self.key, self.pos, end)
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


def open_source(source: Source) -> BinaryIO:
    return io.BufferedReader(RangeFile(source.store, source.key), buffer_size=READ_BUFFER)


def find_sources(srcs: list[str], endpoint_url: str | None) -> list[Source]:
    """The corpus's files, in the order given (a directory's or prefix's in sorted key order). Raises
    BadInput for a path that does not exist or holds none."""
    found: list[Source] = []
    for src in srcs:
        if src.startswith("s3://"):
            store = open_store(src.rstrip("/"), endpoint_url)
            keys = [k for k in store.list() if k.lower().endswith(DIRECTORY_SUFFIXES)]
            if not keys:  # not a prefix: the object itself
                parent, _, name = src.rstrip("/").rpartition("/")
                store = open_store(parent, endpoint_url)
                try:
                    store.size(name)
                except FileNotFoundError:
                    raise BadInput(f"--src {src}: no such object, and no {', '.join(DIRECTORY_SUFFIXES)} "
                                   "objects under it") from None
                keys = [name]
        else:
            path = Path(src)
            if path.is_dir():
                store = open_store(str(path))
                keys = [k for k in store.list() if k.lower().endswith(DIRECTORY_SUFFIXES)]
                if not keys:
                    raise BadInput(f"--src {src}: no {', '.join(DIRECTORY_SUFFIXES)} files under it")
            elif path.is_file():
                store, keys = open_store(str(path.parent)), [path.name]
            else:
                raise BadInput(f"--src {src}: no such file or directory")
        found += [Source(store, k) for k in keys]
    return found


def use_system_allocator() -> None:
    """pyarrow's default allocator (mimalloc) keeps the pages it freed: reading a 3 MB Parquet file row
    group by row group left the process 34 MB larger, 18 MB larger for 1 MB; with the C library's
    allocator, which returns them, 8 MB (measured here). A process whose memory is bounded by a flag
    (pack tokens) calls this first."""
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())


def _parquet(source: Source):
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(open_source(source))
    except Exception as e:  # pyarrow.lib.ArrowInvalid and kin: not Parquet, truncated
        raise BadInput(f"{source.where}: not a readable Parquet file: {e}") from None


def check_source(source: Source, column: str) -> None:
    """Raise BadInput when a Parquet file has no string column `column` (its footer only)."""
    if source.format != PARQUET:
        return
    import pyarrow as pa

    schema = _parquet(source).schema_arrow
    if column not in schema.names:
        raise BadInput(f"{source.where}: no column {column!r} (it has {', '.join(schema.names)}); name the "
                       "text column with --column")
    kind = schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise BadInput(f"{source.where}: column {column!r} holds {kind}, not text")


def documents(source: Source, column: str) -> Iterator[str]:
    """The source's non-empty documents, in stored order."""
    if source.format == PARQUET:
        check_source(source, column)
        parquet = _parquet(source)
        for group in range(parquet.num_row_groups):
            # one thread: a pack's parallelism is its tokenizer processes
            for batch in parquet.iter_batches(ROWS_PER_BATCH, row_groups=[group], columns=[column],
                                              use_threads=False):
                yield from (text for text in batch.column(0).to_pylist() if text)
    elif source.format == JSONL:
        with open_source(source) as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as e:
                    raise BadInput(f"{source.where}:{number}: not a JSON line: {e}") from None
                text = record.get(column) if isinstance(record, dict) else None
                if not isinstance(text, str):
                    raise BadInput(f"{source.where}:{number}: no text field {column!r}; name it with "
                                   "--column")
                if text:
                    yield text
    else:
        with open_source(source) as f:
            text = f.read().decode("utf-8", errors="replace")
        if text:
            yield text


def corpus(sources: list[Source], column: str) -> Iterator[str]:
    for source in sources:
        yield from documents(source, column)
