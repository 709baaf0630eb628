"""Energy per output token / per request from NVML power (harness.metrics.energy): the
arithmetic on fake power series, its place in the record, its absence on a machine
without NVML, and ``recommend --energy-price``."""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from harness.metrics import energy
from harness.metrics.streamtiming import parse_slos
from harness.metrics.telemetry import Nvml, Series, Telemetry, shared_nvml, summarize
from harness.metrics.validity import Evidence, Policy
from harness.report import recommend as rec
from harness.results import store
from harness.results.records import Headline
from harness.session.cell import Cell
from tests.support.runner import run_workloads
from tests.test_recommend import build, one, run_cli, served, streamed, write_run

# --------------------------------------------------------------------------- arithmetic


def gpu_series(t: list[float], power: list[float], **more: list[float]) -> dict[str, Any]:
    """One device of the record's ``telemetry.gpu`` as harness.metrics.telemetry writes it."""
    return {"series": {"t": t, "power_w": power, **more}, "summary": {}}


def telemetry(*devices: dict[str, Any], interval_s: float = 0.5) -> dict[str, Any]:
    return {"interval_s": interval_s, "gpu": {str(i): d for i, d in enumerate(devices)}}


T = [0.0, 0.5, 1.0, 1.5, 2.0]


def test_constant_300_w_for_2_s_on_2_gpus_is_1200_j_and_3_j_per_token():
    flat = gpu_series(T, [300.0] * 5)
    got = energy.of_cell(
        telemetry(flat, flat),
        {"tokens": {"output": 400}, "requests": {"ok": 10}},
        span=(100.0, 102.0),
        origin=100.0,
    )
    assert got == {
        "joules": 1200.0,
        "source": "power",
        "gpus": {"0": 600.0, "1": 600.0},
        "samples": 5,
        "interval_s": 0.5,
        "window_s": 2.0,
        "mean_power_w": 600.0,
        "per_output_token_j": 3.0,  # counted against tokens, not requests, where both exist
        "count": 400,
    }


def test_a_tensor_cell_gets_joules_per_completed_request():
    got = energy.of_cell(
        telemetry(gpu_series(T, [250.0] * 5)), {"requests": {"ok": 125, "total": 130}}, (0, 2), 0
    )
    assert (got["joules"], got["per_request_j"], got["count"]) == (500.0, 4.0, 125)
    assert "per_output_token_j" not in got


def test_a_ramp_is_integrated_exactly_and_clipped_to_the_window():
    # 100 W rising 100 W per second; the window 0.25..1.75 s leaves out both ends:
    # 100 * 1.5 + 50 * (1.75**2 - 0.25**2) = 150 + 150 = 300 J (the whole series: 400 J)
    ramp = gpu_series(T, [100.0 + 100.0 * t for t in T])
    got = energy.measure(telemetry(ramp), (0.25, 1.75))
    assert isinstance(got, energy.Energy)
    assert got.joules == pytest.approx(300.0, abs=1e-9)
    assert got.samples == 3  # 0.5, 1.0 and 1.5 s lie inside
    assert got.window_s == 1.5
    whole = energy.measure(telemetry(ramp), (0.0, 2.0))
    assert isinstance(whole, energy.Energy)
    assert whole.joules == pytest.approx(400.0, abs=1e-9)


def test_the_window_edges_are_interpolated_between_samples():
    # 100 W at 0 s, 300 W at 1 s: at 0.5 s 200 W, so 0.5..1 s is (200 + 300) / 2 * 0.5 J
    assert energy.integrate([0.0, 1.0], [100.0, 300.0], 0.5, 1.0) == 125.0
    # a step between samples counts as a linear change, the trapezoidal rule's reading
    assert energy.integrate([0.0, 1.0, 2.0], [0.0, 0.0, 10.0], 0.0, 2.0) == 5.0


