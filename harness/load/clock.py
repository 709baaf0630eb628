"""Clocks: the one monotonic time source every measurement uses, and its protocol.

Timing logic takes a ``Clock`` so tests can drive it with a fake one; production code
uses ``MonotonicClock`` (``time.perf_counter``: monotonic, highest resolution).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Clock(Protocol):
    """A monotonic time source in seconds that can also wait."""

    def now(self) -> float:
        """Current time in seconds; only differences are meaningful."""
        ...

    def sleep_until(self, deadline: float) -> None:
        """Return at or after ``deadline`` (never before)."""
        ...


SPIN_S = 50e-6
"""The last stretch of a wait is spun, not slept: a sleeping thread wakes up to the
kernel's timer slack (50 us by default) late, and that lateness is generator lag."""

PR_SET_TIMERSLACK = 29
_slack = threading.local()


def _tighten_timer_slack() -> None:
    """Ask Linux for 1 ns timer slack on this thread (once); elsewhere a no-op."""
    if getattr(_slack, "done", False):
        return
    _slack.done = True
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)


class MonotonicClock:
    """``time.perf_counter`` with a sleep that never returns early and rarely late."""

    def now(self) -> float:
        return time.perf_counter()

    def sleep_until(self, deadline: float) -> None:
        _tighten_timer_slack()
        remaining = deadline - time.perf_counter()
        if remaining > SPIN_S:
            time.sleep(remaining - SPIN_S)
        # spin to the deadline: never before it, and not a timer slack after
        while time.perf_counter() < deadline:
            pass


@contextmanager
def gc_paused() -> Iterator[None]:
    """Keep the cyclic garbage collector out of a measured window.

    A collection in a process the size of a pytest session takes milliseconds; inside
    the serving loop it shows up as generator lag and as latency the engine never had.
    """
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
