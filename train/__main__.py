"""`python -m train [args]`: parse, run, and turn bad input into one message and exit code 2."""

from __future__ import annotations

import os
import sys
import warnings

from train.stop import STOP

STOP.install()  # before the slow imports below: a SIGTERM during start-up must not be lost

from train.config import parse_args  # noqa: E402
from train.contract import EXIT_BAD_INPUT  # noqa: E402
from train.errors import BadInput  # noqa: E402


def _is_reporting_rank() -> bool:
    # Bad input is agreed on by every rank; one copy of the message is enough (elastic workers each
    # validate alone, so each reports).
    return os.environ.get("HOROVOD_RANK", "0") == "0" or "HOROVOD_ELASTIC" in os.environ


def main(argv: list[str] | None = None) -> int:
    warnings.formatwarning = lambda msg, cat, *a, **k: f"train: warning: {msg}\n"
    try:
        cfg = parse_args(argv)
        from train.run import run

        return run(cfg)
    except BadInput as e:
        if _is_reporting_rank():
            print(f"train: error: {e}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