def test_the_energy_counter_is_preferred_where_every_gpu_has_one():
    # the counter (mJ since the driver loaded) rose 625 J over 0.5..2.5 s (interpolated:
    # 125 000 mJ at 0.5 s, 750 000 mJ at 2.5 s); the power readings would say otherwise
    t = [0.0, 1.0, 2.0, 3.0]
    dev = gpu_series(t, [100.0] * 4, energy_mj=[0.0, 250_000.0, 600_000.0, 900_000.0])
    got = energy.measure(telemetry(dev), (0.5, 2.5))
    assert isinstance(got, energy.Energy)
    assert (got.source, got.joules) == ("counter", pytest.approx(625.0))
    # one GPU without the counter: both are read from power, never a mix of the two
    plain = gpu_series(t, [100.0] * 4)
    mixed = energy.measure(telemetry(dev, plain), (0.5, 2.5))
    assert isinstance(mixed, energy.Energy)
    assert (mixed.source, mixed.gpus) == ("power", {"0": 200.0, "1": 200.0})
    # a counter that went down (the driver reloaded) is not read either
    reset = gpu_series(t, [100.0] * 4, energy_mj=[5e6, 6e6, 10.0, 20.0])
    again = energy.measure(telemetry(reset), (0.5, 2.5))
    assert isinstance(again, energy.Energy)
    assert (again.source, again.joules) == ("power", 200.0)


@pytest.mark.parametrize(
    ("recorded", "window", "why"),
    [
        ({}, (0.0, 1.0), "no telemetry was recorded for this cell"),
        (
            {"gpu": {"absent": "nvidia-ml-py is not installed"}},
            (0.0, 1.0),
            "no GPU power reading: nvidia-ml-py is not installed",
        ),
        ({"gpu": {}}, (0.0, 1.0), "NVML gave no GPU reading during the cell"),
        (
            telemetry(gpu_series(T, [300.0] * 5)),
            None,
            "the workload did not place its measured window on the telemetry clock",
        ),
        (telemetry(gpu_series(T, [300.0] * 5)), (1.0, 1.0), "the measured window is empty"),
        (
            telemetry(gpu_series(T, [300.0] * 5)),
            (1.0, 2.5),
            "GPU 0's power series (0 to 2 s) does not cover the measured window (1 to 2.5 s on"
            " the telemetry clock)",
        ),
        (
            telemetry(gpu_series(T, [300.0] * 5)),
            (0.6, 1.2),
            "1 power reading(s) inside the 0.6 s window (one every 0.5 s); energy needs at least 2",
        ),
        (
            telemetry(gpu_series(T, [300.0, 300.0, math.nan, 300.0, 300.0])),
            (0.0, 2.0),
            "GPU 0 recorded no power series with its sample times",
        ),
        (
            telemetry({"summary": {"power_w_mean": 300.0}}),
            (0.0, 2.0),
            "GPU 0 recorded no power series with its sample times",
        ),
    ],
)
def test_energy_is_absent_with_the_reason_never_estimated(recorded, window, why):
    assert energy.measure(recorded, window) == why
    span = None if window is None else (50.0 + window[0], 50.0 + window[1])
    assert energy.of_cell(recorded, {"tokens": {"output": 10}}, span, 50.0) == {"absent": why}


def test_zero_output_tokens_leave_the_per_token_figure_none_beside_the_count():
    got = energy.of_cell(
        telemetry(gpu_series(T, [300.0] * 5)), {"tokens": {"output": 0}}, (0, 2), 0
    )
    assert (got["joules"], got["per_output_token_j"], got["count"]) == (600.0, None, 0)


# --------------------------------------------------------------------------- telemetry


