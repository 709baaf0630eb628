"""Load generation for streaming (generative) engines, on asyncio.

* closed loop: ``concurrency`` users, each sends its next request when the last ends;
* open loop: every request is sent at its scheduled time whatever the engine is doing,
  and latency counts from that time (no coordinated omission); each request records the
  generator's own lag (actual send minus intended send);
* static batches: requests are admitted in groups of ``batch``; a group goes when it is
  full (or the stream ended) *and* the previous group has finished. The baseline that
  iteration-level (continuous) batching is compared against, through the same engine.

Every chunk is stamped here, at the client, the moment the engine's stream yields it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

from harness.engine import Chunk, GenerationRequest, GenerativeEngine, is_fatal
from harness.load.clock import Clock, MonotonicClock, gc_paused
from harness.load.livecounters import LIVE, schedule_span
from harness.metrics.streamtiming import InputSource, RequestRecord

T = TypeVar("T")

InputCounter = Callable[[GenerationRequest], int]
"""Counts a request's input tokens on the client (a tokenizer and chat template)."""


def _n_in(
    req: GenerationRequest, reported: int | None, count: InputCounter | None
) -> tuple[int, InputSource]:
    """The request's input tokens and where the count came from: the engine or server
    first (what it really processed, a BOS or chat template included), the prompt's own
    token ids second, the client's tokenizer third."""
    if reported is not None:
        return reported, "engine"
    if req.kind == "tokens":
        return len(req.prompt), "prompt ids"
    if count is not None:
        return count(req), "tokenizer"
    return 0, "unknown"


SPIN_S = 0.0015
"""asyncio's timers wake up to 1 ms late (epoll rounds its timeout up to whole
milliseconds), which is generator lag; the last stretch of a wait yields to the loop
instead of sleeping, so other requests' I/O still runs while this one is due."""


async def sleep_until(clock: Clock, deadline: float) -> None:
    delay = deadline - clock.now()
    if delay > SPIN_S:
        await asyncio.sleep(delay - SPIN_S)
    loop = asyncio.get_running_loop()
    give_up = loop.time() + SPIN_S * 2  # bounded in real time, whatever ``clock`` does
    while clock.now() < deadline and loop.time() < give_up:
        await asyncio.sleep(0)


@dataclass
class _Seen:
    """What one request's stream delivered: chunk times and sizes, and the engine's
    latest word on counts and timings (each chunk may update it)."""

    times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    reasoning: list[int] = field(default_factory=list)
    reported: int | None = None
    prompt_tokens: int | None = None
    engine_stats: Mapping[str, float] | None = None
    retokenized: int | None = None
    client_stats: Mapping[str, float] | None = None

    def take(self, chunk: Chunk, now: float) -> None:
        self.times.append(now)
        self.tokens.append(chunk.n_tokens)
        self.reasoning.append(chunk.reasoning_tokens)
        self.reported = _latest(chunk.completion_tokens, self.reported)
        self.prompt_tokens = _latest(chunk.prompt_tokens, self.prompt_tokens)
        self.engine_stats = _latest(chunk.engine_stats, self.engine_stats)
        self.retokenized = _latest(chunk.retokenized, self.retokenized)
        self.client_stats = _latest(chunk.client_stats, self.client_stats)


def _latest(new: T | None, old: T | None) -> T | None:
    return old if new is None else new


class Started(NamedTuple):
    """A request handed to its engine: when, how late, and the stream to read."""

    t_send: float
    lag: float
    stream: AsyncIterator[Chunk]


async def _failed(exc: Exception) -> AsyncIterator[Chunk]:
    raise exc
    yield  # an async generator that fails when first read  # pragma: no cover


