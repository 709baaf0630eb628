"""Device times (``ReportsDeviceTimes``) reach the record as spans nested in ``infer``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.engine import (
    Arrays,
    EngineConfig,
    EngineError,
    ReportsDeviceTimes,
    device_spans,
)
from harness.load.arrivals import Arrivals, OpenLoop
from harness.load.serve_summary import summarize_trace
from harness.load.serving import NoBatching, StaticBatching, serve_open_loop
from tests.support.fakes import FakeClock, FakeTensorEngine
from workloads.lib.load import timed_batch

POOL = [{"x": np.ones((1, 4), dtype=np.float32)}]


class FakeDeviceTimedEngine(FakeTensorEngine):
    """A fake GPU engine: each call takes 1 ms of (fake) host time, of which the
    "device" spent 0.1 ms copying in, 0.7 ms computing and 0.2 ms copying out."""

    def __init__(self, config: EngineConfig, clock: FakeClock, times: dict[str, float]) -> None:
        super().__init__(config)
        self.clock = clock
        self.times = times

    def infer(self, inputs: Arrays) -> dict[str, Any]:
        self.clock.advance(0.001)
        return super().infer(inputs)

    def device_times(self) -> dict[str, float]:
        return dict(self.times)


TIMES = {"h2d": 0.0001, "compute": 0.0007, "d2h": 0.0002}


def _engine(clock: FakeClock, times: dict[str, float] = TIMES) -> FakeDeviceTimedEngine:
    return FakeDeviceTimedEngine(EngineConfig(model=Path("-")), clock, times)


def test_device_spans_nest_the_engines_times_in_infer():
    engine = _engine(FakeClock())
    assert isinstance(engine, ReportsDeviceTimes)
    assert device_spans(engine) == {
        "infer.h2d": 0.0001,
        "infer.compute": 0.0007,
        "infer.d2h": 0.0002,
    }


def test_an_engine_without_device_times_adds_no_spans():
    engine = FakeTensorEngine(EngineConfig(model=Path("-")))
    assert device_spans(engine) == {}
    spans = timed_batch(engine, POOL, [0, 1], FakeClock())
    assert set(spans) == {"preprocess", "infer", "postprocess"}


def test_a_cpu_call_reports_no_device_times():
    assert device_spans(_engine(FakeClock(), {})) == {}


def test_unknown_device_stages_are_an_engine_error():
    with pytest.raises(EngineError, match=r"unknown stages \['kernel'\]"):
        device_spans(_engine(FakeClock(), {"kernel": 1.0}))


def _serve(clock: FakeClock, policy: Any) -> Any:
    engine = _engine(clock)
    offsets = OpenLoop(rate=200.0, duration=1.0, arrivals=Arrivals.CONSTANT).schedule(0)
    trace = serve_open_loop(
        offsets, policy, lambda idx: timed_batch(engine, POOL, idx, clock), clock
    )
    return summarize_trace(trace, 200.0)


def test_device_spans_are_summarized_next_to_e2e_and_not_counted_twice():
    summary = _serve(FakeClock(), NoBatching())
    metrics = summary.metrics
    stages, account = metrics["stages"], metrics["time_account"]
    assert {"infer", "infer.h2d", "infer.compute", "infer.d2h"} <= set(stages)
    assert stages["infer"]["p50"] == pytest.approx(0.001)
    assert stages["infer.compute"]["p50"] == pytest.approx(0.0007)
    assert stages["infer.h2d"]["p99"] == pytest.approx(0.0001)
    compute = account["infer.compute"]
    assert compute["within"] == "infer"
    assert compute["share_of_within"] == pytest.approx(0.7)
    assert compute["share"] == pytest.approx(0.7 * account["infer"]["share"])
    # ``other`` is service time the stages missed: the nested spans must not be
    # subtracted from it a second time (the fake clock leaves nothing else)
    assert stages["other"]["max"] == pytest.approx(0.0, abs=1e-12)
    top = [v["share"] for k, v in account.items() if "within" not in v]
    assert sum(top) == pytest.approx(1.0)


def test_a_batch_shares_its_device_times_with_every_request_in_it():
    # static batches of 4: every request in a batch carries that batch's device times
    summary = _serve(FakeClock(), StaticBatching(size=4))
    stages = summary.metrics["stages"]
    assert stages["infer.d2h"]["count"] == summary.metrics["requests"]["ok"] == 200
    assert stages["infer.d2h"]["p50"] == pytest.approx(0.0002)
