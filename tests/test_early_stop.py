"""Over-saturation early stop (harness.load.saturation): a search's rate point whose queue
and latency grow without bound stops early, is recorded as saturated with its evidence,
and the search moves on; a healthy point never stops.

The serving loop runs on a fake clock against a simulated server with a fixed service
time (a D/1 queue fed by Poisson arrivals), so every figure here is exact and instant: a
capacity search with early stop finds the same capacity as one without, in fewer
(simulated) seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from harness.exceptions import UsageError
from harness.load.arrivals import OpenLoop
from harness.load.capacity import (
    CapacityResult,
    KneeRule,
    Point,
    SearchPolicy,
    Stop,
    capacity_search,
    sweep,
)
from harness.load.saturation import EarlyStop, EarlyStopRule, Watch
from harness.load.serve_summary import summarize_trace
from harness.load.serving import NoBatching, ServeTrace, serve_open_loop
from harness.metrics.slo import parse_slos
from harness.session.config import PROFILES, ProfileName, RunSettings
from harness.session.pytestoptions import parse_settings
from tests.support.fakes import FakeClock
from workloads.lib.load import measured

SERVICE_S = 0.02  # the simulated server completes 50 requests/s, no more
WINDOW_S = PROFILES[ProfileName.QUICK].window_s
RULE = EarlyStopRule.for_policy(PROFILES[ProfileName.QUICK].policy)


def serve(
    rate: float, seed: int, clock: FakeClock, rule: EarlyStopRule | None = RULE
) -> ServeTrace:
    """A Poisson point at ``rate`` against the simulated server, on ``clock``."""

    def run_batch(indices: Sequence[int]) -> float:
        clock.advance(SERVICE_S * len(indices))
        return SERVICE_S

    offsets = OpenLoop(rate=rate, duration=WINDOW_S).schedule(seed)
    watch = Watch(rule, WINDOW_S, rate) if rule is not None else None
    return serve_open_loop(offsets, NoBatching(), run_batch, clock, watch=watch)


# --- the detector alone, fed synthetic observations -------------------------------------


def observe(
    watch: Watch, until: float, backlog: Callable[[float], int], latency: Callable[[float], float]
) -> EarlyStop | None:
    """Ask ``watch`` whenever it is due, every 10 ms of (synthetic) time, at 200/s."""
    t = 0.0
    while t < until:
        t = round(t + 0.01, 6)
        if not watch.due(t):
            continue
        arrived = int(200 * t)
        answered = arrived - backlog(t)
        sched = np.linspace(0.0, t, answered)
        stop = watch.check(t, arrived, answered, partial(answered_at, sched, latency))
        if stop is not None:
            return stop
    return None


def answered_at(
    sched: np.ndarray, latency: Callable[[float], float]
) -> tuple[np.ndarray, np.ndarray]:
    """The answered requests' offsets and latencies, with +-10 % noise."""
    rng = np.random.default_rng(len(sched))
    noise = rng.uniform(0.9, 1.1, sched.size)
    return sched, np.array([latency(float(t)) for t in sched]) * noise


def test_a_growing_queue_with_rising_latency_stops_after_two_confirmations() -> None:
    watch = Watch(RULE, WINDOW_S, offered_rate=200.0)
    stop = observe(watch, WINDOW_S, lambda t: int(100 * t), lambda t: 0.01 + 0.5 * t)
    assert stop is not None
    # not before the profile's minimum window and a quarter of the planned one, and the
    # first positive check is confirmed by the next (checks every 5 % of the window)
    assert 1.2 <= stop.at_s <= 1.25
    assert stop.backlog == int(100 * stop.at_s)
    assert stop.backlog_slope_per_s == pytest.approx(100.0, rel=0.05)
    assert stop.latency_slope == pytest.approx(0.5, rel=0.1)
    assert stop.completion_rate == pytest.approx(100.0, rel=0.01)
    assert stop.trend.startswith("latency trends over the window:")
    assert "rising" in stop.trend
    assert stop.saved_s == pytest.approx(WINDOW_S - stop.at_s)
    assert stop.used_fraction == pytest.approx(stop.at_s / WINDOW_S)


