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
    assert object_store._proc.pid in [p.pid for p in found]


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
