"""The lm task's text path: tokenizer (train.tokenizer), Parquet/JSONL/text input (train.text_source),
`pack tokens` (train.pack_tokens) and token shards read by range (train.tokens)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cluster.local.objectstore import LOCAL_CREDENTIALS
from train import pack_tokens, text_source, tokenizer, tokens
from train.data import main as data_main
from train.errors import BadInput
from train.storage import open_store

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")


def _docs(n: int, seed: int = 0, words: int = 60) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"doc {i}: " + " ".join(rng.choice(WORDS, words)) + "\n" for i in range(n)]


def _parquet(path, docs, rows_per_group=7, column="text"):
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": list(range(len(docs))), column: docs})
    pq.write_table(table, path, row_group_size=rows_per_group)
    return path


@pytest.fixture(scope="module")
def tok_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok = tokenizer.train_bpe(_docs(200), 300)
    path.write_text(tok.to_str())
    return path


@pytest.fixture
def corpus(tmp_path):
    docs = _docs(120, seed=1)
    _parquet(tmp_path / "corpus" / "a.parquet", docs[:70])
    _parquet(tmp_path / "corpus" / "b.parquet", docs[70:])
    return tmp_path / "corpus", docs


def _pack(src, out, tok_file, **kw):
    kw = {"workers": 1, "memory_mb": 4, "shard_mb": 0.004, "block_tokens": 512, **kw}
    return pack_tokens.pack_tokens([str(s) for s in (src if isinstance(src, list) else [src])], str(out),
                                   str(tok_file), **kw)


def _all_tokens(uri) -> np.ndarray:
    ds = tokens.open_dataset(str(uri), None)
    return np.concatenate([ds.read_block(b) for b in range(len(ds.blocks))])


# ---- tokenizer -------------------------------------------------------------------------------------
def test_a_trained_byte_level_bpe_has_the_vocabulary_asked_and_round_trips_any_text(tok_file):
    _, tok = tokenizer.load(str(tok_file))
    assert tokenizer.vocab_size(tok) == 300
    eod = tokenizer.eod_id(tok, tokenizer.EOD_TOKEN, "t")
    text = "gamma delta ünïcödé 🙂 {'x': 1}"  # bytes it never saw still encode (byte-level)
    ids = tok.encode(text).ids
    assert eod not in ids and tok.decode(ids) == text
    assert len(tok.encode("alpha beta gamma").ids) < len("alpha beta gamma")  # merges learned


@pytest.mark.parametrize("vocab, dtype", [(257, "uint16"), (65536, "uint16"), (65537, "uint32"),
                                          (1 << 32, "uint32")])
def test_token_dtype_is_the_narrowest_that_holds_every_id(vocab, dtype):
    assert tokenizer.token_dtype(vocab) == dtype


def test_a_vocabulary_beyond_uint32_is_refused():
    with pytest.raises(BadInput, match="does not fit uint32"):
        tokenizer.token_dtype((1 << 32) + 1)
    with pytest.raises(BadInput, match="does not fit uint32"):
        tokenizer.train_bpe([], (1 << 32) + 1)
    spec = {"model": {"type": "BPE", "vocab": {"a": 0, "b": (1 << 32)}, "merges": []}, "added_tokens": []}
    with pytest.raises(BadInput, match="does not fit uint32"):
        tokenizer.parse(json.dumps(spec), "big.json")


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ('{"version": "1.0"}', 'no "model"'),
    ('{"model": {"type": "Nonsense"}}', "not a tokenizer `tokenizers` can load"),
])
def test_a_missing_or_malformed_tokenizer_is_one_message(tmp_path, content, message):
    path = tmp_path / "tokenizer.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BadInput, match=message):
        tokenizer.load(str(path))


# ---- text input ------------------------------------------------------------------------------------
def test_parquet_jsonl_and_text_stream_their_documents_in_order(tmp_path):
    docs = _docs(30)
    _parquet(tmp_path / "c" / "1.parquet", docs[:20], rows_per_group=3)
    (tmp_path / "c" / "2.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[20:28]))
    (tmp_path / "c" / "3.txt").write_text(docs[28] + docs[29])
    (tmp_path / "c" / "ignored.csv").write_text("x")
    sources = text_source.find_sources([str(tmp_path / "c")], None)
    assert [s.key for s in sources] == ["1.parquet", "2.jsonl", "3.txt"]
    assert list(text_source.corpus(sources, "text")) == docs[:28] + [docs[28] + docs[29]]
    assert pq.ParquetFile(tmp_path / "c" / "1.parquet").num_row_groups == 7  # read by row group


def test_a_missing_column_is_named_with_the_columns_there(tmp_path):
    _parquet(tmp_path / "a.parquet", _docs(3), column="content")
    [source] = text_source.find_sources([str(tmp_path / "a.parquet")], None)
    with pytest.raises(BadInput, match=r"no column 'text' \(it has id, content\)"):
        text_source.check_source(source, "text")


def test_parquet_on_s3_is_read_by_ranges(object_store, s3_bucket, tmp_path, monkeypatch):
    for k, v in LOCAL_CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    docs = _docs(40)
    path = _parquet(tmp_path / "a.parquet", docs, rows_per_group=10)
    store = open_store(f"s3://{s3_bucket}/corpus", object_store.endpoint_url)
    store.put("a.parquet", path.read_bytes())
    store.put("notes.md", b"not a corpus file")
    [source] = text_source.find_sources([f"s3://{s3_bucket}/corpus"], object_store.endpoint_url)
    assert list(text_source.documents(source, "text")) == docs
    assert store.get_range("a.parquet", 4, 10) == path.read_bytes()[4:10]
    assert store.size("a.parquet") == path.stat().st_size


# ---- pack tokens -----------------------------------------------------------------------------------
def test_pack_writes_each_document_then_the_end_of_document_token(corpus, tmp_path, tok_file):
    src, docs = corpus
    result = _pack(src, tmp_path / "out", tok_file)
    [index] = result.indexes
    _, tok = tokenizer.load(str(tok_file))
    eod = tokenizer.eod_id(tok, tokenizer.EOD_TOKEN, "t")
    assert index["dtype"] == "uint16" and index["eod_token"] == eod and index["documents"] == len(docs)
    assert len(index["shards"]) > 2  # 4 kB shards: several, each with its checksums
    all_tokens = _all_tokens(tmp_path / "out")
    assert all_tokens.size == index["tokens"] and all_tokens[-1] == eod
    parts = np.split(all_tokens, np.flatnonzero(all_tokens == eod) + 1)
    texts = [tok.decode(list(map(int, part))) for part in parts if part.size]
    assert [t.removesuffix(tokenizer.EOD_TOKEN) for t in texts] == docs
    assert json.loads((tmp_path / "out" / "tokenizer.json").read_text()) == json.loads(tok_file.read_text())


def test_the_shards_are_the_same_whatever_the_workers_and_memory(corpus, tmp_path, tok_file):
    src, _ = corpus
    a = _pack(src, tmp_path / "a", tok_file, workers=1, memory_mb=4)
    b = _pack(src, tmp_path / "b", tok_file, workers=2, memory_mb=64)
    assert a.budget.batch_bytes != b.budget.batch_bytes
    assert a.indexes[0]["shards"] == b.indexes[0]["shards"]


def test_the_evaluation_split_is_a_share_of_whole_documents(corpus, tmp_path, tok_file):
    src, docs = corpus
    result = _pack(src, tmp_path / "train", tok_file, eval_out=str(tmp_path / "eval"), eval_fraction=0.25)
    train, held = result.indexes
    assert train["documents"] + held["documents"] == len(docs) and 15 <= held["documents"] <= 45
    assert train["tokens"] + held["tokens"] == _pack(src, tmp_path / "all", tok_file).indexes[0]["tokens"]
    assert np.array_equal(pack_tokens.is_eval(10, 5, 3, 0.5), pack_tokens.is_eval(0, 20, 3, 0.5)[10:15])


def test_packing_holds_a_bounded_share_of_a_corpus_larger_than_its_memory(tmp_path, tok_file):
    """2.9 MB of text through --memory-mb 1: the shard being filled (128 kB and its copy) and the batches
    in flight (96 kB of text each) are all that is held at once, whatever the corpus's size."""
    big = _docs(3000, words=170)
    _parquet(tmp_path / "big" / "a.parquet", big, rows_per_group=200)
    result = _pack(tmp_path / "big", tmp_path / "out", tok_file, memory_mb=1, shard_mb=0.125,
                   block_tokens=4096)
    assert result.text_bytes > 2.5 * (1 << 20)
    assert 0.25 * (1 << 20) < result.held_bytes_max <= 1 << 20, result.held_bytes_max
    assert len(result.indexes[0]["shards"]) > 8


