"""Errors the trainer reports as one line and an exit code instead of a traceback."""

from __future__ import annotations


class BadInput(Exception):
    """Bad arguments, a missing or malformed dataset, an unreachable endpoint, wrong credentials.

    The message names what is wrong and what is allowed; `python -m train` prints it and exits with
    train.contract.EXIT_BAD_INPUT on every rank.
    """
