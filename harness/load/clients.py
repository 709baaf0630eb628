"""Load from several client processes sharing one schedule, for engines behind a server.

One client process tops out at a few thousand streamed requests/s (docs/measurements.md,
"Performance of the harness itself"); past that the generator, not the server, sets the timing. Here
N clients split one seeded schedule: client i sends requests i, i+N, i+2N, ... of it, all
counting from one common start instant. Their records come back, go onto the parent's
time base and into schedule order, and are then summarized and judged like the records
of a single-process run, so lag, sent/offered and achieved/offered apply to the whole.

* Time base. Every client stamps with its own ``time.perf_counter``. ``MONOTONIC``: on
  Linux that is CLOCK_MONOTONIC, one clock for every process of a machine, so stamps
  need no conversion. ``WALL`` (clients on other machines): the common start is a
  ``time.time`` epoch, each client reports the offset of its wall clock from its
  perf_counter and the parent converts; alignment is then as good as NTP's.
* Start barrier. Clients load their engine and warm up, say they are ready, and only
  then does the launcher pick the start (now + a delay) and send it. A client late to
  it carries the lateness as generator lag on every request it sends: the requests
  were due on the common schedule.
* Failures. A client that raises, dies or misses a deadline is stopped, and every
  request of its share becomes a failed request whose error names the client and why.

``run_client`` is the whole client: a top-level function of a picklable ``ClientSpec``
returning a picklable ``ClientResult``, so another launcher (Ray actors) can call it.
"""

from __future__ import annotations

import enum
import gc
import math
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from harness.engine import (
    EngineConfig,
    EngineError,
    EngineFactory,
    GenerationRequest,
    GenerativeEngine,
    eventloop,
    registry,
)
from harness.load.clock import MonotonicClock
from harness.load.streamdriver import Driver
from harness.metrics import stats
from harness.metrics.streamtiming import RequestRecord

WARMUP_USERS = 32
"""Warm-up requests run this many at a time: it opens the client's connection pool."""


def is_network_client(factory: EngineFactory) -> bool:
    """Whether the adapter is a client of a server, so that several processes can each
    hold an instance against the same server (an in-process engine would load N models).

    An adapter says so with a class attribute ``network_client``; one that does not say
    is judged by whether it takes a ``base_url`` option, the server it talks to."""
    declared = getattr(factory, "network_client", None)
    if isinstance(declared, bool):
        return declared
    try:
        factory.validate_options({"base_url": "http://127.0.0.1:1"})
    except ValueError:
        return False
    return True


class ClockKind(enum.StrEnum):
    MONOTONIC = "monotonic"
    """CLOCK_MONOTONIC: shared by every process of one machine."""
    WALL = "wall"
    """``time.time``: comparable across machines only as far as NTP keeps them in step."""


def clock_shift(kind: ClockKind) -> float:
    """What to add to this process's ``perf_counter`` to read the common clock."""
    if kind is ClockKind.MONOTONIC:
        return 0.0  # perf_counter is CLOCK_MONOTONIC on Linux: already common
    # of a few reads, the one with the shortest bracket was least disturbed
    return min((_wall_read() for _ in range(5)), key=lambda read: read[0])[1]


def _wall_read() -> tuple[float, float]:
    before = time.perf_counter()
    wall = time.time()
    after = time.perf_counter()
    return after - before, wall - (before + after) / 2


def common_now(kind: ClockKind) -> float:
    return time.perf_counter() + clock_shift(kind)


@dataclass(frozen=True)
class OpenShare:
    """Open loop: each request's scheduled offset in seconds from the common start."""

    offsets: tuple[float, ...]

    def __post_init__(self) -> None:
        if any(not (math.isfinite(o) and o >= 0) for o in self.offsets):
            raise ValueError("scheduled offsets must be finite and >= 0")
        if any(b < a for a, b in zip(self.offsets, self.offsets[1:], strict=False)):
            raise ValueError("scheduled offsets must be in schedule order")


@dataclass(frozen=True)
class ClosedShare:
    """Closed loop: ``users`` users; ``min_duration_s`` and ``min_requests`` as in
    ``Driver.closed_loop``."""

    users: int
    min_duration_s: float | None = None
    min_requests: int = 0

    def __post_init__(self) -> None:
        if self.users < 1 or self.min_requests < 0:
            raise ValueError("a closed loop needs >= 1 user and min_requests >= 0")
        if self.min_duration_s is not None and not self.min_duration_s > 0:
            raise ValueError("min_duration_s must be > 0")