def test_a_steady_queue_never_stops() -> None:
    watch = Watch(RULE, WINDOW_S, offered_rate=200.0)
    assert observe(watch, WINDOW_S, lambda t: 3, lambda t: 0.02) is None


def test_rising_latency_alone_does_not_stop_a_point_that_keeps_up() -> None:
    """Both must grow: latency rising while the backlog stays put is a trend warning for
    the full window to report, not saturation."""
    watch = Watch(RULE, WINDOW_S, offered_rate=200.0)
    assert observe(watch, WINDOW_S, lambda t: 2, lambda t: 0.01 + 0.5 * t) is None


def test_a_growing_queue_whose_latency_does_not_rise_does_not_stop() -> None:
    watch = Watch(RULE, WINDOW_S, offered_rate=200.0)
    assert observe(watch, WINDOW_S, lambda t: int(100 * t), lambda t: 0.05) is None


def test_one_positive_check_is_not_enough() -> None:
    rule = EarlyStopRule(min_elapsed_s=1.0, confirmations=3)
    watch = Watch(rule, WINDOW_S, offered_rate=200.0)
    # saturated until 1.35 s, then the queue empties: the streak never reaches 3
    stop = observe(
        watch, WINDOW_S, lambda t: int(100 * t) if t < 1.35 else 0, lambda t: 0.01 + 0.5 * t
    )
    assert stop is None


def test_the_rule_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="min_samples"):
        EarlyStopRule(min_elapsed_s=1.0, min_samples=10)
    with pytest.raises(ValueError, match="min_fraction"):
        EarlyStopRule(min_elapsed_s=1.0, min_fraction=1.5)
    with pytest.raises(ValueError, match="window"):
        Watch(RULE, 0.0, 100.0)


# --- in the serving loop ---------------------------------------------------------------


@pytest.mark.parametrize("load", [0.5, 0.8, 0.9, 0.95])
def test_a_healthy_point_never_stops(load: float) -> None:
    for seed in range(10):
        clock = FakeClock()
        trace = serve(load / SERVICE_S, seed, clock)
        assert trace.early_stop is None
        assert not np.isnan(trace.t_done).any()


def test_a_saturated_point_stops_and_accounts_for_every_request() -> None:
    clock = FakeClock()
    rate = 2.5 / SERVICE_S
    n = OpenLoop(rate=rate, duration=WINDOW_S).schedule(1).size
    trace = serve(rate, 1, clock)
    stop = trace.early_stop
    assert stop is not None
    assert 1.0 <= stop.at_s < 0.6 * WINDOW_S
    # answered, cut off in the queue and never sent: every scheduled request, once
    assert trace.t_sched.size + stop.backlog + stop.unsent == n
    assert not np.isnan(trace.t_done).any()
    assert clock.t < WINDOW_S  # it did not drain a queue of (2.5 - 1) x 4 s either
    s = summarize_trace(trace, n / WINDOW_S, parse_slos("e2e_p99=400ms"))
    assert s.early_stop is stop
    assert s.metrics["requests"]["cut_off"] == stop.backlog + stop.unsent
    assert s.metrics["requests"]["ok"] == trace.t_sched.size
    assert s.metrics["early_stop"]["saved_s"] == pytest.approx(WINDOW_S - stop.at_s)
    assert any(note.startswith("stopped early at") for note in s.evidence.notes)


def test_without_a_watch_the_same_point_runs_and_drains_in_full() -> None:
    clock = FakeClock()
    trace = serve(2.5 / SERVICE_S, 1, clock, rule=None)
    assert trace.early_stop is None
    assert clock.t > 2 * WINDOW_S  # the queue drains after the schedule ends


# --- in the searches -------------------------------------------------------------------


