"""One quick-profile run of every workload on the real ONNX Runtime, checked by content."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.metrics import stats
from harness.report import matrix
from harness.results import store
from harness.results.records import CellRecord, Status
from tests.support.once import once
from tests.support.runner import run_workloads

pytestmark = pytest.mark.slow

pytest.importorskip("onnxruntime")

WINDOW_S = 1.5  # quick profile, shortened: every cell still needs >= 1 s and >= 100 samples


@pytest.fixture(scope="module")
def run(request: pytest.FixtureRequest) -> tuple[Path, dict[str, CellRecord], str]:
    return once(request, _run)


def _run(tmp: Path) -> tuple[Path, dict[str, CellRecord], str]:
    result = run_workloads(
        tmp,
        "--engine=onnxruntime",
        "--profile=quick",
        f"--window={WINDOW_S}",
        "--requests=120",
        "--ignore=workloads/test_load.py",  # tests/test_load_onnxruntime.py runs it
        "--ignore=workloads/test_preprocessing.py",  # tests/test_preprocessing_run.py runs it
        "--ignore=workloads/test_precision.py",  # tests/test_precision_run.py runs it
    )
    assert result.returncode == 0, result.stdout[-4000:]
    return result.run_dir, result.records, result.stdout


def batching(records: dict[str, CellRecord], rate: int, mode: str) -> CellRecord:
    (rec,) = [
        r
        for r in records.values()
        if r.workload == "batching" and r.params["rate"] == rate and r.params["mode"] == mode
    ]
    return rec


def test_every_cell_is_ok_and_the_run_is_complete(run):
    run_dir, records, stdout = run
    manifest = store.read_manifest(run_dir)
    assert manifest.state == "complete"
    assert {c.cell_id for c in manifest.planned} == set(records)
    tensor = {cid: r for cid, r in records.items() if r.workload in ("batching", "shapes")}
    assert len(tensor) == 12
    not_ok = {cid: r.reasons for cid, r in tensor.items() if r.status is not Status.OK}
    assert not_ok == {}
    # the generative workloads are planned too, and skip with the precise reason
    generative = [r for r in records.values() if r.workload not in ("batching", "shapes")]
    assert {r.workload for r in generative} == {
        "streaming",
        "continuous_batching",
        "dataset",
        "sessions",
        "shared_prefix",
        "trace",
        "embeddings",
        "multimodal",
        "speculative",
    }
    for rec in generative:
        assert rec.status is Status.SKIPPED
        lacks = "pooling=" if rec.workload == "embeddings" else "family=generative"
        assert rec.reasons[0].startswith(f"onnxruntime lacks capability {lacks}")
    assert f"cells: 12 ok, {len(generative)} skipped" in stdout


def test_records_describe_engine_environment_and_seeds(run):
    _, records, _ = run
    rec = batching(records, 100, "static")
    assert rec.engine_info["active_providers"] == ["CPUExecutionProvider"]
    assert rec.engine_info["embedded_model"]["name"] == "tiny-cnn"
    assert rec.engine_info["version"]
    assert rec.environment["cpu"]["logical_cores"] >= 1
    assert rec.environment["packages"]["onnxruntime"] == rec.engine_info["version"]
    assert set(rec.seeds) == {"arrivals", "inputs", "model"}
    assert rec.window["duration_s"] >= 1.0
    assert rec.validity is not None
    assert rec.validity.verdict == "valid"


def test_batching_figures_are_plausible_and_recomputable(run):
    _, records, _ = run
    for rec in (r for r in records.values() if r.workload == "batching"):
        e2e, queue = rec.metrics["e2e"], rec.metrics["queue"]
        assert 0 < e2e["min"] <= e2e["p50"] <= e2e["p99"] <= e2e["max"] < 10.0, rec.cell_id
        assert e2e["p50"] >= queue["p50"] >= 0
        # the engine's own time is part of the batch's dispatch-to-done latency
        assert 0 < rec.metrics["infer"]["p50"] <= rec.metrics["latency"]["p50"]
        assert rec.metrics["infer"]["count"] == rec.metrics["batches"]["count"]
        assert e2e["failed"] == 0
        # percentiles recompute from the stored raw samples
        again = stats.summarize(rec.samples["e2e"])
        assert again.percentiles["p99"] == pytest.approx(e2e["p99"], abs=1e-6)
        hist = {int(k): v for k, v in rec.histograms["batch_size"].items()}
        assert sum(k * v for k, v in hist.items()) == e2e["count"]
        assert max(hist) <= rec.params["batch"]
        scheduled = rec.metrics["load"]["scheduled_rate"]
        if rec.params["rate"] == 100:  # far from saturation: everything offered is served
            assert rec.metrics["throughput"]["requests_per_s"] == pytest.approx(scheduled, rel=0.2)


def test_batch_sizes_follow_the_policy(run):
    _, records, _ = run
    assert batching(records, 100, "none").histograms["batch_size"].keys() == {"1"}
    static = batching(records, 100, "static")
    hist = static.histograms["batch_size"]
    assert set(hist) <= {"8"} | {str(k) for k in range(1, 8)}
    assert (
        sum(v for k, v in hist.items() if k != "8")
        == static.metrics["batches"]["flushed_partial"]
        <= 1
    )
    dynamic = batching(records, 100, "dynamic")
    # at 100 req/s a 2 ms window rarely catches a second request
    assert dynamic.metrics["batches"]["mean_size"] < 2.0


def test_static_batching_waits_to_fill_at_low_load(run):
    run_dir, records, _ = run
    static, dynamic = batching(records, 100, "static"), batching(records, 100, "dynamic")
    # 8 requests at 100 req/s take ~70 ms to gather; a 2 ms delay bound caps the wait.
    assert static.metrics["e2e"]["p50"] > 5 * dynamic.metrics["e2e"]["p50"]
    assert dynamic.metrics["queue"]["max"] < 0.002 + 0.05  # 2 ms bound + scheduling noise
    md = (run_dir / "matrix.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| 100 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["none", "static", "dynamic"]


def test_shapes_modes_trade_padding_for_distinct_shapes(run):
    _, records, _ = run
    by = {
        (r.params["model"], r.params["mode"]): r for r in records.values() if r.workload == "shapes"
    }
    for model in ("tiny-encoder", "tiny-cnn-dynhw"):
        fixed, dyn, bucket = (by[(model, m)] for m in ("fixed", "dynamic", "bucketed"))
        assert fixed.metrics["shapes"]["distinct"] == 1
        assert fixed.metrics["first_seen"]["count"] == 0  # warm-up ran the one fixed shape
        assert 1 < bucket.metrics["shapes"]["distinct"] <= 4 ** len(fixed.metrics["shapes"]["dims"])
        assert bucket.metrics["shapes"]["distinct"] < dyn.metrics["shapes"]["distinct"]
        assert dyn.metrics["padding"]["waste"] == 0.0
        assert fixed.metrics["padding"]["waste"] > bucket.metrics["padding"]["waste"] > 0.0
        for rec in (fixed, dyn, bucket):
            per_shape = rec.metrics["per_shape"]
            assert sum(v["count"] for v in per_shape.values()) == rec.window["requests"]
            cold = sum(v["first_seen"] is not None for v in per_shape.values())
            assert cold == rec.metrics["first_seen"]["count"]
            # the latencies of the first request of each shape, which first_seen.p50 summarizes
            assert len(rec.samples["first_seen"]) == cold
            # the same seeded requests in every mode: same real work per request
            per_request = rec.metrics["padding"]["real_elements"] / rec.window["requests"]
            assert per_request == pytest.approx(
                fixed.metrics["padding"]["real_elements"] / fixed.window["requests"]
            )
        # fixed pads everything to the maximum, so each request costs at least as much
        assert fixed.metrics["latency"]["p50"] > dyn.metrics["latency"]["p50"]


def test_report_rebuilds_identical_bytes(run):
    run_dir, _, _ = run
    before = (run_dir / "matrix.md").read_bytes(), (run_dir / "matrix.csv").read_bytes()
    matrix.write(run_dir)
    assert ((run_dir / "matrix.md").read_bytes(), (run_dir / "matrix.csv").read_bytes()) == before
