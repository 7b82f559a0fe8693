"""Datasets and checkpoints on a local directory and on a real S3-compatible server (moto on loopback)."""

from __future__ import annotations

import hashlib
import io
import json
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from cluster.local.objectstore import LOCAL_CREDENTIALS, ObjectStore, free_port
from train import data as data_mod
from train.checkpoint import store as ckpt
from train.errors import BadInput
from train.storage import LocalStore, open_store


@pytest.fixture
def s3_env(object_store, monkeypatch):
    for k, v in LOCAL_CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    return object_store.endpoint_url


def test_dataset_round_trip_on_s3_and_labels_follow_the_teacher(s3_env, s3_bucket):
    uri = f"s3://{s3_bucket}/datasets/toy"
    index = data_mod.generate(uri, shards=3, samples_per_shard=20, seed=7, endpoint_url=s3_env)
    assert [s["name"] for s in index["shards"]] == ["shard-00000.npz", "shard-00001.npz", "shard-00002.npz"]
    ds = data_mod.load(uri, s3_env)
    assert ds.x.shape == (60, *data_mod.INPUT_SHAPE) and ds.y.shape == (60,)
    w = data_mod.teacher_weights(7)
    assert np.array_equal(np.argmax(ds.x.numpy().reshape(60, -1) @ w, axis=1), ds.y.numpy())


def test_missing_and_corrupt_datasets_are_bad_input(tmp_path):
    with pytest.raises(BadInput, match="no such directory"):
        data_mod.load(str(tmp_path / "nope"))
    with pytest.raises(BadInput, match="index.json not found"):
        data_mod.load(str(tmp_path))
    data_mod.generate(str(tmp_path), shards=2, samples_per_shard=8, seed=0)
    (tmp_path / "shard-00001.npz").write_bytes(b"garbage")
    with pytest.raises(BadInput, match="shard-00001.npz fails its xxh3_128 check"):
        data_mod.load(str(tmp_path))


def test_unreachable_endpoint_is_one_clear_error_quickly(monkeypatch):
    for k, v in LOCAL_CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    dead = f"http://127.0.0.1:{free_port()}"
    import time

    t0 = time.monotonic()
    with pytest.raises(BadInput, match="cannot reach the S3 endpoint"):
        data_mod.load("s3://bucket/ds", dead)
    assert time.monotonic() - t0 < 30


def test_missing_bucket_is_bad_input(s3_env):
    with pytest.raises(BadInput, match="bucket 'no-such-bucket-xyz' does not exist"):
        open_store("s3://no-such-bucket-xyz/ck", s3_env).check(create=True)


def test_rejected_credentials_are_bad_input(monkeypatch):
    # A second server that enforces IAM auth: any key it does not know is refused.
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "0")
    with ObjectStore() as strict:
        monkeypatch.delenv("INITIAL_NO_AUTH_ACTION_COUNT")
        for k, v in LOCAL_CREDENTIALS.items():
            monkeypatch.setenv(k, v)
        with pytest.raises(BadInput, match="S3 rejected the credentials"):
            open_store("s3://some-bucket/ck", strict.endpoint_url).check(create=True)


def _state(step: int) -> dict:
    return {"step": step, "w": torch.full((3,), float(step))}


def _saved(state: dict) -> bytes:
    buf = io.BytesIO()
    ckpt.save(state, buf)
    return buf.getvalue()


@pytest.fixture(params=["local", "s3"])
def checkpoints(request, tmp_path):
    if request.param == "local":
        return ckpt.CheckpointStore(open_store(str(tmp_path / "ck")), keep=2)
    env = request.getfixturevalue("s3_env")
    bucket = request.getfixturevalue("s3_bucket")
    return ckpt.CheckpointStore(open_store(f"s3://{bucket}/checkpoints/job", env), keep=2)


def test_newest_valid_checkpoint_wins_and_only_the_last_n_are_kept(checkpoints):
    assert checkpoints.latest_valid() is None
    for step in (10, 20, 30):
        checkpoints.write(step, _state(step))
    assert checkpoints.valid_steps() == [10, 20, 30]  # write() leaves them to prune()
    checkpoints.prune()
    assert checkpoints.valid_steps() == [20, 30]
    assert not any(k.startswith("step-000000010/") for k in checkpoints.store.list())
    found = checkpoints.latest_valid()
    assert found.step == 30 and torch.equal(found.state["w"], torch.full((3,), 30.0))