def settings(tmp_path: Path) -> RunSettings:
    return parse_settings(
        engine=["null"], device="cpu", profile="quick", results_dir=str(tmp_path), seed=0
    )


def simulated(
    tmp_path: Path, rule: EarlyStopRule | None
) -> tuple[Callable[[float], Point], FakeClock]:
    """A search's ``measure`` over the simulated server, each point judged as a cell."""
    clock, run = FakeClock(), settings(tmp_path)
    slos = parse_slos("e2e_p99=400ms")

    def measure(rate: float) -> Point:
        trace = serve(rate, int(rate), clock, rule)
        s = summarize_trace(trace, rate, slos)
        return measured(rate, s, run, s.early_stop).point

    return measure, clock


SEARCH = SearchPolicy(start=125.0, floor=6.25, ceiling=50_000.0, tolerance=0.15, max_points=8)


def search(tmp_path: Path, rule: EarlyStopRule | None) -> tuple[CapacityResult, float]:
    measure, clock = simulated(tmp_path, rule)
    return capacity_search(measure, SEARCH), clock.t


def test_capacity_search_finds_the_same_capacity_faster(tmp_path: Path) -> None:
    full, full_s = search(tmp_path, None)
    early, early_s = search(tmp_path, RULE)
    assert full.capacity is not None
    assert early.capacity is not None
    # within one step of the search (its tolerance); here the very same point
    assert early.capacity.load / full.capacity.load == pytest.approx(1.0, abs=SEARCH.tolerance)
    assert early.capacity.load == full.capacity.load
    assert early_s < 0.75 * full_s
    stopped = [p for p in early.points if p.early_stop is not None]
    # only points offered more than the server completes (50/s): 2.5x, 1.25x, ...
    assert [p.load for p in stopped][:2] == [125.0, 62.5]
    assert all(p.load > 1 / SERVICE_S and not p.passes for p in stopped)
    doc = early.to_json()
    assert doc["early_stop"]["points"] == [p.load for p in stopped]
    assert doc["early_stop"]["saved_s"] == pytest.approx(
        sum(p.early_stop.saved_s for p in stopped if p.early_stop)
    )
    assert full.to_json()["early_stop"] == {"points": [], "saved_s": 0.0}
    point = doc["points"][0]
    assert point["stopped_early"] is True
    assert point["early_stop"]["cut_off"]["unanswered"] > 0
    assert "stopped_early" not in full.to_json()["points"][0]


def test_a_sweep_counts_a_stopped_point_as_the_blow_up(tmp_path: Path) -> None:
    measure, _ = simulated(tmp_path, RULE)
    # loose latency and throughput bounds (a 4 s window's Poisson count varies by ~10 %):
    # the point that blows up must be the one stopped early
    rule = KneeRule(latency_factor=10.0, min_achieved=0.8)
    result = sweep(measure, (30.0, 40.0, 100.0, 200.0), rule)
    assert result.stop is Stop.BLOWUP
    assert result.knee is not None
    assert result.knee.load == 40.0
    assert result.why.startswith("at 100: stopped early at")
    assert result.to_json()["knee_is_lower_bound"] is False
    assert result.to_json()["early_stop"]["points"] == [100.0]


# --- the option ------------------------------------------------------------------------


def test_early_stop_is_on_by_default_and_the_option_turns_it_off(tmp_path: Path) -> None:
    assert settings(tmp_path).early_stop is True
    assert settings(tmp_path).to_json()["early_stop"] is True
    off = parse_settings(
        engine=["null"],
        device="cpu",
        profile="quick",
        results_dir=str(tmp_path),
        seed=0,
        early_stop="off",
    )
    assert off.early_stop is False
    with pytest.raises(UsageError, match=r"--early-stop 'maybe': choose on or off"):
        parse_settings(
            engine=["null"],
            device="cpu",
            profile="quick",
            results_dir=str(tmp_path),
            seed=0,
            early_stop="maybe",
        )
