"""Load generation for pooling requests (embeddings, scores, reranking), on asyncio.

A pooling request is answered whole, so it is timed like a served tensor request: from
its scheduled time (``t_sched``; in a closed loop, the moment its user is free) through
its send to its answer. What the loop observes becomes a ``ServeTrace``, so the summary
is ``summarize_trace``'s (E2E from the scheduled time, queueing, generator lag, the
slow-request log, goodput under the SLOs), with each request's inputs and prompt tokens
beside it for the rates pooling is judged by: inputs/s and tokens/s.

* closed loop: ``users`` users, each sends its next request when its last one ends;
* open loop: every request is sent at its scheduled time whatever the engine is doing,
  by one dispatcher that starts a task per request (no coordinated omission).

A failed request (an exception, a timeout, an answer whose output count is not its
input count) is counted with its error, never dropped; a fatal engine error is raised.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.engine import PoolingEngine, PoolingRequest, PoolingResult, is_fatal
from harness.load.clock import Clock, gc_paused
from harness.load.livecounters import LIVE, schedule_span
from harness.load.serve_summary import TraceSummary, summarize_trace
from harness.load.serving import ServeTrace
from harness.load.streamdriver import sleep_until
from harness.metrics import stats
from harness.metrics.slo import SLO


@dataclass(frozen=True)
class PoolOutcome:
    """One request as the client saw it: when it was due, sent and answered, and what
    came back (``result``) or why not (``error``)."""

    t_sched: float
    t_send: float
    t_done: float
    lag: float | None
    result: PoolingResult | None = None
    error: str | None = None


@dataclass(frozen=True)
class PoolTrace:
    """A run's requests and outcomes, in request order."""

    requests: tuple[PoolingRequest, ...]
    outcomes: tuple[PoolOutcome, ...]

    def __post_init__(self) -> None:
        if len(self.requests) != len(self.outcomes):
            raise ValueError("one outcome per request")

    def serve_trace(self) -> ServeTrace:
        """The outcomes as the serving loop's trace (one request per "batch" of its own:
        what a pooling request batches is its own inputs, inside the engine)."""
        out = self.outcomes
        errors = Counter(o.error for o in out if o.error is not None)
        return ServeTrace(
            t_sched=np.array([o.t_sched for o in out], dtype=np.float64),
            t_send=np.array([o.t_send for o in out], dtype=np.float64),
            t_done=np.array([o.t_done for o in out], dtype=np.float64),
            failed=np.array([o.error is not None for o in out], dtype=np.bool_),
            lag=[o.lag for o in out if o.lag is not None],
            errors=dict(errors),
        )


@dataclass(frozen=True)
class PoolDriver:
    """Sends pooling requests to one engine and records what the client saw."""

    engine: PoolingEngine
    clock: Clock
    timeout_s: float

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError("timeout_s must be > 0")

    async def one(
        self, req: PoolingRequest, t_sched: float, lag: float | None = None
    ) -> PoolOutcome:
        """Send ``req`` now; any failure is recorded on its outcome, never raised."""
        t_send = self.clock.now()
        LIVE.sent += 1
        result, error = None, None
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await self.engine.pool(req)
        except TimeoutError:
            error = f"timeout after {self.timeout_s:g} s"
        except Exception as exc:  # a failed request is counted, never dropped
            if is_fatal(exc):
                raise  # the engine is gone: measuring on would only count its corpse
            error = f"{type(exc).__name__}: {exc}"[:300]
        t_done = self.clock.now()
        if result is not None and result.n_outputs != len(req.inputs):
            error = f"the engine returned {result.n_outputs} outputs for {len(req.inputs)} inputs"
        if error is None:
            LIVE.completed += 1
        else:
            LIVE.failed += 1
        return PoolOutcome(t_sched, t_send, t_done, lag, result if error is None else None, error)

    async def closed_loop(
        self,
        requests: Sequence[PoolingRequest],
        users: int,
        min_duration_s: float | None = None,
        min_requests: int = 0,
    ) -> PoolTrace:
        """``users`` users at a time, each sending its next request when its last one
        ends: every request once, in order; with ``min_duration_s``, the requests over
        and over until that long has passed and ``min_requests`` were sent (a fast engine
        is measured over a window, not over a count it finishes in a blink)."""
        if users < 1:
            raise ValueError("users must be >= 1")
        if not requests:
            raise ValueError("a closed loop needs requests")
        count = itertools.count()
        out: dict[int, PoolOutcome] = {}
        stop_at: float | None = None

        def more(i: int) -> bool:
            if stop_at is None:
                return i < len(requests)
            return i < min_requests or self.clock.now() < stop_at

        async def user() -> None:
            # one shared counter: each index goes to exactly one user
            while more(i := next(count)):
                out[i] = await self.one(requests[i % len(requests)], self.clock.now())

        with gc_paused():
            LIVE.begin_window(min_duration_s, len(requests) if min_duration_s is None else None)
            if min_duration_s is not None:
                stop_at = self.clock.now() + min_duration_s
            await asyncio.gather(*(user() for _ in range(users)))
            LIVE.end_window()
        done = sorted(out)
        return PoolTrace(
            tuple(requests[i % len(requests)] for i in done), tuple(out[i] for i in done)
        )

    async def open_loop(
        self, requests: Sequence[PoolingRequest], offsets: npt.NDArray[np.float64]
    ) -> PoolTrace:
        """Each request sent at its offset (seconds from the start) whatever the engine
        is doing; its latency counts from then."""
        if len(requests) != len(offsets):
            raise ValueError("one scheduled offset per request")
        with gc_paused():
            LIVE.begin_window(schedule_span(offsets), len(requests))
            start = self.clock.now()
            tasks: dict[int, asyncio.Task[PoolOutcome]] = {}
            for i in np.argsort(offsets, kind="stable").tolist():
                t_sched = start + float(offsets[i])
                await sleep_until(self.clock, t_sched)
                LIVE.lag_s = lag = self.clock.now() - t_sched
                tasks[i] = asyncio.create_task(self.one(requests[i], t_sched, lag))
            outcomes = tuple([await tasks[i] for i in range(len(requests))])
            LIVE.end_window()
        return PoolTrace(tuple(requests), outcomes)


