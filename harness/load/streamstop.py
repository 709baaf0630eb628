"""Over-saturation early stop for the streaming driver's open loop (generative engines).

The same detector as the tensor serving loop's (``harness.load.saturation.Watch``), fed
from the streaming driver: while a search's rate point runs, a watcher beside the
dispatcher asks it every quarter of the rule's check interval, with the backlog
(requests due by the schedule and not yet finished, ok or failed) and the end-to-end
latency of the finished successful ones, from their scheduled time, in schedule order.
When it stops the point, the dispatcher sends nothing more and the requests in flight
are cancelled (their streams closed, so the engine or server can drop them). The point
keeps the records of the requests that finished; the cut-off ones are counted in the
evidence (``backlog``: due and unfinished, ``unsent``: due after the stop), never
recorded as the system's failures and never dropped from the count.

Several client processes (``--clients N``) each run a share of one schedule in their
own process; the watch sees only this one, so that path runs every point in full and
the record says so (``NO_EARLY_STOP_CLIENTS``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from harness.engine import GenerationRequest
from harness.load.clock import Clock, gc_paused
from harness.load.livecounters import LIVE, schedule_span
from harness.load.saturation import EarlyStop, Watch
from harness.load.stream_summary import StreamSummary
from harness.load.streamdriver import Driver, sleep_until
from harness.metrics.streamtiming import RequestRecord

Array = npt.NDArray[np.float64]
Tasks = dict[int, asyncio.Task[RequestRecord]]
T = TypeVar("T")

NO_EARLY_STOP_CLIENTS = (
    "several client processes (--clients) ran points of this search: each runs its share"
    " of the schedule in its own process, where this one cannot watch its backlog, so"
    " those points ran in full"
)
"""Why a search's points did not stop early (the search's ``early_stop.not_applied``)."""


@dataclass(frozen=True)
class StreamStop(EarlyStop):
    """A streamed point's stop, with the share of the requests due by its last send that
    the generator sent, the cut-off ones included. The records keep only the finished
    ones, whose rate would read as a generator that could not keep up; and the part of a
    Poisson schedule before the stop offers its own count, not the window's mean rate, so
    the share, not a rate, says whether the generator kept up."""

    sent_share: float | None = None

    def to_json(self) -> dict[str, Any]:
        return super().to_json() | {"sent_share": self.sent_share}


@dataclass(frozen=True)
class WatchedRun:
    """An open loop's finished requests (ok or failed) in request order, the indices of
    the requests they ran, and the early stop that cut the rest off (None: none was)."""

    records: list[RequestRecord]
    kept: tuple[int, ...]
    early_stop: EarlyStop | None = None

    def __post_init__(self) -> None:
        if len(self.records) != len(self.kept):
            raise ValueError("one request index per record")
        if self.early_stop is None and self.kept != tuple(range(len(self.kept))):
            raise ValueError("a run that was not stopped keeps every request")

    def ran(self, requests: Sequence[T]) -> list[T]:
        """The requests the records ran, in the records' order."""
        return [requests[i] for i in self.kept]


async def open_loop_watched(
    driver: Driver,
    requests: Sequence[GenerationRequest],
    offsets: Array,
    watch: Watch | None,
) -> WatchedRun:
    """``driver.open_loop``, stopped early by ``watch`` (None: the plain open loop)."""
    if watch is None:
        records = await driver.open_loop(requests, offsets)
        return WatchedRun(records, tuple(range(len(records))))
    if len(requests) != len(offsets):
        raise ValueError("one scheduled offset per request")
    order = np.argsort(offsets, kind="stable")
    due = np.asarray(offsets, dtype=np.float64)[order]  # offsets in the order sent
    with gc_paused():  # the schedule starts after the collection, not before
        LIVE.begin_window(schedule_span(offsets), len(requests))
        point = _Point(watch, driver.clock, driver.clock.now(), due)
        sender = asyncio.create_task(_dispatch(driver, requests, order.tolist(), point))
        try:
            stop = await point.until_done(sender)
        finally:  # stopped, or a fatal error: nothing of this point runs on
            for task in (sender, *point.tasks.values()):
                task.cancel()
            await asyncio.gather(sender, *point.tasks.values(), return_exceptions=True)
        LIVE.end_window()
    return _result(point, stop, len(requests))


async def _dispatch(
    driver: Driver, requests: Sequence[GenerationRequest], order: list[int], point: _Point
) -> None:
    """As ``Driver.open_loop``: one dispatcher starts each request when it is due."""
    for i, t_sched in zip(order, (point.start + point.due).tolist(), strict=True):
        await sleep_until(driver.clock, t_sched)
        started = driver.start(requests[i], t_sched)
        point.sent.append(started.t_send)
        point.tasks[i] = asyncio.create_task(driver.follow(requests[i], t_sched, started))


