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


@pytest.fixture(scope="session")
def digits(tmp_path_factory) -> tuple[str, str]:
    """sklearn's digits packed as image shards, 10 % held out: the (train, eval) directories."""
    from cluster.example_data import write_digits
    from train import pack

    root = tmp_path_factory.mktemp("digits")
    write_digits(root / "png")
    pack.pack("images", [str(root / "png")], str(root / "train"), str(root / "eval"), 0.1, 500, 0, None)
    return str(root / "train"), str(root / "eval")