def _cli(*args):
    return data_main(["pack", "tokens", *map(str, args)])


@pytest.mark.parametrize("case", ["column", "tokenizer-missing", "tokenizer-malformed", "empty", "bad-late",
                                  "not-empty"])
def test_bad_input_is_one_line_exit_2_and_leaves_nothing_behind(case, corpus, tmp_path, tok_file, capsys):
    src, docs = corpus
    out = tmp_path / "out"
    flags = ["--workers", "1", "--memory-mb", "4", "--shard-mb", "0.004", "--block-tokens", "512"]
    tok = tok_file
    column = "text"
    expected = {"column": "no column 'body'", "tokenizer-missing": "no such file",
                "tokenizer-malformed": "not valid JSON", "empty": "an empty corpus",
                "bad-late": "no text field 'text'", "not-empty": "holds a dataset already"}[case]
    if case == "column":
        column = "body"
    elif case == "tokenizer-missing":
        tok = tmp_path / "nope.json"
    elif case == "tokenizer-malformed":
        tok = tmp_path / "bad.json"
        tok.write_text("{")
    elif case == "empty":
        src = tmp_path / "empty"
        _parquet(src / "a.parquet", ["", ""])
    elif case == "bad-late":  # the error comes after several shards were written
        src = tmp_path / "late"
        src.mkdir()
        (src / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs)
                                     + json.dumps({"body": "x"}) + "\n")
    elif case == "not-empty":
        _pack(corpus[0], out, tok_file)
        before = sorted(p.name for p in out.iterdir())
    capsys.readouterr()
    assert _cli("--src", src, "--column", column, "--tokenizer", tok, "--out", out, *flags) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1, err
    if case == "not-empty":
        assert sorted(p.name for p in out.iterdir()) == before  # the dataset there is untouched
    else:
        assert not out.exists() or not any(out.iterdir()), list(out.iterdir())


