"""Runs the scheduler when its earliest wakeup comes due, instead of polling on a fixed tick.

Every engine keeps a heap of (due ms, stream) wakeups; each push is reported here (`at`). One loop
timer is armed for the earliest of them, so a turn's request is decided within the event loop's
timer precision (about a millisecond) of its debounce, and an idle worker wakes for nothing.
A wakeup at 0 (every folded event pushes one) runs the scheduler as soon as the current batch is
handled.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable


class DueTimer:
    """Calls `run_due(now_ms)` at the earliest wakeup reported by `at`; `run_due` returns the
    earliest wakeup left (ms since the epoch), or None."""

    def __init__(self, run_due: Callable[[int], int | None]) -> None:
        self._run_due = run_due
        self._deadline_ms = math.inf
        self._handle: asyncio.TimerHandle | asyncio.Handle | None = None

    def at(self, at_ms: int) -> None:
        """A wakeup at `at_ms` was added: fire then, unless the timer is already armed sooner."""
        if at_ms >= self._deadline_ms:
            return
        self._deadline_ms = at_ms
        if self._handle is not None:
            self._handle.cancel()
        loop = asyncio.get_running_loop()
        delay_s = (at_ms - time.time() * 1000) / 1000
        self._handle = loop.call_later(delay_s, self._fire) if delay_s > 0 else loop.call_soon(self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._deadline_ms = math.inf
        earliest = self._run_due(int(time.time() * 1000))
        if earliest is not None:
            self.at(earliest)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._deadline_ms = math.inf
