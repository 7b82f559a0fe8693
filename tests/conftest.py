"""Shared pytest fixtures for the whole suite."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cluster.local.objectstore import ObjectStore

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # make `tests.infra.harness` importable however pytest is started
    sys.path.insert(0, _ROOT)


# The slow modules that run longest, longest first. scripts/test's slow pass hands whole modules to two
# xdist workers in collection order (--dist loadfile --no-loadscope-reorder); starting with the longest
# lets both workers finish together, where one used to run the longest module alone at the end. The
# figures (seconds, one at a time, 2 cores) only rank them.
LONGEST_FIRST = (
    "tests/train/test_distributed.py",         # ~300
    "tests/train/test_tasks_distributed.py",   # ~180
    "tests/cluster/test_local_flow.py",        # ~180
    "tests/train/test_single_worker.py",       # ~135
    "tests/cluster/test_faults.py",            # ~130
    "tests/cluster/test_export_flow.py",       # ~65
    "tests/train/test_export_run.py",          # ~55
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.path)).relative_to(_ROOT).as_posix(), len(rank)))


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


@pytest.fixture(scope="session")
def dev_outputs_file(tmp_path_factory):
    """The dev stack's outputs as `pulumi stack output --json` writes them, from the program under
    mocks: what `submit --outputs FILE` reads instead of a live stack."""
    from tests.infra.harness import run_program

    path = tmp_path_factory.mktemp("outputs") / "dev-outputs.json"
    path.write_text(json.dumps(run_program("dev").exports))
    return path