POOLED_LATENCIES = ("e2e",)
"""What a pooling request is held to: its whole latency from its scheduled time."""


def summarize_pooling(
    run: PoolTrace, offered_rate: float | None, slos: Sequence[SLO] = ()
) -> TraceSummary:
    """``summarize_trace``'s summary of the run (``offered_rate`` None: a closed loop),
    with the inputs and prompt tokens completed, their rates and intervals, and the
    per-request samples of both."""
    summary = summarize_trace(run.serve_trace(), offered_rate or 0.0, slos)
    evidence = summary.evidence
    if offered_rate is None:  # a closed loop offers no rate to fall behind
        evidence = dataclasses.replace(evidence, offered_rate=None, achieved_rate=None)
    ok = [(r, o.result) for r, o in zip(run.requests, run.outcomes, strict=True) if o.result]
    inputs = [len(r.inputs) for r, _ in ok]
    tokens = [res.prompt_tokens for _, res in ok]
    window = evidence.window_s
    metrics = dict(summary.metrics)
    metrics["throughput"] = {**metrics["throughput"], **_rates(inputs, tokens, window)}
    metrics["pooling"] = _account(run, inputs, tokens, [res for _, res in ok])
    samples = dict(summary.samples) | {"inputs": [float(n) for n in inputs]}
    if tokens and None not in tokens:
        samples["prompt_tokens"] = [float(t or 0) for t in tokens]
    return dataclasses.replace(summary, metrics=metrics, evidence=evidence, samples=samples)


def _rates(inputs: list[int], tokens: list[int | None], window: float) -> dict[str, Any]:
    """Inputs and prompt tokens completed per second of the window, with the exact
    Poisson interval of the inputs' count; tokens/s None where the engine counted none."""
    if window <= 0:
        return {"inputs_per_s": 0.0, "inputs_per_s_ci95": [], "tokens_per_s": None}
    n_inputs = sum(inputs)
    counted = None not in tokens
    return {
        "inputs_per_s": n_inputs / window,
        "inputs_per_s_ci95": list(stats.rate_ci(n_inputs, window)),
        "tokens_per_s": sum(t or 0 for t in tokens) / window if counted else None,
    }


def _account(
    run: PoolTrace, inputs: list[int], tokens: list[int | None], results: list[PoolingResult]
) -> dict[str, Any]:
    """What the run sent and what came back: kinds, batch sizes, inputs and tokens
    completed, the vectors' dimensions, and where the token count came from."""
    counted = [t for t in tokens if t is not None]
    return {
        "kinds": sorted({r.kind for r in run.requests}),
        "batch_sizes": sorted({len(r.inputs) for r in run.requests}),
        "inputs_sent": sum(len(r.inputs) for r in run.requests),
        "inputs_completed": sum(inputs),
        "prompt_tokens": sum(counted) if len(counted) == len(tokens) else None,
        "token_source": "engine"
        if len(counted) == len(tokens)
        else f"the engine counted the tokens of {len(counted)} of {len(tokens)} answers",
        "dims": sorted({r.dims for r in results if r.dims}),
    }
