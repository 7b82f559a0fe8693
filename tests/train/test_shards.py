"""Sharded datasets (train.shards, train.pack): packing, checksums, each worker's share, deterministic
and elastic resume, the read-ahead bound."""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter

import pytest
import xxhash

from cluster.example_data import main as example_data_main
from cluster.local.objectstore import LOCAL_CREDENTIALS
from train import shards
from train.data import main as data_main
from train.errors import BadInput


def _samples(n_shards: int, per_shard: int, *, short_last: int = 0) -> list[list[dict]]:
    out = []
    for s in range(n_shards):
        n = per_shard - (short_last if s == n_shards - 1 else 0)
        out.append([{"__key__": f"{s:03d}{i:05d}", "txt": f"{s}:{i}".encode()} for i in range(n)])
    return out


@pytest.fixture
def small_set(tmp_path):
    uri = str(tmp_path / "ds")
    shards.write_dataset(uri, iter(_samples(6, 10, short_last=3)), {"kind": "image", "classes": ["a", "b"]})
    return shards.open_dataset(uri, None, "image")


def _ids(batch) -> list[str]:
    return [s["txt"].decode() for s, _ in batch]


def _take(ds, seed, batch, rank, world, position, steps):
    """`steps` batches of one worker; the position after the last."""
    stream = shards.ShardStream(ds, seed, batch, rank, world, position)
    got, pos = [], position
    for i, (b, after) in enumerate(stream):
        got.append(_ids(b))
        pos = after
        if i + 1 == steps:
            break
    stream.close()
    return got, pos


def test_workers_read_disjoint_shards_and_an_epoch_covers_each_sample_at_most_once(small_set):
    plan = shards.Plan(0, 2, None, 0)
    length = plan.length(small_set, 7, 4)
    seen = Counter()
    shard_of = {}
    for rank in range(2):
        got, pos = _take(small_set, 7, 4, rank, 2, None, length)
        for b in got:
            seen.update(b)
            for sid in b:
                shard_of.setdefault(sid.split(":")[0], set()).add(rank)
        assert pos["epoch"] == 1 and pos["steps"] == 0  # the epoch ended after `length` steps
    assert max(seen.values()) == 1 and len(seen) == 2 * length * 4
    assert all(len(ranks) == 1 for ranks in shard_of.values())  # a shard is read by one worker only


def test_resume_at_the_same_world_size_continues_exactly(small_set):
    straight, _ = _take(small_set, 3, 4, 1, 2, None, 20)  # across epochs
    head, pos = _take(small_set, 3, 4, 1, 2, None, 7)
    json.dumps(pos)  # a checkpoint holds it
    tail, _ = _take(small_set, 3, 4, 1, 2, pos, 13)
    assert head + tail == straight


def test_an_elastic_change_deals_the_unread_samples_to_the_new_workers(small_set):
    seed, batch = 5, 3
    steps_2 = 4
    consumed = []
    positions = []
    for rank in range(2):
        got, pos = _take(small_set, seed, batch, rank, 2, None, steps_2)
        consumed += [s for b in got for s in b]
        positions.append(pos)
    assert positions[0] == positions[1]  # the position does not depend on the rank
    plan3 = shards.Plan.from_state(positions[0], 3).for_world(small_set, seed, batch, 3)
    assert plan3.world == 3 and plan3.epoch == 0
    length3 = plan3.length(small_set, seed, batch)
    rest = []
    for rank in range(3):
        got, pos = _take(small_set, seed, batch, rank, 3, positions[0], length3)
        rest += [s for b in got for s in b]
        assert pos["epoch"] == 1
    assert not set(consumed) & set(rest) and len(set(rest)) == len(rest)
    unread = sum(e - s for segs in plan3.segments for _, s, e in segs)
    assert len(rest) >= unread - 3 * batch  # only the tails that cannot fill a batch are dropped


