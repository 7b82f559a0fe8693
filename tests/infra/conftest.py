"""Shared fixtures for the infra tests: the committed stacks run once per session under mocks."""

import copy
import functools

import pytest

from tests.infra.harness import run_program


@functools.cache
def _committed(stack: str):
    return run_program(stack)


@pytest.fixture
def committed():
    """committed("prod") -> ProgramResult of Pulumi.prod.yaml (a private copy: tests may mutate it)."""
    return lambda stack: copy.deepcopy(_committed(stack))
