"""Over-saturation early stop in the streaming driver (harness.load.streamstop): a search's
generative rate point whose backlog and latency grow without bound stops early, cancels
what it has in flight and counts it as cut off (not as failed), and keeps the same
evidence as a tensor point; a healthy point runs in full.

The engine is ``null-gen`` with one sequence at a time (``max_num_seqs=1``) and 1 ms
tokens: requests of 10 tokens are served at most ~95/s, so a rate well above that
saturates it and one well below does not. Real asyncio, real clock: each test takes
one to two seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from engines.null import NullGenerativeEngine
from harness.engine import EngineConfig, GenerationRequest
from harness.load.arrivals import OpenLoop
from harness.load.capacity import CapacityResult
from harness.load.clients import ClientFailure, ClockKind, Launched
from harness.load.clock import MonotonicClock
from harness.load.saturation import EarlyStopRule, Watch
from harness.load.streamdriver import Driver
from harness.load.streamstop import (
    NO_EARLY_STOP_CLIENTS,
    StreamStop,
    WatchedRun,
    open_loop_watched,
)
from harness.metrics.slo import parse_slos
from harness.session.config import PROFILES, ProfileName, RunSettings
from harness.session.pytestoptions import parse_settings
from workloads.lib.generative import LoadSource
from workloads.lib.load import GenerativeTarget, finish_capacity

TOKENS = 10
OPTIONS = {"max_num_seqs": "1", "token_time_s": "0.001"}
RULE = EarlyStopRule(min_elapsed_s=0.5, min_samples=60)  # a 2 s window's, short for a test
WINDOW_S = 2.0


@pytest.fixture
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as aio:
        yield aio


def engine(**options: str) -> NullGenerativeEngine:
    gen = NullGenerativeEngine(EngineConfig(model=Path("-"), options=OPTIONS | options))
    gen.load()
    return gen


def requests(n: int) -> list[GenerationRequest]:
    return [
        GenerationRequest(prompt=(5, 6, 7), max_tokens=TOKENS, request_id=f"r{i}") for i in range(n)
    ]


def run(
    aio: asyncio.Runner,
    driver: Driver,
    rate: float,
    rule: EarlyStopRule | None = RULE,
    window_s: float = WINDOW_S,
) -> tuple[WatchedRun, int]:
    offsets = OpenLoop(rate=rate, duration=window_s).schedule(3)
    watch = Watch(rule, window_s, rate) if rule is not None else None
    reqs = requests(offsets.size)
    return aio.run(open_loop_watched(driver, reqs, offsets, watch)), offsets.size


def test_a_saturated_point_stops_and_cuts_off_what_it_did_not_finish(
    runner: asyncio.Runner,
) -> None:
    driver = Driver(engine(), MonotonicClock(), timeout_s=10.0)
    t0 = driver.clock.now()
    done, n = run(runner, driver, rate=400.0)
    wall = driver.clock.now() - t0
    stop = done.early_stop
    assert stop is not None
    # not before the rule's earliest (0.5 s, a quarter of 2 s), and before the schedule ends
    assert 0.5 <= stop.at_s < WINDOW_S
    assert wall < stop.at_s + 1.0  # no drain: the queue of ~300 would take 3 s more
    # every scheduled request once: finished (kept), cut off in flight or due, never sent
    assert len(done.records) + stop.backlog + stop.unsent == n
    assert stop.backlog > 100
    assert stop.unsent > 0
    # the cut-off requests are not failures: every record kept finished, and ok
    assert all(r.ok for r in done.records)
    assert len(done.records) >= RULE.min_samples
    assert list(done.kept) == sorted(done.kept)
    assert stop.backlog_slope_per_s > 200.0  # 400/s offered, ~95/s completed
    assert stop.completion_rate < 150.0
    assert stop.latency_slope > 1.0  # each second of schedule adds ~3 s of waiting (400/95 - 1)
    assert "rising" in stop.trend
    # the generator kept up: its send rate counts the requests cut off in flight too
    assert isinstance(stop, StreamStop)
    assert stop.sent_share == pytest.approx(1.0, abs=0.01)
    # the engine's one slot was released by the cancelled stream: it serves again at once
    again, m = run(runner, driver, rate=20.0, rule=None, window_s=0.5)
    assert again.early_stop is None
    assert len(again.records) == m
    assert all(r.ok for r in again.records)  # a slot kept by a cancelled one: timeouts
    assert {t for t in asyncio.all_tasks(runner.get_loop()) if not t.done()} == set()


def test_a_healthy_point_runs_in_full(runner: asyncio.Runner) -> None:
    driver = Driver(engine(), MonotonicClock(), timeout_s=30.0)
    done, n = run(runner, driver, rate=40.0)  # ~40 % of what it serves
    assert done.early_stop is None
    assert len(done.records) == n > RULE.min_samples  # enough that the rule could judge
    assert done.kept == tuple(range(n))
    assert [r.t_sched for r in done.records] == sorted(r.t_sched for r in done.records)


def test_without_a_watch_it_is_the_drivers_open_loop(runner: asyncio.Runner) -> None:
    driver = Driver(engine(), MonotonicClock(), timeout_s=30.0)
    done, n = run(runner, driver, rate=20.0, rule=None, window_s=0.5)
    assert done.early_stop is None
    assert len(done.records) == n


# --- the generative capacity search's rate point ---------------------------------------


def settings(tmp_path: Path, **kw: Any) -> RunSettings:
    return parse_settings(
        device="cpu", profile="quick", results_dir=str(tmp_path), seed=0, window=WINDOW_S, **kw
    )


def target(tmp_path: Path, aio: asyncio.Runner) -> GenerativeTarget:
    """The workload's target, on null-gen in this process, with the quick profile's rule."""
    run_settings = settings(tmp_path, engine=["null-gen"])
    gen = engine()
    driver = Driver(gen, MonotonicClock(), timeout_s=30.0)
    config = EngineConfig(model=Path("-"), options=OPTIONS)
    source = LoadSource(driver, aio, run_settings, "null-gen", config, ceiling_check=False)
    out = GenerativeTarget(
        source, run_settings, parse_slos("e2e_p99=2s"), 100, 7, (8, 4, 12), (TOKENS,) * 3
    )
    out.early_stop = EarlyStopRule.for_policy(PROFILES[ProfileName.QUICK].policy)
    return out


def test_a_saturated_rate_point_is_recorded_with_its_evidence(
    tmp_path: Path, runner: asyncio.Runner
) -> None:
    t = target(tmp_path, runner)
    point = t.rate_point(400.0)
    stop = point.early_stop
    assert stop is not None
    assert not point.passes
    assert stop.window_s == WINDOW_S
    assert stop.offered_rate == 400.0
    m = t.points[400.0]
    assert m.metrics["early_stop"] == stop.to_json()
    assert m.metrics["requests"]["cut_off"] == stop.backlog + stop.unsent
    assert m.metrics["requests"]["failed"] == 0  # cut off, not failed
    assert m.metrics["requests"]["total"] == m.metrics["requests"]["ok"]
    assert any(note.startswith("stopped early at") for note in m.evidence.notes)
    # the generator's send rate counts every request it sent, cut off or not: it kept up
    share = m.metrics["early_stop"]["sent_share"]
    assert m.evidence.sent_rate == pytest.approx(m.evidence.offered_rate * share)
    assert share >= PROFILES[ProfileName.QUICK].policy.min_sent_ratio
    assert not any("could not keep up" in r for r in point.reasons)
    doc = point.to_json()
    assert doc["stopped_early"] is True
    assert doc["early_stop"]["cut_off"] == {"unanswered": stop.backlog, "unsent": stop.unsent}
    assert t.early_stop_off is None


def test_a_healthy_rate_point_runs_its_window(tmp_path: Path, runner: asyncio.Runner) -> None:
    t = target(tmp_path, runner)
    point = t.rate_point(60.0)  # 120 requests over 2 s: past the rule's 1 s and 100 samples
    assert point.early_stop is None
    m = t.points[60.0]
    assert "early_stop" not in m.metrics
    assert "cut_off" not in m.metrics["requests"]
    assert m.metrics["requests"]["ok"] == m.metrics["requests"]["total"] > 100


@dataclass(frozen=True)
class FailingLauncher:
    """A fake launcher (no clients run): every client fails."""

    name: ClassVar[str] = "fake"
    clock: ClassVar[ClockKind] = ClockKind.MONOTONIC
    seen: list[Any] = field(default_factory=list)

    def launch(self, specs: Any, deadlines: Any) -> Launched:
        self.seen.extend(specs)
        return Launched(
            self.name, 0.0, 0.0, tuple(ClientFailure(s.index, "fake", 0.0) for s in specs)
        )


@dataclass
class FinishedCell:
    """Keeps what the workload finished the cell with."""

    kept: dict[str, Any] = field(default_factory=dict)

    def finish(self, **kw: Any) -> None:
        self.kept = kw


def test_several_client_processes_run_in_full_and_the_record_says_why(tmp_path: Path) -> None:
    run_settings = settings(tmp_path, engine=["openai"], clients=2)
    config = EngineConfig(model=Path("-"), options={"base_url": "http://127.0.0.1:1"})
    launcher = FailingLauncher()
    source = LoadSource(None, None, run_settings, "openai", config, launcher, ceiling_check=False)  # type: ignore[arg-type]
    reqs = requests(6)
    watch = Watch(RULE, WINDOW_S, 100.0)
    sent = source.open_loop(reqs, np.linspace(0.0, 0.05, 6), watch)
    assert len(launcher.seen) == 2
    assert sent.early_stop is None
    assert sent.early_stop_off == NO_EARLY_STOP_CLIENTS
    assert source.open_loop(reqs, np.linspace(0.0, 0.05, 6)).early_stop_off is None  # not asked
    t = GenerativeTarget(source, run_settings, (), 100, 7, (8, 4, 12), (TOKENS,) * 3)
    t.early_stop = RULE
    point = t.rate_point(100.0)
    assert point.early_stop is None
    assert t.early_stop_off == NO_EARLY_STOP_CLIENTS
    cell = FinishedCell()
    result = CapacityResult((point,), None, point, False, "nothing passes")
    finish_capacity(
        cell,  # type: ignore[arg-type]
        result,
        t.points,
        [],
        objective="e2e_p99=2s",
        seeds={},
        early_stop_off=t.early_stop_off,
    )
    search = cell.kept["metrics"]["search"]
    assert search["early_stop"] == {
        "points": [],
        "saved_s": 0.0,
        "not_applied": NO_EARLY_STOP_CLIENTS,
    }