def test_memory_too_small_for_the_shards_is_refused_before_anything_is_read(tmp_path, tok_file):
    with pytest.raises(BadInput, match=r"--memory-mb 4 is too small .* needs at least \d+ MB"):
        _pack(tmp_path / "nowhere", tmp_path / "out", tok_file, memory_mb=4, shard_mb=8)


# ---- reading token shards --------------------------------------------------------------------------
class CountingStore:
    """A store that counts the bytes each ranged read returns."""

    def __init__(self, store):
        self.store, self.read = store, 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def get_range(self, key, start, end):
        data = self.store.get_range(key, start, end)
        self.read += len(data)
        return data


@pytest.fixture(scope="module")
def token_set(tmp_path_factory):
    """23 blocks of 100 tokens (the last shorter): token i is i % 65521, so every window says where it
    came from."""
    uri = tmp_path_factory.mktemp("tokens") / "ds"
    store = open_store(str(uri))
    store.check(create=True)
    all_tokens = (np.arange(2250) % 65521).astype(np.uint16)
    entries = []
    for i, part in enumerate(np.split(all_tokens, [1000, 2000])):
        data, entry = tokens.shard_entry(tokens.shard_name(i), part, 100)
        store.put(entry["name"], data)
        entries.append(entry)
    index = {"format": tokens.FORMAT, "kind": "tokens", "dtype": "uint16", "vocab_size": 65521,
             "eod_token": 0, "block_tokens": 100, "tokens": 2250, "documents": 1, "shards": entries}
    store.put(tokens.INDEX, json.dumps(index).encode())
    return str(uri)


