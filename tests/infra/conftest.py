"""Shared fixtures for the infra tests: the committed stacks run once per session under mocks."""

import copy
import functools
import sys
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:  # make `tests.infra.harness` importable however pytest is started
    sys.path.insert(0, _ROOT)

from tests.infra.harness import run_program  # noqa: E402


@functools.cache
def _committed(stack: str):
    return run_program(stack)


@pytest.fixture
def committed():
    """committed("prod") -> ProgramResult of Pulumi.prod.yaml (a private copy: tests may mutate it)."""
    return lambda stack: copy.deepcopy(_committed(stack))