class FakePynvml(types.ModuleType):
    """nvidia-ml-py with two GPUs: 300 W each, the energy counter where ``counter``."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    def __init__(self, counter: bool) -> None:
        super().__init__("pynvml")
        self.counter = counter
        self.reads = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        if not self.counter:
            raise RuntimeError("NVMLError_NotSupported")
        self.reads += 1
        return 1_000_000 * (handle + 1) + 150_000 * self.reads

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return types.SimpleNamespace(gpu=90, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return types.SimpleNamespace(used=2e9)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return 300_000  # milliwatts

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return 60

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        return 1980

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        return 0


@pytest.mark.parametrize("counter", [True, False])
def test_nvml_reads_the_energy_counter_where_every_gpu_has_one(monkeypatch, counter):
    monkeypatch.setitem(sys.modules, "pynvml", FakePynvml(counter))
    nvml = Nvml()
    assert nvml.absent is None
    assert nvml.energy_counter is counter
    first = nvml.sample()
    assert [d["power_w"] for d in first] == [300.0, 300.0]
    assert ("energy_mj" in first[0]) is counter


class GappyNvml(Nvml):
    """One GPU at 300 W, its counter rising 150 J a reading; the second reading fails."""

    def __init__(self) -> None:
        self.absent = None
        self.energy_counter = True
        self.calls = 0

    def sample(self) -> list[dict[str, float]]:
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("GPU fell off the bus")
        row = {"util_pct": 90.0, "mem_bw_util_pct": 40.0, "mem_used_bytes": 2e9}
        row |= {"power_w": 300.0, "temp_c": 60.0, "sm_clock_mhz": 1980.0}
        return [row | {"throttle_reasons": 0.0, "energy_mj": 150_000.0 * self.calls}]


def test_each_gpu_reading_keeps_its_own_time_and_the_counter_has_no_mean():
    ticks = iter([10.0, 10.0, 10.5, 11.0, 11.5])  # origin, then one per sample
    sampler = Telemetry(interval_s=0.5, clock=lambda: next(ticks), nvml=GappyNvml())
    sampler._t0 = sampler.clock()
    for _ in range(4):
        sampler.sample()
    out = summarize(sampler.series, 0.5, None)
    device = out["gpu"]["0"]
    assert out["series"]["t"] == [0.0, 0.5, 1.0, 1.5]
    assert device["series"]["t"] == [0.0, 1.0, 1.5]  # the failed reading left its gap
    assert device["series"]["energy_mj"] == [150_000.0, 450_000.0, 600_000.0]
    assert "energy_mj_mean" not in device["summary"]
    assert device["summary"]["power_w_mean"] == 300.0
    # the gap does not shift the series: the counter over 0..1.5 s is 450 J
    got = energy.measure(out, (0.0, 1.5))
    assert isinstance(got, energy.Energy)
    assert (got.source, got.joules, got.samples) == ("counter", 450.0, 3)


def test_a_series_filled_by_hand_is_read_on_the_host_times():
    host = {"cpu_user_s": 0.0, "cpu_system_s": 0.0, "rss_bytes": 1.0, "system_cpu_pct": 0.0}
    series = Series(t=[0.0, 1.0], host=[host, host], gpu=[GappyNvml().sample()] * 2)
    assert summarize(series, 1.0, None)["gpu"]["0"]["series"]["t"] == [0.0, 1.0]


# --------------------------------------------------------------------------- the record


class ConstantNvml(Nvml):
    """Two GPUs at 300 W each, no counter."""

    def __init__(self) -> None:
        self.absent = None
        self.energy_counter = False

    def sample(self) -> list[dict[str, float]]:
        row = {"util_pct": 50.0, "mem_bw_util_pct": 10.0, "mem_used_bytes": 1e9}
        row |= {"power_w": 300.0, "temp_c": 50.0, "sm_clock_mhz": 1500.0, "throttle_reasons": 0.0}
        return [dict(row), dict(row)]


def new_cell(nvml: Nvml, ticks: list[float]) -> Cell:
    clock = iter(ticks)
    sampler = Telemetry(interval_s=0.5, clock=lambda: next(clock), nvml=nvml)
    cell = Cell(
        run_id="r",
        cell_id="c",
        workload="w",
        engine="e",
        params={},
        policy=Policy(min_window_s=1.0, min_samples=1),
        environment={},
        sampler=sampler,
    )
    sampler._t0 = sampler.clock()  # what start() does, without its thread
    for _ in ticks[1:]:
        sampler.sample()
    return cell


GENERATIVE = {"tokens": {"output": 480}, "requests": {"ok": 12}, "x": {"p50": 0.01}}


def test_the_record_holds_the_energy_of_the_measured_window_only():
    # telemetry from perf_counter 100 s, a sample every 0.5 s to 104 s; the window is
    # 101..103 s: 2 GPUs x 300 W x 2 s = 1200 J over 480 tokens = 2.5 J/token
    cell = new_cell(ConstantNvml(), [100.0 + 0.5 * i for i in range(10)])
    cell.finish(
        metrics=GENERATIVE,
        evidence=Evidence(samples=12, failed=0, window_s=2.0, span=(101.0, 103.0)),
        headline=[Headline(label="p50", metric="x.p50", unit="ms")],
    )
    cell.telemetry = summarize(cell.sampler.series, 0.5, None)
    record = cell.record()
    assert record.metrics["energy"] == {
        "joules": 1200.0,
        "source": "power",
        "gpus": {"0": 600.0, "1": 600.0},
        "samples": 5,
        "interval_s": 0.5,
        "window_s": 2.0,
        "mean_power_w": 600.0,
        "per_output_token_j": 2.5,
        "count": 480,
    }
    assert record.metrics["x"] == {"p50": 0.01}  # the workload's own, untouched


def test_a_workload_that_gives_no_span_gets_absent_energy_saying_so():
    cell = new_cell(ConstantNvml(), [0.0, 0.5, 1.0, 1.5, 2.0])
    cell.finish(
        metrics=GENERATIVE,
        evidence=Evidence(samples=12, failed=0, window_s=2.0),
        headline=[Headline(label="p50", metric="x.p50", unit="ms")],
    )
    cell.telemetry = summarize(cell.sampler.series, 0.5, None)
    assert cell.record().metrics["energy"] == {
        "absent": "the workload did not place its measured window on the telemetry clock"
    }


def test_without_telemetry_a_record_gets_no_energy_section():
    cell = new_cell(ConstantNvml(), [0.0])
    cell.finish(
        metrics=GENERATIVE,
        evidence=Evidence(samples=12, failed=0, window_s=2.0, span=(0.0, 2.0)),
        headline=[Headline(label="p50", metric="x.p50", unit="ms")],
    )
    assert "energy" not in cell.record().metrics


def test_on_this_machine_the_real_nvml_probe_gives_energy_absent_with_its_reason():
    nvml = shared_nvml()
    if nvml.absent is None:
        pytest.skip("this machine has NVML; the GPU checks cover it")
    sampler = Telemetry(interval_s=0.05)
    sampler.start()
    cell = Cell(
        run_id="r",
        cell_id="c",
        workload="w",
        engine="e",
        params={},
        policy=Policy(min_window_s=0.0, min_samples=1),
        environment={},
        sampler=sampler,
    )
    t0 = sampler.origin
    cell.finish(
        metrics=GENERATIVE,
        evidence=Evidence(samples=12, failed=0, window_s=0.1, span=(t0, t0 + 0.1)),
        headline=[Headline(label="p50", metric="x.p50", unit="ms")],
    )
    cell.telemetry = sampler.stop()
    assert cell.record().metrics["energy"] == {"absent": f"no GPU power reading: {nvml.absent}"}


@pytest.mark.slow  # a pytest subprocess running two real cells: about 4 s
def test_a_real_run_on_this_machine_records_energy_as_absent(tmp_path):
    if shared_nvml().absent is None:
        pytest.skip("this machine has NVML; the GPU checks cover it")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"vocab_size": 100}')
    run = run_workloads(
        tmp_path,
        "--engine=null,null-gen",
        "--engine-opt=null-gen.token_time_s=0.0003",
        f"--model={model}",
        "--profile=quick",
        "--requests=20",
        "--window=1.2",
        "--isolation=none",
        "-k",
        "(streaming and closed-1) or (batching and rate100-none)",
    )
    measured = {cid: r for cid, r in run.records.items() if r.metrics}
    assert sorted(measured) == [
        "batching.null.rate=100.mode=none.batch=1.delay_ms=none",
        "streaming.null-gen.load=closed.level=1",
    ], run.stdout[-3000:]
    for record in measured.values():
        why = record.metrics["energy"]["absent"]
        assert why == f"no GPU power reading: {record.telemetry['gpu']['absent']}"
        assert why.startswith("no GPU power reading: ")


# --------------------------------------------------------------------------- recommend

SLO = "ttft_p99=200ms"


def with_energy(fields: dict[str, Any], watts: float | None, absent: str | None = None):
    """A record's fields with ``metrics.energy``: ``watts`` over its window, or absent."""
    window = fields["window"]["duration_s"]
    if absent is not None:
        found: dict[str, Any] = {"absent": absent}
    else:
        assert watts is not None
        found = {"joules": watts * window, "window_s": window, "mean_power_w": watts}
    return fields | {"metrics": fields["metrics"] | {"energy": found}}


