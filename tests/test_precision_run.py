"""The precision workload for real on ONNX Runtime (CPU, quick profile, shortened window):
dynamic int8 against fp32 on both embedded models with a speed-up from one interleaved
window and the agreement beside it; fp16 and bf16 skip with the engine's reason."""

from __future__ import annotations

import pytest

from harness.results.records import Status
from tests.support.once import once
from tests.support.runner import run_workloads

pytestmark = pytest.mark.slow

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def records(request: pytest.FixtureRequest):
    return once(request, _records)


def _records(tmp):
    result = run_workloads(
        tmp,
        "--engine=onnxruntime",
        "--window=1.2",
        "-k",
        "test_precision.py",
    )
    assert result.returncode == 0, result.stdout[-4000:]
    generative = [r for r in result.records.values() if r.workload == "precision_generative"]
    assert {r.status for r in generative} == {Status.SKIPPED}  # onnxruntime is not generative
    return {
        (r.params["model"], r.params["precision"]): r
        for r in result.records.values()
        if r.workload == "precision"
    }


def test_int8_cells_compare_with_fp32_in_one_window(records):
    for model in ("tiny-cnn", "tiny-encoder"):
        rec = records[(model, "int8")]
        assert rec.status is Status.OK, rec.reasons
        m = rec.metrics
        assert m["reference"]["count"] >= 100
        assert m["reduced"]["count"] == m["reference"]["count"]
        ratio = m["reference"]["p50"] / m["reduced"]["p50"]
        assert m["speedup"]["p50_ratio"] == pytest.approx(ratio)
        lower, upper = m["speedup"]["ci95"]
        assert lower <= m["speedup"]["p50_ratio"] <= upper
        assert rec.engine_info["effective"]["precision"].startswith("dynamic int8")
        assert rec.engine_info["reference"]["effective"]["precision"] == "as the model"
        assert rec.engine_info["effective"]["model_loaded"].endswith("-int8.onnx")
        flagged = [w for w in rec.validity.warnings if w.startswith("precision int8 vs fp32")]
        assert bool(flagged) == (not m["within_tolerance"])


def test_the_classifier_reports_top1_and_the_encoder_cosine(records):
    cnn = records[("tiny-cnn", "int8")].metrics["agreement"]["outputs"]["logits"]
    assert 0.0 <= cnn["top1_agreement"] <= 1.0
    assert cnn["rows"] == 8 * 8
    enc = records[("tiny-encoder", "int8")].metrics["agreement"]["outputs"]["embedding"]
    assert "top1_agreement" not in enc
    assert 0.9 < enc["cosine_min"] <= 1.0 + 1e-9
    assert enc["max_abs"] > 0  # int8 is not fp32


def test_cpu_fp16_and_bf16_skip_with_the_reason(records):
    for model in ("tiny-cnn", "tiny-encoder"):
        fp16 = records[(model, "fp16")]
        assert fp16.status is Status.SKIPPED
        assert "CPU provider has few fp16 kernels" in fp16.reasons[0]
        bf16 = records[(model, "bf16")]
        assert bf16.status is Status.SKIPPED
        assert bf16.reasons[0] == "onnxruntime has no bf16 path (models are fp32, fp16 or int8)"
