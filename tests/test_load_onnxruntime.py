"""The load / capacity workloads for real on ONNX Runtime (quick profile), checked by
content: a knee with the point that blew up after it, a capacity bracketed by a passing
and a failing point, confidence intervals in the matrix, per-window soak figures with
memory drift, and per-phase figures under shaped load."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.report import matrix
from harness.results.records import CellRecord, Status
from tests.support.once import once
from tests.support.runner import run_workloads

pytestmark = pytest.mark.slow

pytest.importorskip("onnxruntime")

WINDOW_S = 1.5


@pytest.fixture(scope="module")
def run(request: pytest.FixtureRequest) -> tuple[Path, dict[str, CellRecord]]:
    return once(request, _run)


def _run(tmp: Path) -> tuple[Path, dict[str, CellRecord]]:
    result = run_workloads(
        tmp,
        "--engine=onnxruntime",
        "--profile=quick",
        f"--window={WINDOW_S}",
        "-k",
        "test_load.py",
    )
    assert result.returncode == 0, result.stdout[-4000:]
    return result.run_dir, result.records


def only(records: dict[str, CellRecord], workload: str, **params: object) -> CellRecord:
    found = [
        r
        for r in records.values()
        if r.workload == workload and all(r.params.get(k) == v for k, v in params.items())
    ]
    assert len(found) == 1, [r.cell_id for r in found]
    return found[0]


def test_the_sweep_finds_a_knee_from_valid_points(run):
    _, records = run
    rec = only(records, "rate_sweep")
    assert rec.status is Status.OK, rec.reasons
    sweep = rec.metrics["sweep"]
    loads = [p["load"] for p in sweep["points"]]
    assert loads == sorted(loads)
    knee = rec.metrics["knee"]
    assert knee["load"] in loads
    at_knee = next(p for p in sweep["points"] if p["load"] == knee["load"])
    assert at_knee["valid"]
    assert at_knee["reasons"] == []
    if sweep["stop"] == "blow-up":
        blown = sweep["points"][-1]
        assert blown["load"] == knee["blown_at"] > knee["load"]
        assert sweep["why"].startswith(f"at {blown['load']:g}")
    # throughput at the knee tracks the offered rate, with an interval around it
    lo, hi = knee["throughput_ci95"]
    assert lo <= knee["throughput"] <= hi
    assert 0.9 * knee["load"] <= knee["throughput"] <= 1.1 * knee["load"]
    p99_lo, p99_hi = knee["e2e_p99_ci95"]
    assert p99_lo <= knee["e2e_p99"]
    assert p99_hi is None or knee["e2e_p99"] <= p99_hi


@pytest.mark.parametrize("batching", ["none", "dynamic-b8-2ms"])
def test_capacity_is_bracketed_by_measured_points(run, batching):
    _, records = run
    rec = only(records, "capacity", batching=batching)
    assert rec.status is Status.OK, rec.reasons
    search, cap = rec.metrics["search"], rec.metrics["capacity"]
    points = {p["load"]: p for p in search["points"]}
    low, high = search["bracket"]
    assert cap["load"] == low
    assert points[low]["passes"]
    assert points[low]["valid"]
    assert points[low]["slo_failures"] == []
    assert high is not None
    assert high > low
    assert not points[high]["passes"]
    # nothing that passed lies above the failing bracket, nothing failing below capacity
    assert all(not p["passes"] for p in points.values() if p["load"] >= high)
    assert all(p["passes"] for p in points.values() if p["load"] <= low)
    assert rec.params["objective"] == "e2e_p99=10ms"
    assert points[low]["e2e"]["p99_adjusted"] <= 0.010
    # the capacity point was measured again: the spread across repetitions
    spread = cap["spread"]
    assert spread["repetitions"] == 2
    assert len(spread["throughput"]) == 2
    assert spread["throughput_cv"] >= 0
    # the record keeps raw samples of the capacity point: percentiles recompute
    e2e = rec.samples["e2e"]
    assert len(e2e) == points[low]["samples"]


def test_the_matrix_shows_capacity_knee_and_intervals(run):
    run_dir, records = run
    md, _ = matrix.write(run_dir)
    text = md.read_text()
    cap = only(records, "capacity", batching="none").metrics["capacity"]
    assert f"capacity {matrix.fmt_number(cap['load'])} req/s" in text
    lo, hi = cap["throughput_ci95"]
    assert f"\\[{matrix.fmt_number(lo)}, {matrix.fmt_number(hi)}\\]" in text  # escaped Markdown
    assert "fails at" in text
    assert "knee " in text
    assert "blew up at" in text or "n/a" in text
    csv_head = (run_dir / "matrix.csv").read_text().splitlines()[0]
    assert "onnxruntime:tput ci95 low [req/s]" in csv_head


def test_soak_reports_windows_and_memory_drift(run):
    _, records = run
    rec = only(records, "soak")
    assert rec.status is Status.OK, rec.reasons
    windows = rec.metrics["windows"]
    assert len(windows) == 4
    assert sum(w["requests"] for w in windows) == rec.metrics["requests"]["total"]
    for w in windows:
        assert w["to_s"] - w["from_s"] == pytest.approx(3.0)
        assert 0.8 * 500 <= w["scheduled_rate"] <= 1.2 * 500
        assert w["e2e_p50"] > 0
    memory = rec.metrics["drift"]["memory"]
    assert memory["samples"] >= 12  # 0.5 s telemetry over a 12 s soak
    assert math.isfinite(memory["rss_slope_bytes_per_s"])
    assert memory["rss_start_bytes"] > 0
    assert rec.metrics["drift"]["first_window_p99"] == windows[0]["e2e_p99_or_max"]


def test_shapes_report_their_phases(run):
    _, records = run
    burst = only(records, "load_shape", shape="burst")
    assert burst.status is Status.OK, burst.reasons
    before, during, after = burst.metrics["phases"]
    # the step from 300 to 3000 req/s shows in the scheduled rate of each phase
    assert during["scheduled_rate"] > 5 * before["scheduled_rate"]
    assert during["scheduled_rate"] > 5 * after["scheduled_rate"]
    ramp = only(records, "load_shape", shape="ramp")
    rates = [p["scheduled_rate"] for p in ramp.metrics["phases"]]
    assert rates == sorted(rates)
    gamma = only(records, "load_shape", shape="gamma-cv3")
    assert gamma.metrics["shape"]["burstiness"] == 3.0
    for rec in (burst, ramp, gamma):
        assert rec.metrics["phases_worst_p99"] >= rec.metrics["e2e"]["p50"]
        assert "time_account" in rec.metrics
        assert set(rec.metrics["stages"]) == {
            "queue",
            "preprocess",
            "infer",
            "postprocess",
            "other",
        }