def test_a_checkpoint_costs_two_puts_and_at_most_one_batch_delete(checkpoints, monkeypatch):
    """The writer lists once; after that each checkpoint is its two objects (the state streamed, the
    manifest put) and, once `keep` are there, its prune one delete_many of the oldest (every request is
    client CPU on the training node)."""
    checkpoints.store.put("step-000000005/state.pt", b"a leftover from a killed run")
    calls = []
    for name in ("put", "upload", "list", "delete", "delete_many"):
        real = getattr(checkpoints.store, name)
        monkeypatch.setattr(checkpoints.store, name,
                            lambda *a, _name=name, _real=real, **kw: (
                                calls.append((_name, a[0] if a else "")), _real(*a, **kw))[1])
    checkpoints.write(10, _state(10))
    checkpoints.prune()
    assert [c[0] for c in calls] == ["list", "upload", "put"]
    calls.clear()
    for step in (20, 30):
        checkpoints.write(step, _state(step))
        checkpoints.prune()
    names = [c[0] for c in calls]
    assert names[:5] == ["upload", "put", "upload", "put", "delete_many"]
    assert set(names[5:]) <= {"delete"}  # a local directory's delete_many deletes file by file
    assert checkpoints.valid_steps() == [20, 30]
    # The leftover (older than every kept checkpoint) went with checkpoint 10, manifests first.
    assert not any(k.startswith(("step-000000005/", "step-000000010/")) for k in checkpoints.store.list())
    calls.clear()
    checkpoints.write(30, _saved(_state(30)))  # the same step again (a resumed run's redo)
    assert [c[0] for c in calls][:2] == ["delete", "upload"]  # its old manifest goes first
    assert checkpoints.latest_valid().step == 30


