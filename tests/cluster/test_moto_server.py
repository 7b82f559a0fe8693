"""The local store's server (cluster/local/moto_server.py): moto's application behind cheroot."""

from __future__ import annotations

import http.client
import os

import moto.backends
import pytest

from cluster.local import moto_server, reaper


def test_moto_lists_its_service_modules_once(monkeypatch):
    # moto 5.2.5 lists its package directory on every request to find the host's service.
    monkeypatch.setattr(moto.backends, "list_of_moto_modules", moto.backends.list_of_moto_modules)
    expected = set(moto.backends.list_of_moto_modules())
    assert "s3" in expected
    moto_server.list_moto_modules_once()

    def no_listing(path):
        raise AssertionError(f"listed {path} again")

    monkeypatch.setattr(os, "listdir", no_listing)
    assert set(moto.backends.list_of_moto_modules()) == expected
    assert "s3" in moto.backends.list_of_moto_modules()


def test_one_connection_serves_many_requests(object_store):
    """werkzeug's development server (python -m moto.server) closes every connection after one
    response: each boto3 request then costs a new connection and a new server thread."""
    conn = http.client.HTTPConnection(object_store.host, object_store.port, timeout=10)
    try:
        sockets = []
        for _ in range(3):
            conn.request("GET", "/", headers={"Host": f"{object_store.host}:{object_store.port}"})
            response = conn.getresponse()
            response.read()
            assert response.status == 200, response.status
            assert (response.getheader("Connection") or "").lower() != "close"
            sockets.append(conn.sock)
        assert sockets[0] is not None and all(s is sockets[0] for s in sockets)
    finally:
        conn.close()


def test_metadata_names_keep_their_underscores(object_store, s3_bucket):
    client, bucket = object_store.client(), s3_bucket
    client.put_object(Bucket=bucket, Key="k", Body=b"x", Metadata={"my_key": "1", "other-key": "2"})
    assert client.head_object(Bucket=bucket, Key="k")["Metadata"] == {"my_key": "1", "other-key": "2"}
    # moto's rule, as its own server applies it: a dashed name wins over the same name underscored.
    for metadata in ({"a_b": "1", "a-b": "2", "c_d": "3"}, {"a-b": "2", "a_b": "1", "c_d": "3"}):
        client.put_object(Bucket=bucket, Key="both", Body=b"x", Metadata=metadata)  # either order
        assert client.head_object(Bucket=bucket, Key="both")["Metadata"] == {"a-b": "2", "c_d": "3"}


def test_the_reaper_recognizes_the_store_process(object_store, tmp_path):
    found = reaper._processes_of(tmp_path, [object_store.host, object_store.port])
    assert object_store.pid in [p.pid for p in found]


def test_a_port_in_use_is_one_clear_error(object_store, capsys):
    assert moto_server.main(["-H", object_store.host, "-p", str(object_store.port)]) == 1
    err = capsys.readouterr().err
    assert f"cannot listen on {object_store.host}:{object_store.port}" in err


@pytest.mark.parametrize("argv", [[], ["-p", "notaport"]])
def test_bad_arguments_exit_non_zero(argv):
    with pytest.raises(SystemExit) as e:
        moto_server.main(argv)
    assert e.value.code == 2


def test_the_local_backend_asks_for_setup_without_the_store_server(monkeypatch):
    import importlib.util

    from cluster.backend import BackendError
    from cluster.cli import check_environment

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "cheroot" else real(name))
    with pytest.raises(BackendError, match=r"missing cheroot: run scripts/setup"):
        check_environment("local")
    check_environment("aws")  # the AWS backend runs no local store