Share = OpenShare | ClosedShare


@dataclass(frozen=True)
class ClientSpec:
    """Everything one client needs, picklable.

    The requests and the schedule are drawn from the seed in the parent, so a client
    needs no seed of its own: every client of a run sends exactly its share of them."""

    index: int
    clients: int
    engine: str
    config: EngineConfig
    requests: tuple[GenerationRequest, ...]
    load: Share
    clock: ClockKind = ClockKind.MONOTONIC
    timeout_s: float = 300.0
    warmup: tuple[GenerationRequest, ...] = ()
    start: float | None = None
    """The common start on ``clock`` when fixed in advance; None: ask the barrier."""

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.clients:
            raise ValueError(f"client index {self.index} not in [0, {self.clients})")
        if isinstance(self.load, OpenShare) and len(self.load.offsets) != len(self.requests):
            raise ValueError("one scheduled offset per request")
        if not self.timeout_s > 0:
            raise ValueError("timeout_s must be > 0")


@dataclass(frozen=True)
class ClientResult:
    """What one client saw, in its own ``perf_counter`` time (``shift`` converts)."""

    index: int
    records: tuple[RequestRecord, ...]
    shift: float
    """The common clock minus this client's perf_counter."""
    start_late_s: float
    """How long after the common start the client's driver began (already in its lag)."""
    pid: int
    host: str

    def __post_init__(self) -> None:
        if self.index < 0 or not (math.isfinite(self.shift) and math.isfinite(self.start_late_s)):
            raise ValueError("a client result needs an index >= 0 and finite times")


@dataclass(frozen=True)
class ClientFailure:
    """A client that produced no result; ``at`` is when it was found out (parent's clock)."""

    index: int
    reason: str
    at: float

    def __post_init__(self) -> None:
        if self.index < 0 or not self.reason:
            raise ValueError("a client failure needs an index >= 0 and a reason")


Outcome = ClientResult | ClientFailure


@dataclass(frozen=True)
class Deadlines:
    """``ready_s``: from launch until every client is loaded and warm; ``run_s``: from
    the common start until every client's result is in."""

    ready_s: float
    run_s: float

    def __post_init__(self) -> None:
        if not all(math.isfinite(v) and v > 0 for v in (self.ready_s, self.run_s)):
            raise ValueError("deadlines must be positive numbers of seconds")


@dataclass(frozen=True)
class Launched:
    """One outcome per client, the common start on the clients' clock, and the shift of
    the parent's own perf_counter to that clock (for converting to the parent's base)."""

    launcher: str
    start: float
    parent_shift: float
    outcomes: tuple[Outcome, ...]


class Launcher(Protocol):
    """Starts one client per spec, runs the start barrier, and hands back every client's
    outcome by the deadlines; never raises for a client's failure."""

    name: ClassVar[str]
    clock: ClassVar[ClockKind]
    """The clock its clients stamp with: a ``SharedLoad`` for it uses this one."""

    def launch(self, specs: Sequence[ClientSpec], deadlines: Deadlines) -> Launched: ...


@dataclass(frozen=True)
class SharedLoad:
    """A whole run before it is split: client i takes requests i, i+N, i+2N, ...; in a
    closed loop the users are dealt out as evenly as they go, and a client without a
    user has no share (N is then the number of users)."""

    engine: str
    config: EngineConfig
    requests: tuple[GenerationRequest, ...]
    load: Share
    clients: int
    clock: ClockKind = ClockKind.MONOTONIC
    timeout_s: float = 300.0
    warmup: tuple[GenerationRequest, ...] = ()

    def __post_init__(self) -> None:
        if self.clients < 1:
            raise ValueError("clients must be >= 1")
        if isinstance(self.load, OpenShare) and len(self.load.offsets) != len(self.requests):
            raise ValueError("one scheduled offset per request")

    @property
    def active(self) -> int:
        if isinstance(self.load, ClosedShare):
            return min(self.clients, self.load.users)
        return self.clients

    def indices(self, index: int) -> range:
        return range(index, len(self.requests), self.active)

    def offset(self, i: int) -> float:
        return self.load.offsets[i] if isinstance(self.load, OpenShare) else 0.0

    def specs(self) -> list[ClientSpec]:
        return [
            ClientSpec(
                index=k,
                clients=self.active,
                engine=self.engine,
                config=self.config,
                requests=tuple(self.requests[i] for i in self.indices(k)),
                load=self._share(k),
                clock=self.clock,
                timeout_s=self.timeout_s,
                warmup=self.warmup,
            )
            for k in range(self.active)
        ]

    def _share(self, k: int) -> Share:
        load, n = self.load, self.active
        if isinstance(load, OpenShare):
            return OpenShare(tuple(load.offsets[i] for i in self.indices(k)))
        # client k holds global requests k, k+n, ...: those below min_requests are its part
        return ClosedShare(
            users=load.users // n + (k < load.users % n),
            min_duration_s=load.min_duration_s,
            min_requests=len(range(k, load.min_requests, n)),
        )