def token_run(
    tmp_path: Path, hungry: float | None, frugal: float | None, absent: str | None = None
):
    """Two engines meeting the TTFT SLO, 120 requests in 10 s each: ``hungry`` does 500
    output tokens/s at ``hungry`` watts, ``frugal`` 300 tokens/s at ``frugal`` watts."""
    ttft, tpot = [0.1] * 120, [0.02] * 120
    e2e = [0.72] * 120
    fast = streamed(ttft, tpot, e2e, window=10.0, tokens_per_s=500.0)
    slow = streamed(ttft, tpot, e2e, window=10.0, tokens_per_s=300.0)
    recs = [
        build("streaming", "hungry", {"n": 1}, run_id="g", **with_energy(fast, hungry, absent)),
        build("streaming", "frugal", {"n": 1}, run_id="g", **with_energy(slow, frugal, absent)),
    ]
    return write_run(tmp_path, "g", recs)


def test_energy_price_adds_energy_cost_per_million_output_tokens(tmp_path):
    # hungry: 500 tok/s at 3000 W = 6 J/token; 1M tokens = 6e6 J = 1.667 kWh
    # frugal: 300 tok/s at  300 W = 1 J/token; 1M tokens = 1e6 J = 0.278 kWh
    # machine at 3.6 per hour = 0.001 per second: 2.0 and 3.333 per 1M tokens
    run = token_run(tmp_path, hungry=3000.0, frugal=300.0)
    plain = one(rec.recommend([run], parse_slos(SLO), 3.6), "streaming")
    assert plain.recommended.engine == "hungry"  # without energy the faster one is cheaper
    cost = plain.recommended.cost
    assert (cost.amount, cost.per, cost.energy) == (pytest.approx(2.0), "1M output tokens", None)
    priced = one(rec.recommend([run], parse_slos(SLO), 3.6, energy_price=1.0), "streaming")
    best, second = priced.recommended, priced.runner_up
    assert best.engine == "frugal"  # with energy at 1 per kWh it is not
    assert best.cost.energy == pytest.approx(1e6 / 3.6e6)
    assert best.cost.amount == pytest.approx(1e6 / 300 / 1000 + 1e6 / 3.6e6)
    assert second.cost.energy == pytest.approx(6e6 / 3.6e6)
    assert second.cost.amount == pytest.approx(2.0 + 6e6 / 3.6e6)
    assert priced.energy_note is None
    assert priced.ranked_by == (
        "lowest cost per 1M output tokens (machine time at 3.6 per hour plus GPU energy at 1"
        " per kWh)"
    )
    text = rec.render(rec.recommend([run], parse_slos(SLO), 3.6, energy_price=1.0))
    assert "machine cost 3.6 per hour; GPU energy 1 per kWh" in text
    assert "3.61 per 1M output tokens (0.28 of it GPU energy)" in text


