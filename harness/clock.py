"""Clocks: the one monotonic time source every measurement uses, and its protocol.

Timing logic takes a ``Clock`` so tests can drive it with a fake one; production code
uses ``MonotonicClock`` (``time.perf_counter``: monotonic, highest resolution).
"""

from __future__ import annotations

import gc
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


class MonotonicClock:
    """``time.perf_counter`` with a sleep that never returns early."""

    def now(self) -> float:
        return time.perf_counter()

    def sleep_until(self, deadline: float) -> None:
        # time.sleep may return a hair early on some kernels; loop until the
        # deadline really passed so callers can rely on "never before".
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            time.sleep(remaining)


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
