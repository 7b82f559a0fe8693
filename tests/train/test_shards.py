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


def _edit_index(uri, **changes) -> None:
    path = uri / "index.json"
    index = json.loads(path.read_text())
    for key, value in changes.items():
        if key.startswith("shard0_"):
            index["shards"][0][key[len("shard0_"):]] = value
        else:
            index[key] = value
    path.write_text(json.dumps(index))


@pytest.mark.parametrize(("change", "message"), [
    ({"samples": "many"}, r'"samples" is \'many\'; expected a whole number >= 0'),
    ({"shards": {"a": 1}}, r'"shards" is a dict; expected a list'),
    ({"shard0_samples": "4"}, r'shards\[0\] \(shard-00000.tar\): "samples" is \'4\''),
    ({"samples": 9}, r'"samples" is 9, but the shards hold 8'),
    ({"classes": "ab"}, r'"classes" is \'ab\'; expected a list of at least 2 class names'),
])
def test_an_index_with_wrong_types_is_one_line_naming_the_field(tmp_path, capsys, change, message):
    uri = tmp_path / "ds"
    shards.write_dataset(str(uri), iter(_samples(2, 4)), {"kind": "image", "classes": ["a", "b"]})
    _edit_index(uri, **change)
    with pytest.raises(BadInput, match=message) as raised:
        shards.open_dataset(str(uri), None, "image")
    assert "\n" not in str(raised.value) and str(raised.value).startswith(f"{uri}/index.json: ")


@pytest.mark.parametrize("name", ["../outside.tar", "/etc/passwd", "a/../../b.tar", ".hidden.tar",
                                  "s3://other/x.tar", "a\\..\\b.tar", 7])
def test_shard_names_that_leave_the_dataset_are_refused(tmp_path, name):
    (tmp_path / "outside.tar").write_bytes(b"")
    uri = tmp_path / "ds"
    shards.write_dataset(str(uri), iter(_samples(2, 4)), {"kind": "image", "classes": ["a", "b"]})
    _edit_index(uri, shard0_name=name)
    with pytest.raises(BadInput, match=r"shards\[0\]: .*(leaves the dataset|must be a string)"):
        shards.open_dataset(str(uri), None, "image")
    _edit_index(uri, shard0_name="sub/shard-00000.tar")  # a plain relative path stays allowed
    assert shards.open_dataset(str(uri), None, "image").shards[0]["name"] == "sub/shard-00000.tar"


