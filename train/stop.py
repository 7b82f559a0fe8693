"""Spot safety: SIGTERM (what Kubernetes sends before a node goes away) becomes a stop request.

The handler only sets a flag, installed first thing in `python -m train` so a signal that arrives while
torch is still importing is not lost; the training loop votes on the flag at the next step boundary.
"""

from __future__ import annotations

import os
import signal
import time

from train.contract import stop_grace_s
from train.errors import BadInput


def stop_budget_s(environ=os.environ) -> float:
    """Seconds a stop may take from SIGTERM: what the image's entrypoint gives the trainers of the pod's
    grace period (RINGTRAIN_STOP_GRACE_S, train.contract). BadInput for a value outside its range."""
    try:
        return stop_grace_s(environ)
    except ValueError as e:
        raise BadInput(str(e)) from None


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
