"""Shared pytest fixtures for the whole suite."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cluster.local.objectstore import ObjectStore

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # make `tests.infra.harness` importable however pytest is started
    sys.path.insert(0, _ROOT)


@pytest.fixture(scope="session")
def object_store():
    """A real S3-compatible server (moto in server mode) on loopback, for the whole session."""
    with ObjectStore() as store:
        yield store


@pytest.fixture
def s3_bucket(object_store, request):
    """A fresh bucket in the session's object store; yields its name."""
    name = "test-" + request.node.name.lower().replace("_", "-")[:40].strip("-") + f"-{id(request) % 10**6}"
    client = object_store.client()
    client.create_bucket(Bucket=name)
    yield name