# --- the client -------------------------------------------------------------------------

StartSignal = Callable[[], float]
"""Called once the client is loaded and warm; returns the common start on its clock."""


def run_client(spec: ClientSpec, await_start: StartSignal | None = None) -> ClientResult:
    """Load the engine, warm up, wait for the common start, send the share, return the
    records. The start is ``spec.start`` when fixed in advance, else ``await_start()``."""
    if spec.start is None and await_start is None:
        raise ValueError("no start: fix spec.start or give await_start")
    engine = registry.load(spec.engine)(spec.config)
    try:
        engine.load()
        if not isinstance(engine, GenerativeEngine):
            raise EngineError(f"{spec.engine} is not a generative engine")
        driver = Driver(engine, MonotonicClock(), spec.timeout_s)
        return eventloop.run(_client(driver, spec, await_start))
    finally:
        engine.close()


async def _client(
    driver: Driver, spec: ClientSpec, await_start: StartSignal | None
) -> ClientResult:
    try:
        if spec.warmup:
            await driver.closed_loop(spec.warmup, min(len(spec.warmup), WARMUP_USERS))
        common = spec.start if spec.start is not None else _call(await_start)
        shift = clock_shift(spec.clock)
        records, late = await _drive(driver, spec, common - shift)
    finally:
        aclose = getattr(driver.engine, "aclose", None)
        if aclose is not None:  # the connection pool belongs to this loop: close it here
            await aclose()
    return ClientResult(spec.index, tuple(records), shift, late, os.getpid(), socket.gethostname())


def _call(signal_start: StartSignal | None) -> float:
    if signal_start is None:
        raise ValueError("no start signal")
    return signal_start()


async def _drive(
    driver: Driver, spec: ClientSpec, start: float
) -> tuple[list[RequestRecord], float]:
    """The share from ``start`` (this process's perf_counter) and how late it began."""
    gc.collect()
    gc.freeze()  # the driver collects again as it starts: frozen, that costs microseconds
    try:
        MonotonicClock().sleep_until(start)
        load = spec.load
        if isinstance(load, ClosedShare):
            began = driver.clock.now()
            records = await driver.closed_loop(
                spec.requests, load.users, load.min_duration_s, load.min_requests
            )
            return records, began - start
        offsets = np.asarray(load.offsets, dtype=np.float64)
        return on_schedule(await driver.open_loop(spec.requests, offsets), offsets, start)
    finally:
        gc.unfreeze()


def on_schedule(
    records: Sequence[RequestRecord], offsets: npt.NDArray[np.float64], start: float
) -> tuple[list[RequestRecord], float]:
    """Records of ``Driver.open_loop`` (which counts from when it began) put on the common
    schedule from ``start``: each was due at start + offset, so a late beginning is lag."""
    if not records:
        return [], 0.0
    late = records[0].t_sched - float(offsets[0]) - start
    due = start + offsets
    out = [
        replace(r, t_sched=float(d), lag=r.lag + (r.t_sched - float(d)))
        for r, d in zip(records, due, strict=True)
    ]
    return out, late


# --- errors a launcher reports ------------------------------------------------------


def client_error(exc: Exception) -> str:
    """Why a client has no result, as its launcher reports it."""
    return f"{type(exc).__name__}: {exc}"[:500]


# --- the merged run ---------------------------------------------------------------------