def test_a_ranged_get_reads_its_range_only(monkeypatch):
    """moto 5.2.5 reads a whole object for every ranged GET (S3Response.get_object returns
    key.value): a restore's 16 MiB ranges of a 4 GB checkpoint were 256 reads of 4 GB."""
    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response
    from werkzeug.test import Client

    monkeypatch.setattr(S3Response, "get_object", S3Response.get_object)  # undone after the test
    client = Client(moto_server.build_app())
    # moto answers an unsigned GET with AccessDenied; it never checks the signature itself
    headers = {"Host": "127.0.0.1:5000", "Authorization": "AWS4-HMAC-SHA256 Credential=ringtrain-local/"
               "20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0"}
    assert client.put("/ranged", headers=headers).status_code == 200
    body = bytes(range(256)) * 40_000  # 10 MB: past moto's 5 MiB in memory, so in a file
    assert client.put("/ranged/state.pt", data=body, headers=headers).status_code == 200

    def whole_read(key):
        raise AssertionError(f"read all {key.size} bytes of {key.name} for a range")

    monkeypatch.setattr(FakeKey, "value", property(whole_read, FakeKey.value.fset))
    for first, last in ((5_000_000, 5_000_999), (0, 0), (10_239_990, 20_000_000)):
        got = client.get("/ranged/state.pt?x-id=GetObject",
                         headers={**headers, "Range": f"bytes={first}-{last}"})
        assert got.status_code == 206, got.data[:300]
        assert got.data == body[first:last + 1]
        assert got.headers["Content-Range"] == f"bytes {first}-{min(last, len(body) - 1)}/{len(body)}"
    # moto's own checks of the range still apply
    for path, window, status in (("state.pt", "bytes=20000000-20000001", 416), ("nothing", "bytes=0-1", 404)):
        assert client.get(f"/ranged/{path}", headers={**headers, "Range": window}).status_code == status


def test_a_multipart_upload_is_joined_on_disk_with_moto_s_etag_and_checksum(monkeypatch):
    """moto 5.2.5 joins the parts in memory several times over (a 4 GB checkpoint's upload took the
    machine's 23 GB), and writes a large value through an in-memory file before its own."""
    import hashlib
    import tempfile

    from moto import mock_aws
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3 import models
    from moto.s3.utils import compute_checksum

    from train.storage import s3_client

    monkeypatch.setattr(models.FakeMultipart, "complete", models.FakeMultipart.complete)  # undone after
    monkeypatch.setattr(models.FakeKey, "value", models.FakeKey.value)
    add_part = models.MultipartChecksumBuilder.addPart

    def add_part_of_composite_only(builder, part):  # FULL_OBJECT's addPart keeps every part
        assert builder.checksum_type == "COMPOSITE", "joined the whole object in memory"
        add_part(builder, part)

    monkeypatch.setattr(models.MultipartChecksumBuilder, "addPart", add_part_of_composite_only)
    writes: list[tuple[bool, int, int]] = []
    spooled_write = tempfile.SpooledTemporaryFile.write

    def record_write(buffer, data):
        writes.append((buffer._rolled, len(data), buffer._max_size))
        return spooled_write(buffer, data)

    monkeypatch.setattr(tempfile.SpooledTemporaryFile, "write", record_write)
    moto_server.join_multipart_on_disk()
    parts = [bytes(range(256)) * 20_481, b"tail" * 250]  # 5 MiB + 256 bytes, then 1000 bytes
    with mock_aws():
        client = s3_client(None)  # as the trainer's: no checksum of its own, so moto's default one
        client.create_bucket(Bucket="joined")
        upload = client.create_multipart_upload(Bucket="joined", Key="state.pt")["UploadId"]
        etags = [client.upload_part(Bucket="joined", Key="state.pt", UploadId=upload, PartNumber=n + 1,
                                    Body=part)["ETag"] for n, part in enumerate(parts)]
        writes.clear()
        client.complete_multipart_upload(Bucket="joined", Key="state.pt", UploadId=upload, MultipartUpload={
            "Parts": [{"PartNumber": n + 1, "ETag": etag} for n, etag in enumerate(etags)]})
        got = client.get_object(Bucket="joined", Key="state.pt")
        body = got["Body"].read()
        key = models.s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object("joined", "state.pt")
    assert body == b"".join(parts)
    part_md5s = b"".join(hashlib.md5(p).digest() for p in parts)
    assert got["ETag"] == f'"{hashlib.md5(part_md5s).hexdigest()}-2"'
    # (moto returns it only for an upload that named its algorithm: ours name none)
    expected = compute_checksum(body, "CRC64NVME").decode()
    assert (key.checksum_type, key.checksum_value) == ("FULL_OBJECT", expected)
    big = [w for w in writes if w[1] > w[2]]
    assert big and all(rolled for rolled, _, _ in big), writes  # to the file, not through memory