def test_a_missing_or_corrupt_shard_is_one_clear_error_naming_it(tmp_path):
    uri = tmp_path / "ds"
    shards.write_dataset(str(uri), iter(_samples(2, 4)), {"kind": "image", "classes": ["a", "b"]})
    ds = shards.open_dataset(str(uri), None, "image")
    (uri / "shard-00001.tar").write_bytes(b"not a tar")
    with pytest.raises(BadInput, match=r"shard shard-00001.tar fails its xxh3_128 check"):
        ds.read_shard(1)
    # An index written before the checksum became XXH3-128 names a sha256; it still verifies.
    old = dict(ds.shards[0])
    del old["xxh3_128"]
    ds.shards[0] = {**old, "sha256": hashlib.sha256((uri / "shard-00000.tar").read_bytes()).hexdigest()}
    assert len(ds.read_shard(0)) == 4
    ds.shards[0] = {**old, "md5": "0" * 32}
    with pytest.raises(BadInput, match=r"shard-00000.tar has no checksum we know \(xxh3_128 or sha256\)"):
        ds.read_shard(0)
    (uri / "shard-00001.tar").unlink()
    with pytest.raises(BadInput, match=r"shard shard-00001.tar listed in index.json is missing"):
        list(shards.ShardStream(ds, 0, 2, 0, 1, None))
    with pytest.raises(BadInput, match=r"a dataset of 'image' samples; this task reads 'tokens'"):
        shards.open_dataset(str(uri), None, "tokens")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match=r"no dataset at .*empty: index.json not found"):
        shards.open_dataset(str(tmp_path / "empty"), None, "image")


def test_a_dataset_too_small_for_every_worker_to_fill_a_batch_is_refused(small_set):
    shards.check_fits(small_set, 7, 2)  # 3 shards each, the smallest 7 samples
    with pytest.raises(BadInput, match=r"cannot give each of 4 workers a batch of 8"):
        shards.check_fits(small_set, 8, 4)


def test_read_ahead_holds_a_bounded_number_of_shards(small_set):
    stream = shards.ShardStream(small_set, 0, 2, 0, 1, None, readahead=1)
    it = iter(stream)
    next(it)
    time.sleep(0.5)  # the reader runs ahead as far as it may
    assert stream.shards_read <= 3  # the one being consumed, one queued, one waiting to be queued
    stream.close()


def test_pack_digits_to_the_local_store_with_checksums(tmp_path, object_store, s3_bucket,
                                                                monkeypatch):
    for k, v in LOCAL_CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    digits = tmp_path / "digits"
    assert example_data_main(["digits", "--out", str(digits)]) == 0
    assert sorted(p.name for p in digits.iterdir()) == [str(i) for i in range(10)]
    uri, eval_uri = f"s3://{s3_bucket}/digits/train", f"s3://{s3_bucket}/digits/eval"
    assert data_main(["pack", "images", "--src", str(digits), "--out", uri, "--eval-out", eval_uri,
                      "--eval-fraction", "0.1", "--samples-per-shard", "500",
                      "--s3-endpoint-url", object_store.endpoint_url]) == 0
    ds = shards.open_dataset(uri, object_store.endpoint_url, "image")
    ev = shards.open_dataset(eval_uri, object_store.endpoint_url, "image")
    assert ds.index["samples"] + ev.index["samples"] == 1797 and ev.index["samples"] == 180
    assert [s["samples"] for s in ds.shards] == [500, 500, 500, 117]
    client = object_store.client()
    body = client.get_object(Bucket=s3_bucket, Key="digits/train/shard-00003.tar")["Body"].read()
    assert xxhash.xxh3_128(body).hexdigest() == ds.shards[3]["xxh3_128"]
    labels = Counter(int(s["cls"]) for s in ds.read_shard(0))
    assert len(labels) == 10  # shuffled before sharding: every shard mixes the classes
    assert data_main(["pack", "images", "--src", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
