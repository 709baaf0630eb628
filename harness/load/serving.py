"""Harness-side batching in front of a tensor engine, and the open-loop serving loop.

Policies are pure decisions (``decide``) over the queue state, so their semantics can
be checked under a fake clock: a dynamic batch closes when ``max_batch`` requests are
queued or when the oldest has waited ``max_delay``, whichever comes first, never later
(unless the engine is still busy with the previous batch, which is queueing the
measurement must show).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Protocol

import numpy as np
import numpy.typing as npt

from harness.engine import BatchingMode, is_fatal
from harness.load.clock import Clock, gc_paused
from harness.load.livecounters import LIVE, schedule_span
from harness.load.saturation import EarlyStop, Watch
from harness.metrics import stats


@dataclass(frozen=True)
class Dispatch:
    """Run the ``size`` oldest queued requests now; ``flushed``: a partial end-of-stream batch."""

    size: int
    flushed: bool = False


@dataclass(frozen=True)
class Wait:
    """Nothing to run yet; wake at ``until`` (None: at the next arrival)."""

    until: float | None = None


Decision = Dispatch | Wait


class BatchPolicy(Protocol):
    @property
    def mode(self) -> BatchingMode: ...

    @property
    def max_batch(self) -> int: ...

    def decide(self, queued: int, oldest: float | None, now: float, more_coming: bool) -> Decision:
        """``oldest``: scheduled time of the oldest queued request (None when empty)."""
        ...


@dataclass(frozen=True)
class NoBatching:
    """Every request runs alone, first come first served."""

    @property
    def mode(self) -> BatchingMode:
        return BatchingMode.NONE

    @property
    def max_batch(self) -> int:
        return 1

    def decide(self, queued: int, oldest: float | None, now: float, more_coming: bool) -> Decision:
        return Dispatch(1) if queued else Wait()


@dataclass(frozen=True)
class StaticBatching:
    """Fixed batch of ``size``: waits until it is full; the last partial batch is flushed."""

    size: int

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"static batch size must be >= 1, got {self.size}")

    @property
    def mode(self) -> BatchingMode:
        return BatchingMode.STATIC

    @property
    def max_batch(self) -> int:
        return self.size

    def decide(self, queued: int, oldest: float | None, now: float, more_coming: bool) -> Decision:
        if queued >= self.size:
            return Dispatch(self.size)
        if queued and not more_coming:
            return Dispatch(queued, flushed=True)
        return Wait()


@dataclass(frozen=True)
class DynamicBatching:
    """Up to ``max_batch`` requests; a batch closes at ``max_batch`` or ``max_delay`` seconds."""

    max_size: int
    max_delay: float

    def __post_init__(self) -> None:
        if self.max_size < 1:
            raise ValueError(f"max batch must be >= 1, got {self.max_size}")
        if self.max_delay < 0:
            raise ValueError(f"max queue delay must be >= 0 s, got {self.max_delay}")

    @property
    def mode(self) -> BatchingMode:
        return BatchingMode.DYNAMIC

    @property
    def max_batch(self) -> int:
        return self.max_size

    def decide(self, queued: int, oldest: float | None, now: float, more_coming: bool) -> Decision:
        if queued >= self.max_size:
            return Dispatch(self.max_size)
        if queued and oldest is not None:
            deadline = oldest + self.max_delay
            if now >= deadline:
                return Dispatch(queued)
            return Wait(deadline)
        return Wait()


@dataclass
class ServeTrace:
    """Everything the serving loop observed, in absolute clock seconds."""

    t_sched: npt.NDArray[np.float64]
    t_send: npt.NDArray[np.float64]
    t_done: npt.NDArray[np.float64]
    failed: npt.NDArray[np.bool_]
    batch_sizes: list[int] = field(default_factory=list)
    batch_latency: list[float] = field(default_factory=list)
    batch_infer: list[float] = field(default_factory=list)
    flushed_batches: int = 0
    lag: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    batch_spans: list[dict[str, float]] = field(default_factory=list)
    batch_of: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    early_stop: EarlyStop | None = None
    """Set when a ``Watch`` stopped the loop: the arrays then hold the answered requests
    only, and the evidence counts the ones cut off."""

    def request_spans(self) -> dict[str, npt.NDArray[np.float64]]:
        """Per request: ``queue`` (due to dispatch), its batch's stages, and ``other``
        (the rest of its service time: collation the stages missed, harness overhead)."""
        names = sorted({k for spans in self.batch_spans for k in spans})
        per_batch = {k: np.array([b.get(k, np.nan) for b in self.batch_spans]) for k in names}
        out = {"queue": self.t_send - self.t_sched}
        staged = np.zeros(self.t_sched.size)
        for k in names:
            out[k] = per_batch[k][self.batch_of] if self.batch_spans else np.full(0, np.nan)
            if not stats.is_nested(k):  # ``infer.compute`` is already inside ``infer``
                staged = staged + np.nan_to_num(out[k])
        out["other"] = (self.t_done - self.t_send) - staged
        return out

    @property
    def window(self) -> float:
        """From the first scheduled arrival to the last completion."""
        return float(self.t_done.max() - self.t_sched.min()) if self.t_sched.size else 0.0


RunBatch = Callable[[Sequence[int]], float | Mapping[str, float]]
"""Runs the requests with these indices as one batch; returns the engine's infer seconds,
or the batch's stage spans (``preprocess``, ``infer``, ``postprocess``) in seconds."""