def _stream(uri, world, rank, position, seq_len=9, batch=4, seed=5, readahead=2):
    view = tokens.open_dataset(uri, None).windows(seq_len)
    return tokens.WindowStream(view, seed, batch, rank, world, position, readahead=readahead)


def _take(stream, n):
    out = []
    for batch, position in stream:
        out.append((batch, position))
        if len(out) == n:
            break
    stream.close()
    return out


def test_windows_are_seq_len_plus_one_tokens_inside_a_block(token_set):
    view = tokens.open_dataset(token_set, None).windows(9)
    assert [s["samples"] for s in view.shards] == [11] * 22 + [5]  # (100 - 1) // 9; (50 - 1) // 9
    w = view.windows(3)
    assert w.shape == (11, 10) and w[0, 0] == 300 and w[1, 0] == 309 and w[10, -1] == 399


def test_a_resumed_stream_reads_what_the_uninterrupted_one_reads(token_set):
    for rank in (0, 1):
        whole = [b for b, _ in _take(_stream(token_set, 2, rank, None), 60)]  # past an epoch's end
        head = _take(_stream(token_set, 2, rank, None), 17)
        tail = [b for b, _ in _take(_stream(token_set, 2, rank, head[-1][1]), 43)]
        assert all(np.array_equal(a, b) for a, b in zip(whole, [b for b, _ in head] + tail, strict=True))


def test_reading_each_block_inline_gives_the_read_ahead_batches_on_no_thread(token_set):
    for rank in (0, 1):
        inline, threads, before = [], set(), set(threading.enumerate())
        for batch, position in _stream(token_set, 2, rank, None, readahead=0):
            threads |= set(threading.enumerate()) - before
            inline.append((batch, position))
            if len(inline) == 60:
                break
        assert not threads, threads
        ahead = _take(_stream(token_set, 2, rank, None), 60)  # past an epoch's end
        assert [p for _, p in inline] == [p for _, p in ahead]
        assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(inline, ahead, strict=True))
        assert len({id(b) for b, _ in inline}) == 60  # a new array each time: the consumer may keep it


def test_after_a_world_size_change_the_epoch_is_read_once_without_gaps_or_repeats(token_set):
    view = tokens.open_dataset(token_set, None).windows(9)
    windows = sum(s["samples"] for s in view.shards)
    seen = Counter()
    first = [_take(_stream(token_set, 2, r, None), 10) for r in range(2)]
    for per_rank in first:
        seen.update(int(b[0]) for batch, _ in per_rank for b in batch)
    position = first[0][-1][1]
    assert position == first[1][-1][1]  # every rank holds the same position
    steps_left = tokens.Plan.from_state(position, 2).for_world(view, 5, 4, 3).length(view, 5, 4)
    for r in range(3):
        for batch, _ in _take(_stream(token_set, 3, r, position), steps_left):
            seen.update(int(b[0]) for b in batch)
    assert max(seen.values()) == 1  # each window (by its first token) once
    assert windows - len(seen) < 3 * 4 + 2 * 4  # what is left is less than a batch per worker, per plan


