"""The load generators' live counters, read by the progress display (harness.session.liveprogress).

A measured loop's only cost is an integer or float attribute update per request (no lock,
no I/O, no allocation): a display thread samples ``LIVE`` about once a second and reads
whatever the loop last wrote, which under the GIL is always a whole value. A loop
starts a *window* (``begin_window``) before its first send, saying how long it plans to
run and how many requests it plans to send, where it knows.

The harness's load generators count for themselves. A workload that sends its own requests
counts them in a ``counting`` window (``harness.api.counting``), or its progress line says
"no requests counted".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Now = Callable[[], float]


@dataclass(frozen=True)
class LoadSnapshot:
    """The counters at one instant; ``window_s`` is None before any loop has started, and
    stops growing once the loop has ended (``ended``)."""

    sent: int = 0
    completed: int = 0
    failed: int = 0
    lag_s: float | None = None
    window_s: float | None = None
    planned_s: float | None = None
    planned_requests: int | None = None
    ended: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LoadSnapshot:
        """The fields of ``data`` this class knows; anything else (or malformed) is left
        at its default, since a display must never fail a run."""
        return cls(
            sent=_int(data.get("sent")),
            completed=_int(data.get("completed")),
            failed=_int(data.get("failed")),
            lag_s=_float(data.get("lag_s")),
            window_s=_float(data.get("window_s")),
            planned_s=_float(data.get("planned_s")),
            planned_requests=_int_or_none(data.get("planned_requests")),
            ended=data.get("ended") is True,
        )


def _int(value: object) -> int:
    found = _int_or_none(value)
    return 0 if found is None else found


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class LoadCounter:
    """Mutable on purpose (not a frozen dataclass): the hot loops bump its fields in
    place, which is the cheapest thing they can do; everything else reads ``snapshot``."""

    __slots__ = (
        "completed",
        "failed",
        "lag_s",
        "now",
        "planned_requests",
        "planned_s",
        "sent",
        "window_ended",
        "window_started",
    )
    sent: int
    completed: int
    failed: int
    lag_s: float | None
    planned_s: float | None
    planned_requests: int | None
    window_started: float | None
    window_ended: float | None

    def __init__(self, now: Now = time.monotonic) -> None:
        self.now = now
        self.reset()

    def reset(self) -> None:
        """A new cell: nothing sent, no window."""
        self.sent = 0
        self.completed = 0
        self.failed = 0
        self.lag_s = None
        self.planned_s = None
        self.planned_requests = None
        self.window_started = None
        self.window_ended = None

    def begin_window(self, planned_s: float | None, planned_requests: int | None) -> None:
        """A loop starts: its counts start from zero (a warm-up's are not the window's)."""
        self.reset()
        self.planned_s = planned_s
        self.planned_requests = planned_requests
        self.window_started = self.now()

    def end_window(self) -> None:
        """The loop is over: its window's time stops (the cell's work after it is not)."""
        if self.window_started is not None:
            self.window_ended = self.now()

    def snapshot(self) -> LoadSnapshot:
        started, ended = self.window_started, self.window_ended
        upto = self.now() if ended is None else ended
        return LoadSnapshot(
            sent=self.sent,
            completed=self.completed,
            failed=self.failed,
            lag_s=self.lag_s,
            window_s=None if started is None else max(0.0, upto - started),
            planned_s=self.planned_s,
            planned_requests=self.planned_requests,
            ended=ended is not None,
        )


LIVE = LoadCounter()
"""The counters of this process's cell in flight (one cell runs at a time per process)."""


def schedule_span(offsets: npt.NDArray[np.float64]) -> float:
    """How long a schedule of offsets (seconds from its start) plans to send for."""
    return float(np.max(offsets)) if offsets.size else 0.0


@contextmanager
def counting(
    planned_s: float | None = None, planned_requests: int | None = None
) -> Iterator[LoadCounter]:
    """A measured window of the cell's live counters, for a loop of the workload's own:
    it bumps ``sent``, ``completed`` and ``failed`` (and sets ``lag_s``, where requests
    have a schedule) on the counter it is given; the progress line shows them."""
    LIVE.begin_window(planned_s, planned_requests)
    try:
        yield LIVE
    finally:
        LIVE.end_window()