@dataclass(frozen=True)
class Driver:
    """Sends requests to one engine and records what the client saw."""

    engine: GenerativeEngine
    clock: Clock
    timeout_s: float
    count_input: InputCounter | None = None
    """The client's own input-token count, for requests whose engine reports none."""

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError("timeout_s must be > 0")

    async def one(
        self, req: GenerationRequest, t_sched: float, t_intended: float | None = None
    ) -> RequestRecord:
        """Send ``req`` now; a failure of any kind is recorded on the request, never raised."""
        return await self.follow(req, t_sched, self.start(req, t_sched, t_intended))

    def start(
        self, req: GenerationRequest, t_sched: float, t_intended: float | None = None
    ) -> Started:
        """Hand ``req`` to the engine now (``t_send``): its stream is read by ``follow``.
        Called by the open-loop dispatcher itself at the due time, so that an engine that
        sends when called (the openai client, on a free kept-alive connection) sends then,
        not a turn of the event loop later when a task for the request first runs."""
        t_send = self.clock.now()
        LIVE.sent += 1
        LIVE.lag_s = lag = t_send - (t_sched if t_intended is None else t_intended)
        try:
            stream = self.engine.generate(req)
        except Exception as exc:  # raised at the call: the request failed like any other
            if is_fatal(exc):
                raise
            stream = _failed(exc)
        return Started(t_send, lag, stream)

    async def follow(
        self, req: GenerationRequest, t_sched: float, started: Started
    ) -> RequestRecord:
        """Read a started request's stream to its end; its record."""
        clock = self.clock
        t_send, lag, stream = started
        seen = _Seen()
        error: str | None = None
        # an adapter's own stamp (when its read returned) is on this clock only
        stamped = isinstance(clock, MonotonicClock)
        try:
            async with asyncio.timeout(self.timeout_s):
                async for chunk in stream:
                    at = chunk.received_at
                    seen.take(chunk, at if stamped and at is not None else clock.now())
        except TimeoutError:
            error = f"timeout after {self.timeout_s:g} s"
        except Exception as exc:  # a failed request is counted, never dropped
            if is_fatal(exc):
                raise  # the engine is gone: measuring on would only count its corpse
            error = f"{type(exc).__name__}: {exc}"[:300]
        if error is None and not any(seen.tokens):
            error = "stream ended without any output token"
        if error is None:
            LIVE.completed += 1
        else:
            LIVE.failed += 1
        n_in, source = _n_in(req, seen.prompt_tokens, self.count_input)
        return RequestRecord(
            t_sched=t_sched,
            t_send=t_send,
            t_end=clock.now(),
            chunk_times=tuple(seen.times),
            chunk_tokens=tuple(seen.tokens),
            # empty unless some chunk had reasoning: other streams' records are unchanged
            chunk_reasoning=tuple(seen.reasoning) if any(seen.reasoning) else (),
            n_in=n_in,
            n_in_source=source,
            n_asked=req.max_tokens,
            n_out_reported=seen.reported,
            error=error,
            engine_stats=seen.engine_stats,
            n_out_retokenized=seen.retokenized,
            client_stats=seen.client_stats,
            lag=lag,
        )

    async def closed_loop(
        self,
        requests: Sequence[GenerationRequest],
        concurrency: int,
        min_duration_s: float | None = None,
        min_requests: int = 0,
    ) -> list[RequestRecord]:
        """Every request in order, ``concurrency`` at a time; with ``min_duration_s``,
        users stop taking new requests once that long has passed and ``min_requests``
        have been sent (``requests`` then only bounds the count: the rest are never sent)."""
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        pending = iter(range(len(requests)))
        out: list[RequestRecord | None] = [None] * len(requests)
        stop_at: float | None = None

        async def user() -> None:
            for i in pending:  # shared iterator: each index goes to exactly one user
                # closed loop: a request is due the moment its user is free
                out[i] = await self.one(requests[i], self.clock.now())
                done = stop_at is not None and self.clock.now() >= stop_at
                if done and i + 1 >= min_requests:
                    return

        with gc_paused():  # the window starts after the collection, not before
            # with a duration, ``requests`` only bounds the count: no planned count
            LIVE.begin_window(min_duration_s, len(requests) if min_duration_s is None else None)
            if min_duration_s is not None:
                stop_at = self.clock.now() + min_duration_s
            await asyncio.gather(*(user() for _ in range(concurrency)))
            LIVE.end_window()
        return [r for r in out if r is not None]

    async def open_loop(
        self, requests: Sequence[GenerationRequest], offsets: npt.NDArray[np.float64]
    ) -> list[RequestRecord]:
        if len(requests) != len(offsets):
            raise ValueError("one scheduled offset per request")
        with gc_paused():  # the schedule starts after the collection, not before
            LIVE.begin_window(schedule_span(offsets), len(requests))
            start = self.clock.now()
            # One dispatcher walks the schedule and starts each request when it is due:
            # one timer at a time instead of one per request keeps the loop free for I/O.
            tasks: dict[int, asyncio.Task[RequestRecord]] = {}
            for i in np.argsort(offsets, kind="stable").tolist():
                t_sched = start + float(offsets[i])
                await sleep_until(self.clock, t_sched)
                started = self.start(requests[i], t_sched)
                tasks[i] = asyncio.create_task(self.follow(requests[i], t_sched, started))
            records = [await tasks[i] for i in range(len(requests))]
            LIVE.end_window()
            return records

    async def static_batches(
        self, requests: Sequence[GenerationRequest], offsets: npt.NDArray[np.float64], batch: int
    ) -> list[RequestRecord]:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        with gc_paused():
            LIVE.begin_window(schedule_span(np.asarray(offsets)), len(requests))
            start = self.clock.now()
            due = start + np.asarray(offsets, dtype=np.float64)
            records = await self._groups(requests, due, batch, start)
            LIVE.end_window()
            return records

    async def _groups(
        self,
        requests: Sequence[GenerationRequest],
        due: npt.NDArray[np.float64],
        batch: int,
        start: float,
    ) -> list[RequestRecord]:
        out: list[RequestRecord] = []
        prev_end = start
        for first in range(0, len(requests), batch):
            group = range(first, min(first + batch, len(requests)))
            # released when full and the previous group is done; sleeping past that is lag
            released = max(float(due[group[-1]]), prev_end)
            await sleep_until(self.clock, released)
            out.extend(
                await asyncio.gather(
                    *(self.one(requests[i], float(due[i]), t_intended=released) for i in group)
                )
            )
            prev_end = self.clock.now()
        return out