@dataclass(frozen=True)
class ClientReport:
    """One client's part of a merged run, as the cell records it."""

    index: int
    requests: int
    ok: int
    failed: int
    lag_p99_s: float | None
    start_late_s: float | None
    pid: int | None
    host: str | None
    error: str | None


@dataclass(frozen=True)
class MergedRun:
    """Every request of the run once, in schedule order, on the parent's clock."""

    records: tuple[RequestRecord, ...]
    clients: tuple[ClientReport, ...]
    clock: ClockKind
    launcher: str

    def to_json(self) -> dict[str, Any]:
        return {
            "count": len(self.clients),
            "launcher": self.launcher,
            "clock": self.clock.value,
            "per_client": [asdict(c) for c in self.clients],
        }


def run_shared(shared: SharedLoad, launcher: Launcher, deadlines: Deadlines) -> MergedRun:
    return merge(shared, launcher.launch(shared.specs(), deadlines))


def merge(shared: SharedLoad, launched: Launched) -> MergedRun:
    """Each client's records onto the parent's clock and into their places in the
    schedule; a failed client's share as failed requests; an open-loop request that a
    client did not return as a failed request too (nothing is dropped)."""
    if sorted(o.index for o in launched.outcomes) != list(range(shared.active)):
        raise ValueError("the launcher must give one outcome per client")
    start = launched.start - launched.parent_shift  # the common start, on the parent's clock
    slots: list[RequestRecord | None] = [None] * len(shared.requests)
    reports = []
    for outcome in sorted(launched.outcomes, key=lambda o: o.index):
        records = _placed(shared, outcome, launched.parent_shift, start)
        for i, record in zip(shared.indices(outcome.index), records, strict=False):
            slots[i] = record
        reports.append(_report(outcome, records))
    merged = tuple(r for r in slots if r is not None)
    return MergedRun(merged, tuple(reports), shared.clock, launched.launcher)


def _placed(
    shared: SharedLoad, outcome: Outcome, parent_shift: float, start: float
) -> list[RequestRecord]:
    share = shared.indices(outcome.index)
    if isinstance(outcome, ClientFailure):
        return [_failed(shared, i, start, outcome) for i in share]
    if len(outcome.records) > len(share):
        raise ValueError(f"client {outcome.index} returned more records than its share")
    records = [shifted(r, outcome.shift - parent_shift) for r in outcome.records]
    if isinstance(shared.load, OpenShare):
        missing = ClientFailure(outcome.index, "returned no record for it", start)
        records += [_failed(shared, i, start, missing) for i in share[len(records) :]]
    return records


def shifted(record: RequestRecord, delta: float) -> RequestRecord:
    """``record`` with every timestamp moved by ``delta`` seconds (lag is a difference)."""
    if delta == 0.0:
        return record
    return replace(
        record,
        t_sched=record.t_sched + delta,
        t_send=record.t_send + delta,
        t_end=record.t_end + delta,
        chunk_times=tuple(t + delta for t in record.chunk_times),
    )


def _failed(shared: SharedLoad, i: int, start: float, failure: ClientFailure) -> RequestRecord:
    req = shared.requests[i]
    due = start + shared.offset(i)
    return RequestRecord(
        t_sched=due,
        t_send=due,  # never sent: no lag of its own; it counts as a failed request
        t_end=max(due, failure.at),
        chunk_times=(),
        chunk_tokens=(),
        n_in=len(req.prompt) if req.kind == "tokens" else 0,
        n_in_source="prompt ids" if req.kind == "tokens" else "unknown",
        n_asked=req.max_tokens,
        error=f"client {failure.index} failed: {failure.reason}"[:300],
    )


def _report(outcome: Outcome, records: Sequence[RequestRecord]) -> ClientReport:
    ok = sum(r.ok for r in records)
    if isinstance(outcome, ClientFailure):
        none = {"lag_p99_s": None, "start_late_s": None, "pid": None, "host": None}
        return ClientReport(
            outcome.index, len(records), ok, len(records) - ok, **none, error=outcome.reason
        )
    return ClientReport(
        index=outcome.index,
        requests=len(records),
        ok=ok,
        failed=len(records) - ok,
        lag_p99_s=stats.conservative([r.lag for r in records], 99.0),
        start_late_s=outcome.start_late_s,
        pid=outcome.pid,
        host=outcome.host,
        error=None,
    )