def test_energy_price_alone_ranks_by_energy_cost(tmp_path):
    run = token_run(tmp_path, hungry=3000.0, frugal=300.0)
    w = one(rec.recommend([run], parse_slos(SLO), None, energy_price=0.18), "streaming")
    # 1 J/token: 1e6 J per 1M tokens = 0.2778 kWh at 0.18 = 0.05
    assert w.recommended.engine == "frugal"
    assert (w.recommended.cost.amount, w.recommended.cost.energy) == (
        pytest.approx(0.05),
        pytest.approx(0.05),
    )
    assert w.ranked_by == "lowest cost per 1M output tokens (GPU energy at 0.18 per kWh)"


def test_absent_energy_is_said_and_costs_stay_machine_time_only(tmp_path):
    why = "no GPU power reading: nvidia-ml-py is not installed"
    run = token_run(tmp_path, None, None, absent=why)
    w = one(rec.recommend([run], parse_slos(SLO), 3.6, energy_price=1.0), "streaming")
    assert w.recommended.engine == "hungry"
    cost = w.recommended.cost
    assert (cost.amount, cost.per, cost.energy) == (pytest.approx(2.0), "1M output tokens", None)
    assert w.energy_note == (
        "energy cost not included: 2 of the 2 configurations meeting the SLO have no GPU"
        f" energy figure: {why} (2x)"
    )
    assert "lowest cost per 1M output tokens at 3.6 per machine-hour" in w.ranked_by
    text = rec.render(rec.recommend([run], parse_slos(SLO), 3.6, energy_price=1.0))
    assert w.energy_note in text
    # energy price alone, and none to price: ranked by goodput, and said so
    alone = one(rec.recommend([run], parse_slos(SLO), None, energy_price=1.0), "streaming")
    assert alone.ranked_by == "highest goodput under the SLO (req/s)"
    assert alone.recommended.cost is None
    assert alone.energy_note == w.energy_note


