"""Fixtures for the trainer's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from train import data as data_mod


@pytest.fixture(scope="session")
def local_dataset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("dataset")
    data_mod.generate(str(path), shards=2, samples_per_shard=512, seed=3)
    return path
