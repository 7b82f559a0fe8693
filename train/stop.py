"""Spot safety: SIGTERM (what Kubernetes sends before a node goes away) becomes a stop request.

The handler only sets a flag, installed first thing in `python -m train` so a signal that arrives while
torch is still importing is not lost; the training loop votes on the flag at the next step boundary.
"""

from __future__ import annotations

import os
import signal
import time

# Seconds a stop may take from SIGTERM: the image's entrypoint gives the trainers
# RINGTRAIN_STOP_GRACE_S (default 100, image/ringtrain_entry/settings.py) of the pod's 120 s grace period.
STOP_BUDGET_ENV = "RINGTRAIN_STOP_GRACE_S"
DEFAULT_STOP_BUDGET_S = 100.0


def stop_budget_s(environ=os.environ) -> float:
    try:
        return float(environ.get(STOP_BUDGET_ENV, DEFAULT_STOP_BUDGET_S))
    except ValueError:
        return DEFAULT_STOP_BUDGET_S


class StopRequest:
    def __init__(self) -> None:
        self.requested = False
        self.at: float | None = None  # time.monotonic() of the first SIGTERM

    def install(self) -> StopRequest:
        signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if not self.requested:
            self.at = time.monotonic()
        self.requested = True


# The process-wide request, installed by train.__main__ before anything slow happens.
STOP = StopRequest()