@dataclass
class _Point:
    """A running point: its watch, schedule (``due``: offsets in the order sent, from
    ``start`` on ``clock``), the requests started so far, by index, and when each went."""

    watch: Watch
    clock: Clock
    start: float
    due: Array
    tasks: Tasks = field(default_factory=dict)
    sent: list[float] = field(default_factory=list)

    def sent_share(self) -> float | None:
        """The requests sent over those due by the last send (1: it kept up)."""
        if not self.sent:
            return None
        due = int(np.searchsorted(self.due, max(self.sent) - self.start, side="right"))
        return len(self.sent) / due if due else None

    async def until_done(self, sender: asyncio.Task[None]) -> EarlyStop | None:
        """Wait for every request to finish, checking the watch as it falls due (every
        quarter of its interval at most late); the stop, if it came."""
        poll = self.watch.rule.every_fraction * self.watch.window_s / 4
        while pending := _pending(sender, self.tasks):
            await asyncio.wait(pending, timeout=poll)
            stop = self.check()
            if stop is not None:
                return stop
        return None

    def check(self) -> EarlyStop | None:
        """The watch's verdict when it is due, with the requests not yet due as unsent."""
        elapsed = self.clock.now() - self.start
        if not self.watch.due(elapsed):
            return None
        arrived = int(np.searchsorted(self.due, elapsed, side="right"))
        done = _finished(self.tasks)
        latencies = partial(_latencies, done.values(), self.start)
        stop = self.watch.check(elapsed, arrived, len(done), latencies)
        return None if stop is None else replace(stop, unsent=int(self.due.size) - arrived)


def _pending(sender: asyncio.Task[None], tasks: Tasks) -> set[asyncio.Task[Any]]:
    """The dispatcher while it runs, then the requests in flight (none: the run is over)."""
    if not sender.done():
        return {sender}
    sender.result()  # a fatal error at a send ends the run here
    return {t for t in tasks.values() if not t.done()}


def _finished(tasks: Tasks) -> dict[int, RequestRecord]:
    """The requests finished so far (ok or failed), by index; re-raises a fatal error."""
    return {i: t.result() for i, t in tasks.items() if t.done() and not t.cancelled()}


def _latencies(records: Iterable[RequestRecord], start: float) -> tuple[Array, Array]:
    """The successful requests' scheduled offsets and e2e latencies, in schedule order."""
    ok = sorted((r for r in records if r.ok), key=lambda r: r.t_sched)
    t_sched = np.array([r.t_sched for r in ok], dtype=np.float64)
    e2e = np.array([r.t_last - r.t_sched for r in ok], dtype=np.float64)
    return t_sched - start, e2e


def _result(point: _Point, stop: EarlyStop | None, n: int) -> WatchedRun:
    """The finished requests; with a stop, the cut-off ones: due and unfinished (cancelled
    in flight, or due and not yet sent), counted from the records kept, so that records,
    cut-off and unsent requests add up to the schedule whatever ended at the cancel."""
    done = _finished(point.tasks)
    kept = tuple(sorted(done))
    records = [done[i] for i in kept]
    if stop is None:
        return WatchedRun(records, kept)
    cut = StreamStop(
        **{f.name: getattr(stop, f.name) for f in fields(EarlyStop)},
        sent_share=point.sent_share(),
    )
    return WatchedRun(records, kept, replace(cut, backlog=n - stop.unsent - len(records)))


def with_early_stop(summary: StreamSummary, stop: EarlyStop | None) -> StreamSummary:
    """The summary of a stopped point, as ``summarize_trace`` keeps a tensor one: the stop's
    evidence in the metrics and notes, the requests it cut off beside the failures."""
    if stop is None:
        return summary
    requests: Mapping[str, Any] = summary.metrics["requests"]
    metrics = summary.metrics | {
        "requests": {**requests, "cut_off": stop.backlog + stop.unsent},
        "early_stop": stop.to_json(),
    }
    notes = (*summary.evidence.notes, stop.describe())
    evidence = replace(summary.evidence, notes=notes)
    offered = evidence.offered_rate
    share = stop.sent_share if isinstance(stop, StreamStop) else None
    if offered and share is not None:  # the records' own rate misses the cut-off requests
        evidence = replace(evidence, sent_rate=offered * share)
    return replace(summary, metrics=metrics, evidence=evidence)