def _latest_valid_and_warnings(checkpoints) -> tuple[ckpt.Found | None, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = checkpoints.latest_valid()
    return found, [str(w.message) for w in caught]


def test_partial_and_corrupt_checkpoints_are_skipped_with_a_warning(checkpoints):
    checkpoints.write(10, _state(10))
    checkpoints.write(20, _state(20))
    # A write killed before its manifest: objects only.
    checkpoints.store.put("step-000000030/state.pt", _saved(_state(30)))
    # A corrupt newest-but-one: bytes changed after the manifest was written.
    checkpoints.store.put("step-000000020/state.pt", b"flipped bits")
    found, messages = _latest_valid_and_warnings(checkpoints)
    assert found.step == 10
    assert any("step-000000030: no manifest" in m for m in messages)
    assert any("step-000000020: state.pt fails its xxh3_128 check" in m for m in messages)


def test_a_checkpoint_whose_state_is_missing_or_empty_is_skipped_with_a_warning(checkpoints):
    checkpoints.write(10, _state(10))
    manifest = json.loads(checkpoints.store.get("step-000000010/manifest.json"))
    for step in (40, 50):  # manifests that name a state never written, or written empty
        body = json.dumps({**manifest, "step": step}).encode()
        checkpoints.store.put(f"{ckpt.step_dir(step)}/manifest.json", body)
    checkpoints.store.put("step-000000050/state.pt", b"")
    found, messages = _latest_valid_and_warnings(checkpoints)
    assert found.step == 10
    assert any("step-000000050/state.pt is empty" in m for m in messages), messages
    assert any("step-000000040: state.pt missing" in m for m in messages), messages


def test_a_manifest_of_the_wrong_shape_is_skipped_with_a_warning(checkpoints):
    """A manifest that parses but is not the object it should be (a list, `objects: null`, an entry
    that is not an object, a write rate that is not a number) is a corrupt checkpoint like any other."""
    checkpoints.write(10, _state(10))
    manifest = json.loads(checkpoints.store.get("step-000000010/manifest.json"))
    data = _saved(_state(10))
    bad = {
        20: ["not", "a", "manifest"],
        30: {**manifest, "step": 30, "objects": None},
        40: {**manifest, "step": 40, "objects": ["state.pt"]},
        50: {**manifest, "step": 50, "objects": {"state.pt": "0" * 32}},
        60: {**manifest, "step": 60, "write_bytes_per_s": "fast"},
    }
    for step, body in bad.items():
        checkpoints.store.put(f"{ckpt.step_dir(step)}/state.pt", data)
        checkpoints.store.put(f"{ckpt.step_dir(step)}/manifest.json", json.dumps(body).encode())
    found, messages = _latest_valid_and_warnings(checkpoints)
    assert found.step == 10
    prefix = f"skipping checkpoint {checkpoints.store.uri}/"
    assert sorted(messages) == [
        prefix + "step-000000020: the manifest is a list, not an object",
        prefix + "step-000000030: the manifest's objects is null, not an object",
        prefix + "step-000000040: the manifest's objects is a list, not an object",
        prefix + "step-000000050: the manifest's objects.state.pt is a string, not an object",
        prefix + "step-000000060: the manifest's write_bytes_per_s is a string, not a number",
    ], messages


def _mapping_of(tensor: torch.Tensor) -> str:
    """The name of the memory mapping that holds `tensor`'s bytes ('' for anonymous memory)."""
    address = tensor.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, _perms, _offset, _dev, _inode, *name = line.split(maxsplit=5)
        start, end = (int(x, 16) for x in span.split("-"))
        if start <= address < end:
            return name[0] if name else ""
    raise AssertionError(f"no mapping holds address {address:#x}")


def test_a_restored_state_maps_the_checked_bytes_instead_of_copying_them(checkpoints, tmp_path):
    """torch.load copied a mapped checkpoint twice (its read(), then the tensor's storage), a third
    of a 1 GB restore here; now the tensors use the pages the checksum was computed over: a local
    store's file, or the in-memory file (memfd) an S3 object was fetched into."""
    state = _big_state(6)
    checkpoints.write(1, state)
    found = checkpoints.latest_valid()
    assert torch.equal(found.state["w"], state["w"])
    where = _mapping_of(found.state["w"])
    if isinstance(checkpoints.store, LocalStore):
        assert where == str(tmp_path / "ck" / "step-000000001" / "state.pt")
    else:
        assert where.startswith("/memfd:ringtrain-") and where.endswith("state.pt (deleted)"), where


def test_manifest_is_written_last(tmp_path, monkeypatch):
    store = open_store(str(tmp_path))
    order = []
    real_put, real_upload = store.put, store.upload
    monkeypatch.setattr(store, "put", lambda key, data: (order.append(key), real_put(key, data)))
    monkeypatch.setattr(store, "upload",
                        lambda key, src, **kw: (order.append(key), real_upload(key, src, **kw)))
    ckpt.CheckpointStore(store, keep=1).write(5, _state(5))
    assert order == ["step-000000005/state.pt", "step-000000005/manifest.json"]
    manifest = json.loads((tmp_path / "step-000000005" / "manifest.json").read_text())
    assert manifest["step"] == 5 and len(manifest["objects"]["state.pt"]["xxh3_128"]) == 32


def test_a_checkpoint_checked_by_sha256_still_restores_and_one_without_a_checksum_is_skipped(checkpoints):
    """Manifests written before the checksum became XXH3-128 carry a sha256; their checkpoints stay
    resumable. A manifest with neither is not a checkpoint."""
    checkpoints.write(10, _state(10))
    data = _saved(_state(20))
    checkpoints.store.put("step-000000020/state.pt", data)
    manifest = json.loads(checkpoints.store.get("step-000000010/manifest.json"))
    manifest["step"] = 20
    manifest["objects"]["state.pt"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    checkpoints.store.put("step-000000020/manifest.json", json.dumps(manifest).encode())
    found, messages = _latest_valid_and_warnings(checkpoints)
    assert found.step == 20 and torch.equal(found.state["w"], torch.full((3,), 20.0)) and not messages
    manifest["step"] = 30
    manifest["objects"]["state.pt"] = {"md5": "0" * 32, "bytes": len(data)}
    checkpoints.store.put("step-000000030/state.pt", data)
    checkpoints.store.put("step-000000030/manifest.json", json.dumps(manifest).encode())
    found, messages = _latest_valid_and_warnings(checkpoints)
    assert found.step == 20
    assert messages == [f"skipping checkpoint {checkpoints.store.uri}/step-000000030: state.pt has no "
                        "checksum we know (xxh3_128 or sha256)"]


def test_generator_cli_writes_a_dataset_and_refuses_bad_sizes(tmp_path, capsys):
    out = tmp_path / "ds"
    assert data_mod.main(["generate", "--out", str(out), "--shards", "2", "--samples-per-shard", "16"]) == 0
    assert "wrote 32 samples in 2 shards" in capsys.readouterr().out
    assert json.loads((out / "index.json").read_text())["samples"] == 32
    assert data_mod.main(["generate", "--out", str(tmp_path / "x"), "--shards", "0"]) == 2
    assert "--shards 0 --samples-per-shard 1024: both must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # nothing half-created


def test_uploads_make_no_extra_pass_over_the_bytes(s3_env, s3_bucket):
    """Checkpoints are verified by their manifest's checksum; botocore's default CRC32 and its SigV4
    payload sha256 would each be one more pass over every upload on the training node. The upload
    still reaches the store whole, under signed headers."""
    store = open_store(f"s3://{s3_bucket}/ck", s3_env)
    sent = []
    store._client.meta.events.register("before-send.s3.PutObject",
                                       lambda request, **_: sent.append(dict(request.headers)))
    store.put("blob", b"x" * 4096)
    assert store.get("blob") == b"x" * 4096
    headers = {k.lower(): v for k, v in sent[0].items()}
    assert headers["x-amz-content-sha256"] in ("UNSIGNED-PAYLOAD", b"UNSIGNED-PAYLOAD")
    assert not any(k.startswith("x-amz-checksum-") or k == "x-amz-sdk-checksum-algorithm" for k in headers)
    assert "authorization" in headers


def test_serialization_skips_the_zip_crc_pass_and_leaves_torch_config_alone():
    """The manifest's checksum covers the whole state.pt, so torch.save's per-record CRC32 is one pass
    over the bytes too many; the setting is only changed for our own save."""
    import zipfile

    import torch.utils.serialization as torch_serialization

    state = {"w": torch.arange(1000.0), "step": 3}
    data = _saved(state)
    records = {i.filename.split("/", 1)[1]: i.CRC for i in zipfile.ZipFile(io.BytesIO(data)).infolist()}
    assert records["data/0"] == 0  # with the CRC pass it is the record's CRC32, never 0 for this tensor
    loaded = ckpt.load(io.BytesIO(data))
    assert loaded["step"] == 3 and torch.equal(loaded["w"], state["w"])
    assert torch_serialization.config.save.compute_crc32 is True


def _big_state(mib: int) -> dict:
    g = torch.Generator().manual_seed(mib)
    return {"step": 1, "w": torch.rand(mib << 18, generator=g), "small": torch.ones(3)}  # mib MiB of float32


def _count_requests(store, operation: str, calls: list) -> None:
    def record(request, **_) -> None:  # (a handler that returns something replaces the response)
        calls.append(dict(request.headers))

    store._client.meta.events.register(f"before-send.s3.{operation}", record)


def test_a_checkpoint_goes_up_in_parallel_parts_and_comes_back_in_ranged_gets(s3_env, s3_bucket, monkeypatch):
    """Multipart with 5 MiB parts (S3's smallest) through boto3's transfer manager; the restore is
    ranged GETs; nothing is left half-uploaded."""
    monkeypatch.setenv("RINGTRAIN_S3_PART_MIB", "5")
    store = open_store(f"s3://{s3_bucket}/ck", s3_env)
    parts, puts, gets = [], [], []
    _count_requests(store, "UploadPart", parts)
    _count_requests(store, "PutObject", puts)
    _count_requests(store, "GetObject", gets)
    checkpoints = ckpt.CheckpointStore(store, keep=1)
    state = _big_state(13)
    nbytes = checkpoints.write(1, state)
    assert nbytes > 13 << 20 and len(parts) == 3  # 5 + 5 + the rest
    assert len(puts) == 1  # the manifest only
    found = checkpoints.latest_valid()
    assert torch.equal(found.state["w"], state["w"]) and torch.equal(found.state["small"], state["small"])
    ranges = sorted(h["Range"] for h in gets if "Range" in h)
    assert len(ranges) == 3, gets
    assert "Uploads" not in store._client.list_multipart_uploads(Bucket=s3_bucket)


def test_a_part_size_s3_refuses_is_bad_input(monkeypatch):
    monkeypatch.setenv("RINGTRAIN_S3_PART_MIB", "4")
    with pytest.raises(BadInput, match="RINGTRAIN_S3_PART_MIB='4': S3 multipart parts are 5 to 5120 MiB"):
        open_store("s3://b/ck", "http://127.0.0.1:9")


def test_an_aborted_write_leaves_no_manifest_and_no_parts_and_the_next_one_is_written(s3_env, s3_bucket,
                                                                                     monkeypatch):
    monkeypatch.setenv("RINGTRAIN_S3_PART_MIB", "5")
    store = open_store(f"s3://{s3_bucket}/ck", s3_env)
    checkpoints = ckpt.CheckpointStore(store, keep=3)
    cancelled = threading.Event()
    parts: list = []


    def on_part(request, **_) -> None:  # the abort comes while the upload is under way
        parts.append(1)
        if len(parts) == 2:
            cancelled.set()

    store._client.meta.events.register("before-send.s3.UploadPart", on_part)
    with pytest.raises(ckpt.WriteCancelled):
        checkpoints.write(1, _big_state(100), cancelled)
    # Stopped part-way: s3transfer reads at most 10 parts ahead of the uploads; the whole is 20 parts.
    assert 2 <= len(parts) < 20
    assert "Uploads" not in store._client.list_multipart_uploads(Bucket=s3_bucket)
    assert store.list() == []
    checkpoints.write(2, _big_state(6))
    assert checkpoints.valid_steps() == [2]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_state_that_does_not_serialize_stores_nothing(where, tmp_path, request):
    if where == "local":
        store = open_store(str(tmp_path / "ck"))
    else:
        bucket, endpoint = request.getfixturevalue("s3_bucket"), request.getfixturevalue("s3_env")
        store = open_store(f"s3://{bucket}/ck", endpoint)
    checkpoints = ckpt.CheckpointStore(store, keep=1)
    with pytest.raises(Exception, match="lambda|pickle"):
        checkpoints.write(1, {"w": torch.ones(3), "f": lambda: 0})
    assert store.list() == []
    if where == "local":
        assert not any(p.is_file() for p in (tmp_path / "ck").rglob("*"))  # no temporary file either
    else:
        assert "Uploads" not in store._client.list_multipart_uploads(Bucket=store.bucket)


def test_a_local_write_never_holds_the_whole_state_in_memory(tmp_path):
    """The state streams through a pipe in chunks: the writer never builds torch.save's bytes whole
    (BytesIO + getvalue held two copies of a state before)."""
    import tracemalloc

    checkpoints = ckpt.CheckpointStore(open_store(str(tmp_path)), keep=1)
    state = _big_state(40)
    tracemalloc.start()
    try:
        checkpoints.write(1, state)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 << 20, f"peak {peak / 2**20:.0f} MiB for a 40 MiB state"
    assert torch.equal(checkpoints.latest_valid().state["w"], state["w"])


def test_parts_grow_where_a_state_would_need_more_than_s3_allows(monkeypatch):
    monkeypatch.delenv("RINGTRAIN_S3_PART_MIB", raising=False)
    store = open_store("s3://b/ck", "http://127.0.0.1:9")
    assert store.part_size() == store.part_size(10 << 30) == 16 << 20  # 640 parts of 16 MiB
    big = store.part_size(1 << 40)  # 1 TiB: 16 MiB parts would be 65,536 of them
    assert big % (1 << 20) == 0 and (1 << 40) / big <= 9_000
    state = {"a": torch.ones(10), "tied": [torch.ones(10)], "b": torch.ones(4, dtype=torch.float16)}
    state["again"] = state["a"]
    assert ckpt.tensor_bytes(state) == 40 + 40 + 8