def serve_open_loop(
    offsets: npt.NDArray[np.float64],
    policy: BatchPolicy,
    run_batch: RunBatch,
    clock: Clock,
    timeout_s: float = math.inf,
    *,
    watch: Watch | None = None,
) -> ServeTrace:
    """Serve requests due at ``offsets`` (seconds from now) through ``policy``.

    Single-threaded on purpose: the loop either runs a batch or sleeps until the next
    event (arrival or batch deadline), so the only harness overhead is its wake-up lag,
    which it records for every sleep. A request answered more than ``timeout_s`` after it
    was due has failed (its client gave up); a synchronous call cannot be abandoned, so
    one that never returns is left to the cell's deadline. A ``watch`` (a search's point)
    may stop the loop early when the system is saturated (harness.load.saturation).
    """
    with gc_paused():
        LIVE.begin_window(schedule_span(offsets), int(offsets.size))
        trace = _serve(offsets, policy, run_batch, clock, watch)
        LIVE.end_window()
    _apply_timeout(trace, timeout_s)
    return trace


def _apply_timeout(trace: ServeTrace, timeout_s: float) -> None:
    late = ~trace.failed & ((trace.t_done - trace.t_sched) > timeout_s)
    if late.any():
        trace.failed |= late
        key = f"timeout after {timeout_s:g} s"
        trace.errors[key] = trace.errors.get(key, 0) + int(late.sum())
        LIVE.completed -= int(late.sum())  # answered, but after its client gave up
        LIVE.failed += int(late.sum())


def _serve(
    offsets: npt.NDArray[np.float64],
    policy: BatchPolicy,
    run_batch: RunBatch,
    clock: Clock,
    watch: Watch | None = None,
) -> ServeTrace:
    n = int(offsets.size)
    start = clock.now()
    t_sched = start + np.asarray(offsets, dtype=np.float64)
    trace = ServeTrace(
        t_sched=t_sched,
        t_send=np.full(n, np.nan),
        t_done=np.full(n, np.nan),
        failed=np.zeros(n, dtype=np.bool_),
        batch_of=np.full(n, -1, dtype=np.int64),
    )
    queue: deque[int] = deque()
    nxt = 0
    while nxt < n or queue:
        now = clock.now()
        while nxt < n and t_sched[nxt] <= now:
            queue.append(nxt)
            nxt += 1
        if watch is not None and watch.due(now - start):
            answered = nxt - len(queue)  # first come first served: a prefix is answered
            stop = watch.check(now - start, nxt, answered, partial(_answered, trace, answered))
            if stop is not None:
                return _cut(trace, answered, replace(stop, unsent=n - nxt))
        oldest = float(t_sched[queue[0]]) if queue else None
        decision = policy.decide(len(queue), oldest, now, nxt < n)
        if isinstance(decision, Dispatch):
            batch = [queue.popleft() for _ in range(decision.size)]
            _run_one_batch(batch, run_batch, clock, trace)
            trace.flushed_batches += int(decision.flushed)
            continue
        wake = _next_wake(decision, t_sched, nxt)
        if wake is None:
            raise RuntimeError(f"{policy!r} waits forever with {len(queue)} queued requests")
        clock.sleep_until(wake)
        lag = clock.now() - wake
        trace.lag.append(lag)
        LIVE.lag_s = lag
    return trace


def _answered(
    trace: ServeTrace, answered: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    ok = ~trace.failed[:answered]
    t_sched = trace.t_sched[:answered][ok]
    return t_sched - trace.t_sched[0], trace.t_done[:answered][ok] - t_sched


def _cut(trace: ServeTrace, answered: int, stop: EarlyStop) -> ServeTrace:
    """The trace of the answered requests (a prefix: batches leave the queue in order);
    the unanswered and unsent ones are counted in ``stop``."""
    trace.t_sched, trace.t_send = trace.t_sched[:answered], trace.t_send[:answered]
    trace.t_done, trace.failed = trace.t_done[:answered], trace.failed[:answered]
    trace.batch_of = trace.batch_of[:answered]
    trace.early_stop = stop
    return trace


def _next_wake(decision: Wait, t_sched: npt.NDArray[np.float64], nxt: int) -> float | None:
    candidates = [float(t_sched[nxt])] if nxt < t_sched.size else []
    if decision.until is not None:
        candidates.append(decision.until)
    return min(candidates) if candidates else None


def _run_one_batch(batch: list[int], run_batch: RunBatch, clock: Clock, trace: ServeTrace) -> None:
    t_send = clock.now()
    LIVE.sent += len(batch)
    spans: Mapping[str, float] = {}
    try:
        result = run_batch(batch)
        spans = {"infer": result} if isinstance(result, float | int) else result
        infer = float(spans.get("infer", float("nan")))
        LIVE.completed += len(batch)
    except Exception as exc:  # a failed batch fails its requests; the run goes on
        if is_fatal(exc):
            raise  # the engine is gone: measuring on would only count its corpse
        infer = float("nan")
        trace.failed[batch] = True
        LIVE.failed += len(batch)
        key = f"{type(exc).__name__}: {exc}"[:300]
        trace.errors[key] = trace.errors.get(key, 0) + 1
    t_done = clock.now()
    trace.t_send[batch] = t_send
    trace.t_done[batch] = t_done
    trace.batch_of[batch] = len(trace.batch_sizes)
    trace.batch_spans.append(dict(spans))
    trace.batch_sizes.append(len(batch))
    trace.batch_latency.append(t_done - t_send)
    trace.batch_infer.append(infer)