def test_pack_images_refuses_undecodable_files_and_names_them(tmp_path, capsys):
    from PIL import Image

    src = tmp_path / "src"
    for c in ("a", "b"):
        (src / c).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (64, 48), (i * 40, 10, 200)).save(src / c / f"{i}.jpg", quality=90)
    good = (src / "a" / "0.jpg").read_bytes()
    (src / "a" / "1.jpg").write_bytes(good[: len(good) // 2])  # truncated
    (src / "b" / "2.png").write_bytes(b"not a png at all")
    out = tmp_path / "out"
    assert data_main(["pack", "images", "--src", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "2 of 7 images cannot be decoded, nothing was written" in err
    assert f"{src / 'a' / '1.jpg'} (" in err and f"{src / 'b' / '2.png'} (" in err
    assert not out.exists() or not any(out.iterdir())
    (src / "a" / "1.jpg").unlink()
    (src / "b" / "2.png").unlink()
    assert data_main(["pack", "images", "--src", str(src), "--out", str(out)]) == 0


def _rank_batches(ds, seed, batch, rank, ranks, loaders, shuffle, position, n):
    """A rank's first `n` batches and its positions, as its DataLoader delivers them: `loaders`
    worker streams, taken in turn from DataLoader worker 0 on; the training process counts positions."""
    plan = shards.Plan.from_state(position, ranks, loaders, shuffle).for_world(ds, seed, batch, ranks,
                                                                              loaders, shuffle)
    streams = [iter(shards.WorkerStream(ds, seed, batch, plan, plan.worker_for(rank, w)))
               for w in range(loaders)]
    positions = shards.RankPositions(ds, seed, batch, plan)
    got, pos = [], position
    for i in range(n):
        got.append(_ids(next(streams[i % loaders])))
        pos = positions.advance()
    return got, pos


@pytest.fixture
def wide_set(tmp_path):
    uri = str(tmp_path / "wide")
    shards.write_dataset(uri, iter(_samples(16, 12, short_last=2)), {"kind": "image", "classes": ["a", "b"]})
    return shards.open_dataset(uri, None, "image")


def test_loader_workers_read_their_own_shards_and_a_shuffle_mixes_across_them(wide_set):
    ds, seed, batch = wide_set, 11, 4
    plan = shards.Plan.from_state(None, 2, 2, 20)
    per_rank = plan.rank_length(ds, seed, batch)
    seen, shard_workers = Counter(), {}
    for rank in range(2):
        got, pos = _rank_batches(ds, seed, batch, rank, 2, 2, 20, None, per_rank)
        assert pos["epoch"] == 1 and pos["steps"] == 0
        for i, b in enumerate(got):
            seen.update(b)
            for sid in b:
                shard_workers.setdefault(sid.split(":")[0], set()).add((rank, i % 2))
    assert max(seen.values()) == 1 and len(seen) == 2 * per_rank * batch
    assert all(len(w) == 1 for w in shard_workers.values())  # each shard: one loader worker of one rank
    # a block of 20 spans shards: most batches mix shards; without the shuffle each comes from one or two
    first, _ = _rank_batches(ds, seed, batch, 0, 2, 2, 20, None, 4)
    assert sum(len({s.split(":")[0] for s in b}) > 1 for b in first) >= 3
    # a fresh shard order each epoch
    epoch1 = shards.Plan(1, 4, None, 0, 2, 20).rank_segments(ds, seed, 0)
    assert [s for s, *_ in epoch1] != [s for s, *_ in plan.rank_segments(ds, seed, 0)]


@pytest.mark.parametrize("shuffle", [0, 20])
def test_resume_with_several_loader_workers_continues_exactly(wide_set, shuffle):
    for stop in (3, 5, 8):  # mid-block, odd (the other loader worker's turn), across an epoch
        straight, _ = _rank_batches(wide_set, 3, 4, 1, 2, 2, shuffle, None, 20)
        head, pos = _rank_batches(wide_set, 3, 4, 1, 2, 2, shuffle, None, stop)
        json.dumps(pos)
        tail, _ = _rank_batches(wide_set, 3, 4, 1, 2, 2, shuffle, pos, 20 - stop)
        assert head + tail == straight


@pytest.mark.parametrize(("before", "after"), [((2, 2), (3, 2)), ((2, 2), (1, 1)), ((1, 2), (2, 3))])
def test_a_world_change_mid_block_deals_every_unread_sample_once(wide_set, before, after):
    ds, seed, batch, shuffle = wide_set, 5, 3, 20
    (ranks, loaders), (ranks2, loaders2) = before, after
    consumed, positions = [], []
    for rank in range(ranks):
        got, pos = _rank_batches(ds, seed, batch, rank, ranks, loaders, shuffle, None, 3)
        consumed += [s for b in got for s in b]
        positions.append(pos)
    assert all(p == positions[0] for p in positions)
    plan = shards.Plan.from_state(positions[0], ranks).for_world(ds, seed, batch, ranks2, loaders2, shuffle)
    assert plan.epoch == 0 and plan.world == ranks2 * loaders2
    unread = sum(e - s for segs in plan.segments for _, s, e in segs)
    assert unread + len(consumed) >= 190 - ranks * loaders * (batch + shuffle)  # tails only
    rest = []
    for rank in range(ranks2):
        got, pos = _rank_batches(ds, seed, batch, rank, ranks2, loaders2, shuffle, positions[0],
                                 plan.rank_length(ds, seed, batch))
        rest += [s for b in got for s in b]
        assert pos["epoch"] == 1
    assert not set(consumed) & set(rest) and len(set(rest)) == len(rest)
    assert len(rest) >= unread - ranks2 * loaders2 * batch  # only the tails that cannot fill a batch


def test_a_resume_with_another_batch_size_reads_every_unread_sample_once(wide_set):
    ds, seed, shuffle = wide_set, 9, 20
    consumed, positions = [], []
    for rank in range(2):
        got, pos = _rank_batches(ds, seed, 4, rank, 2, 2, shuffle, None, 5)
        consumed += [s for b in got for s in b]
        positions.append(pos)
    assert positions[0]["batch"] == 4
    plan = shards.Plan.from_state(positions[0], 2).for_world(ds, seed, 6, 2, 2, shuffle)
    assert plan.epoch == 0 and plan.batch == 6 and plan.segments is not None  # re-dealt, not re-counted
    rest = []
    for rank in range(2):
        got, pos = _rank_batches(ds, seed, 6, rank, 2, 2, shuffle, positions[0],
                                 plan.rank_length(ds, seed, 6))
        rest += [s for b in got for s in b]
        assert pos["epoch"] == 1
    assert not set(consumed) & set(rest) and len(set(rest)) == len(rest)
    assert len(consumed) + len(rest) >= 190 - 4 * (6 + 20)
