"""The async load driver against a fake streaming engine (tests of the harness itself)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from harness.engine import Chunk, GenerationRequest
from harness.load.clock import MonotonicClock
from harness.load.streamdriver import Driver
from harness.metrics.streamtiming import StreamMetrics


class FakeStreamingEngine:
    """Emits ``max_tokens`` tokens, ``per_chunk`` at a time, ``step`` seconds apart."""

    def __init__(
        self, step: float = 0.001, per_chunk: int = 1, fail_every: int = 0, hang: bool = False
    ):
        self.step, self.per_chunk, self.fail_every, self.hang = step, per_chunk, fail_every, hang
        self.active = 0
        self.max_active = 0
        self.calls = 0

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        self.calls += 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.fail_every and self.calls % self.fail_every == 0:
                raise RuntimeError("injected failure")
            if self.hang:
                await asyncio.sleep(3600)
            yield Chunk(n_tokens=0)  # role-only first chunk
            sent = 0
            while sent < request.max_tokens:
                await asyncio.sleep(self.step)
                k = min(self.per_chunk, request.max_tokens - sent)
                sent += k
                yield Chunk(n_tokens=k, completion_tokens=sent)
        finally:
            self.active -= 1


def reqs(n: int, tokens: int = 4) -> list[GenerationRequest]:
    return [GenerationRequest(prompt=(1, 2, 3), max_tokens=tokens) for _ in range(n)]


def test_closed_loop_keeps_concurrency_and_counts_tokens():
    engine = FakeStreamingEngine()
    out = asyncio.run(Driver(engine, MonotonicClock(), 5.0).closed_loop(reqs(10), 3))
    assert len(out) == 10
    assert engine.max_active == 3
    assert all(r.ok and r.n_out == 4 and r.n_in == 3 for r in out)
    assert all(r.t_first > r.t_send for r in out)  # the role-only chunk did not count


def test_open_loop_sends_on_schedule_and_measures_from_it():
    engine = FakeStreamingEngine(step=0.002)
    offsets = np.array([0.0, 0.05, 0.10])
    out = asyncio.run(Driver(engine, MonotonicClock(), 5.0).open_loop(reqs(3), offsets))
    gaps = np.diff([r.t_sched for r in out])
    assert gaps == pytest.approx([0.05, 0.05], abs=1e-9)
    # each sent before the next was due (the real clock, beside other tests: not 20 ms)
    assert all(0 <= r.lag < 0.05 for r in out)


def test_static_batches_release_groups_only_after_the_previous_one():
    engine = FakeStreamingEngine(step=0.005)
    offsets = np.zeros(6)
    out = asyncio.run(Driver(engine, MonotonicClock(), 5.0).static_batches(reqs(6), offsets, 2))
    assert engine.max_active == 2
    first, second = out[:2], out[2:4]
    assert min(r.t_send for r in second) >= max(r.t_end for r in first)
    # waiting for the previous group is queueing (counted from t_sched), not generator lag
    assert second[0].t_send - second[0].t_sched > 0.01
    assert all(r.lag < 0.05 for r in out)


def test_failures_and_timeouts_are_counted_never_dropped():
    out = asyncio.run(
        Driver(FakeStreamingEngine(fail_every=2), MonotonicClock(), 5.0).closed_loop(reqs(4), 1)
    )
    assert [r.error for r in out] == [
        None,
        "RuntimeError: injected failure",
        None,
        "RuntimeError: injected failure",
    ]
    hung = asyncio.run(
        Driver(FakeStreamingEngine(hang=True), MonotonicClock(), 0.05).closed_loop(reqs(2), 2)
    )
    assert [r.error for r in hung] == ["timeout after 0.05 s"] * 2
    m = StreamMetrics([*out, *hung]).to_json()
    assert m["requests"] == {"total": 6, "ok": 2, "failed": 4, "met_slo": 2}


def test_multi_token_chunks_keep_exact_counts():
    out = asyncio.run(
        Driver(FakeStreamingEngine(per_chunk=3), MonotonicClock(), 5.0).closed_loop(reqs(2, 7), 2)
    )
    assert [r.chunk_tokens for r in out] == [(0, 3, 3, 1)] * 2
    assert all(len(r.itl()) == 4 for r in out)  # 7 tokens, the first chunk's 3 are TTFT


def test_closed_loop_with_a_minimum_duration_stops_taking_requests_after_it():
    engine = FakeStreamingEngine(step=0.01)
    out = asyncio.run(Driver(engine, MonotonicClock(), 5.0).closed_loop(reqs(200), 2, 0.1))
    # 4 tokens at 10 ms: ~40 ms a request, 2 users: ~3 rounds before 0.1 s, then stop
    assert 4 <= len(out) <= 10
    span = max(r.t_end for r in out) - min(r.t_sched for r in out)
    assert 0.1 <= span < 0.3
    assert all(r.ok for r in out)


def test_closed_loop_runs_past_its_minimum_duration_until_its_minimum_requests():
    engine = FakeStreamingEngine(step=0.005)
    driver = Driver(engine, MonotonicClock(), 5.0)
    out = asyncio.run(driver.closed_loop(reqs(200), 2, 0.01, min_requests=20))
    assert 20 <= len(out) <= 22
