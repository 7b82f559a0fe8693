"""Spot safety: SIGTERM (what Kubernetes sends before a node goes away) becomes a stop request.

The handler only sets a flag, installed first thing in `python -m train` so a signal that arrives while
torch is still importing is not lost; the training loop votes on the flag at the next step boundary.
"""

from __future__ import annotations

import signal


class StopRequest:
    def __init__(self) -> None:
        self.requested = False

    def install(self) -> StopRequest:
        signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True


# The process-wide request, installed by train.__main__ before anything slow happens.
STOP = StopRequest()
