"""The slow-request log keeps the tail with its spans, lag and surrounding telemetry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engines.null import NullEngine
from harness.engine import EngineConfig
from harness.load.arrivals import Arrivals, OpenLoop
from harness.load.clock import MonotonicClock
from harness.load.serve_summary import summarize_trace
from harness.load.serving import NoBatching, serve_open_loop
from harness.metrics import slowlog
from harness.metrics.streamtiming import parse_slos
from harness.metrics.telemetry import Telemetry
from tests.support.fakes import FakeClock

X = {"x": np.zeros((1, 4), dtype=np.float32)}


def _serve(stall_at: int, stall_s: float, n: int = 300, rate: float = 200.0):
    engine = NullEngine(
        EngineConfig(
            model=Path("-"),
            options={
                "service_time_s": "0.0002",
                "stall_at": str(stall_at),
                "stall_s": str(stall_s),
            },
        )
    )
    engine.load()
    clock = MonotonicClock()

    def run_batch(indices):
        t0 = clock.now()
        engine.infer(X)
        return {"infer": clock.now() - t0}

    offsets = OpenLoop(rate=rate, duration=n / rate, arrivals=Arrivals.CONSTANT).schedule(0)
    return serve_open_loop(offsets, NoBatching(), run_batch, clock)


def _serve_fake(stall_call: int, stall_s: float, n: int, rate: float):
    """The same open loop on a fake clock: the engine's time is exactly what we say."""
    clock = FakeClock()
    calls = 0

    def run_batch(indices):
        nonlocal calls
        calls += 1
        t0 = clock.now()
        clock.advance(0.0002 + (stall_s if calls == stall_call else 0.0))
        return {"infer": clock.now() - t0}

    offsets = OpenLoop(rate=rate, duration=n / rate, arrivals=Arrivals.CONSTANT).schedule(0)
    return serve_open_loop(offsets, NoBatching(), run_batch, clock)


def test_one_stalled_request_is_logged_with_the_span_that_explains_it():
    # a 30 ms stall at 400 req/s: the stalled request and the few queued behind it.
    # On a fake clock, so a noisy machine cannot add a tail of its own.
    trace = _serve_fake(stall_call=500, stall_s=0.030, n=1000, rate=400.0)
    summary = summarize_trace(trace, offered_rate=400.0)
    log = summary.slow
    assert log is not None
    p99 = summary.metrics["e2e"]["p99"]
    assert log.threshold_s == 2 * p99
    # 13 requests queue behind the stall, each 2.3 ms less late than the one before;
    # p99 (nearest rank 990 of 1000: the 11th slowest) is 7.2 ms, so the 7 over
    # 14.4 ms are logged
    assert p99 == pytest.approx(0.0072, abs=1e-9)
    assert log.total == len(log.requests) == 7
    worst = log.requests[0]
    assert worst.latency_s >= 0.030
    assert worst.index == 499  # the 500th call is the stalled one
    assert worst.spans["infer"] >= 0.029  # the engine, not the queue, took the time
    assert worst.spans["queue"] < 0.005
    assert "x p99" in worst.why
    # sorted slowest first
    assert [r.latency_s for r in log.requests] == sorted(
        (r.latency_s for r in log.requests), reverse=True
    )


def test_requests_over_the_slo_are_logged_with_telemetry_around_them():
    sampler = Telemetry(interval_s=0.05)
    sampler.start()
    trace = _serve(stall_at=100, stall_s=0.3, n=200)
    telemetry = sampler.stop()
    slos = parse_slos("e2e_p99=50ms")
    summary = summarize_trace(trace, offered_rate=200.0, slos=slos)
    log = summary.slow
    assert log is not None
    assert log.threshold_s == 0.050  # below 2 x p99: the SLO sets the bar
    # the requests due during the stall queued behind it: about 0.25 s worth at 200/s
    assert 40 <= log.total <= 70
    assert all(r.latency_s > 0.050 for r in log.requests)
    queued = [r for r in log.requests if r.spans["queue"] > 0.05]
    assert queued, "requests behind the stall waited in the queue"
    entries = slowlog.with_telemetry(log, telemetry, sampler.origin)
    first = entries[0]
    assert first["why"].endswith("> SLO 50 ms")
    assert 0.4 <= first["t_sched_s"] <= 0.9  # the stall began at the 100th request (0.5 s)
    around = first["telemetry"]
    assert around["t"], "samples taken while it ran"
    assert all(first["t_sched_s"] - 0.06 <= t for t in around["t"])
    assert len(around["rss_bytes"]) == len(around["t"])
    assert (
        summary.metrics["throughput"]["goodput_requests_per_s"]
        < (summary.metrics["throughput"]["requests_per_s"])
    )
    assert summary.metrics["slo"]["e2e_p99"]["met"] is False


def test_no_threshold_without_p99_or_slo():
    latency = np.full(50, 0.01)
    assert slowlog.select(latency, np.zeros(50), p99_s=None) is None