def test_one_configuration_without_energy_keeps_energy_out_of_every_cost(tmp_path):
    ttft, tpot, e2e = [0.1] * 120, [0.02] * 120, [0.72] * 120
    fast = streamed(ttft, tpot, e2e, window=10.0, tokens_per_s=500.0)
    old = streamed(ttft, tpot, e2e, window=10.0, tokens_per_s=300.0)  # before metrics.energy
    moved = with_energy(old, 300.0) | {"window": {"duration_s": 20.0, "requests": 120}}
    recs = [
        build("streaming", "a", {"n": 1}, run_id="g", **with_energy(fast, 3000.0)),
        build("streaming", "b", {"n": 1}, run_id="g", **old),
        build("streaming", "c", {"n": 2}, run_id="g", **moved),
    ]
    w = one(
        rec.recommend([write_run(tmp_path, "g", recs)], parse_slos(SLO), 3.6, energy_price=1),
        "streaming",
    )
    assert w.energy_note is not None
    assert "2 of the 3 configurations meeting the SLO" in w.energy_note
    assert "the record has no metrics.energy (written before it was kept)" in w.energy_note
    assert "its energy covers 10 s, not the 20 s window its rates were measured over" in (
        w.energy_note
    )
    assert all(c.cost is not None and c.cost.energy is None for c in w.candidates)


def test_tensor_energy_cost_is_per_thousand_requests(tmp_path):
    # 1000 req/s at 360 W: 0.36 J a request, 360 J per 1k = 1e-4 kWh, at 2 per kWh 2e-4
    # 800 req/s at 160 W: 0.2 J a request, 200 J per 1k = 5.56e-5 kWh -> 1.11e-4: cheaper
    fast = with_energy(served([0.01] * 1000), 360.0)
    lean = with_energy(served([0.02] * 800), 160.0)
    recs = [
        build("batching", "fast", {"mode": "dynamic"}, run_id="t", **fast),
        build("batching", "lean", {"mode": "static"}, run_id="t", **lean),
    ]
    run = write_run(tmp_path, "t", recs)
    w = one(rec.recommend([run], parse_slos("e2e_p99=50ms"), None, energy_price=2.0), "batching")
    assert w.recommended.engine == "lean"
    assert w.recommended.cost.per == "1k requests"
    assert w.recommended.cost.amount == pytest.approx(200 / 3.6e6 * 2)
    assert w.runner_up.cost.amount == pytest.approx(360 / 3.6e6 * 2)