def test_each_worker_reads_only_its_own_blocks_by_range(token_set):
    reads = []
    for rank in range(2):
        stream = _stream(token_set, 2, rank, None)
        counting = CountingStore(stream.view.ds.store)
        stream.view.ds.__dict__["store"] = counting
        _take(stream, 5)  # 20 windows: about two blocks, and the read-ahead's
        reads.append(counting.read)
    total = 2250 * 2
    assert all(200 <= r <= 6 * 200 for r in reads) and sum(reads) < total, reads


def test_a_block_that_fails_its_checksum_is_bad_input_naming_the_shard(token_set, tmp_path):
    import shutil

    uri = tmp_path / "ds"
    shutil.copytree(token_set, uri)
    shard = uri / "tokens-00001.bin"
    data = bytearray(shard.read_bytes())
    data[250] ^= 1  # block 1 of shard 1
    shard.write_bytes(bytes(data))
    ds = tokens.open_dataset(str(uri), None)
    ds.read_block(10)  # block 0 of shard 1 is intact
    with pytest.raises(BadInput, match=r"tokens-00001.bin block 1 \(tokens 100..200\) fails its xxh3_128"):
        ds.read_block(11)


def test_a_dataset_that_is_not_token_shards_is_refused(tmp_path):
    (tmp_path / "index.json").write_text(json.dumps({"format": "ringtrain-wds/1", "shards": [{}]}))
    with pytest.raises(BadInput, match="expected 'ringtrain-tokens/1'"):
        tokens.open_dataset(str(tmp_path), None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match="index.json not found"):
        tokens.open_dataset(str(tmp_path / "empty"), None)


def _stream_peak_rss_kb(uri: Path, seq: int, batch: int, steps: int) -> int:
    """The peak resident memory of a process that takes `steps` batches from the lm task's stream.
    VmHWM, the peak of this process's own memory: ru_maxrss is carried across execve from the forking
    process (getrusage(2)), here pytest's. The stream alone, not the trainer: a model step's memory
    swings by tens of MB from run to run and hides what the stream holds."""
    code = ("import itertools; from train import tokens; "
            f"view = tokens.open_dataset({str(uri)!r}, None).windows({seq}); "
            f"s = tokens.WindowStream(view, 0, {batch}, 0, 1, None, readahead=2); "
            f"n = sum(1 for _ in itertools.islice(s, {steps})); s.close(); "
            "print('BATCHES', n, 'PEAK_RSS_KB', next(ln.split()[1] for ln in open('/proc/self/status') "
            "if ln.startswith('VmHWM')), flush=True)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    _, n, _, peak = r.stdout.split()
    assert int(n) == steps
    return int(peak)


def test_the_streams_memory_does_not_grow_with_the_number_of_blocks(tmp_path):
    # 10 and 100 blocks of 0.64 MB (160 k uint32 tokens, 627 windows of 255 + 1), a block a batch, each
    # read once: the 100-block run reads 64 MB it could not keep (every block it read, or the shard
    # whole) without showing it.
    rng = np.random.default_rng(0)
    block, seq, windows = 160_000, 255, 627
    peaks = {}
    for n in (10, 100):
        uri = tmp_path / f"s{n}"
        uri.mkdir()
        values = rng.integers(0, 16, n * block, dtype=np.uint32)
        data, entry = tokens.shard_entry(tokens.shard_name(0), values, block)
        (uri / entry["name"]).write_bytes(data)
        (uri / tokens.INDEX).write_text(json.dumps({
            "format": tokens.FORMAT, "kind": "tokens", "dtype": "uint32", "vocab_size": 16, "eod_token": 0,
            "block_tokens": block, "tokens": n * block, "documents": n, "shards": [entry]}))
        peaks[n] = _stream_peak_rss_kb(uri, seq, windows, steps=n)   # each block once
    # Streaming holds the block being read, two read ahead and the one being consumed (~4 x 0.64 MB, plus
    # their windows as a batch); the margin, 16 MB, is under a third of what holding the 90 extra blocks'
    # 57.6 MB would add.
    assert peaks[100] - peaks[10] < 16_000, peaks