@pytest.mark.parametrize("price", ["-1", "0", "nan", "inf"])
def test_cli_energy_price_must_be_a_positive_number(tmp_path, price):
    run = token_run(tmp_path, 3000.0, 300.0)
    code, out = run_cli([str(run), "--slo", SLO, f"--energy-price={price}"])
    assert code == 2
    assert out.startswith(f"error: --energy-price must be a positive number, got {float(price):g}")


def test_cli_energy_price_that_is_no_number_is_an_argparse_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        run_cli([str(tmp_path), "--slo", SLO, "--energy-price", "cheap"])
    assert exc.value.code == 2
    assert "--energy-price: invalid float value: 'cheap'" in capsys.readouterr().err


def test_cli_energy_price_in_the_text_and_json(tmp_path):
    run = token_run(tmp_path, hungry=3000.0, frugal=300.0)
    path = tmp_path / "rec.json"
    code, out = run_cli(
        [
            str(run),
            "--slo",
            SLO,
            "--gpu-hour-cost",
            "3.6",
            "--energy-price",
            "1",
            "--json",
            str(path),
        ]
    )
    assert code == 0
    assert "RECOMMENDED: frugal n=1:" in out
    data = json.loads(path.read_bytes())
    best = data["workloads"][0]["recommended"]
    assert data["energy_price"] == 1.0
    assert best["mean_power_w"] == 300.0
    assert best["cost"]["energy"] == pytest.approx(1e6 / 3.6e6)
    assert "energy_absent" not in best  # written only where it says something
    # without the option the JSON is what it was before records held energy
    code, out = run_cli([str(run), "--slo", SLO, "--gpu-hour-cost", "3.6", "--json", str(path)])
    assert code == 0
    plain = json.loads(path.read_bytes())
    assert "energy_price" not in plain
    assert "energy_note" not in plain["workloads"][0]
    assert plain["workloads"][0]["recommended"]["engine"] == "hungry"
    for candidate in plain["workloads"][0]["candidates"]:
        assert not {"mean_power_w", "energy_absent"} & set(candidate)
        assert set(candidate["cost"]) == {"amount", "per"}


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # two real cells in process: about 3 s
def test_real_cells_with_a_fake_nvml_get_the_energy_of_their_window(pytester, monkeypatch):
    """The windows the load code reports (Evidence.span) line up with the telemetry's
    clock: at a constant 2 x 300 W, joules are exactly 600 W x the record's window."""
    monkeypatch.setattr("harness.metrics.telemetry.shared_nvml", ConstantNvml)
    model = pytester.path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"vocab_size": 100}')
    results = pytester.path / "runs"
    pytester.runpytest(
        str(REPO / "workloads"),
        f"--results-dir={results}",
        "--engine=null,null-gen",
        "--engine-opt=null-gen.token_time_s=0.001",  # a window over 1 s
        f"--model={model}",
        "--profile=quick",
        "--requests=40",
        "--window=1.2",
        "--isolation=none",
        "-k",
        "(streaming and closed-1) or (batching and rate100-none)",
    )
    (run_dir,) = list(results.iterdir())
    records = {r.workload: r for r in store.read_records(run_dir) if r.metrics}
    assert sorted(records) == ["batching", "streaming"]
    for record in records.values():
        got = record.metrics["energy"]
        window = record.window["duration_s"]
        assert got["source"] == "power"
        assert got["window_s"] == pytest.approx(window, abs=1e-6)
        assert got["joules"] == pytest.approx(600.0 * window, rel=1e-6)
        assert got["gpus"]["0"] == pytest.approx(300.0 * window, rel=1e-6)
        assert got["samples"] >= 2
    tokens = records["streaming"].metrics["tokens"]["output"]
    streaming = records["streaming"].metrics["energy"]
    assert streaming["per_output_token_j"] == pytest.approx(streaming["joules"] / tokens)
    batching = records["batching"].metrics["energy"]
    done = records["batching"].metrics["requests"]["ok"]
    assert batching["per_request_j"] == pytest.approx(batching["joules"] / done)
