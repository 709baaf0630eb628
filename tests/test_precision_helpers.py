"""The precision comparison's arithmetic: agreement figures, tolerance verdicts, the
interleaved timing order and the speed-up interval, on constructed outputs and fake
engines (harness-test fakes: counters, not engines)."""

from __future__ import annotations

import numpy as np
import pytest

from workloads.precision import TOLERANCES, Timed, Tolerance, agreement, interleaved, speedup


def _logits(rows: list[list[float]]) -> dict[str, np.ndarray]:
    return {"logits": np.asarray(rows, dtype=np.float32)}


def test_identical_outputs_agree_fully():
    ref = [_logits([[1.0, 2.0], [3.0, 0.5]])]
    found = agreement(ref, ref, classifier=True)
    figures = found["outputs"]["logits"]
    assert figures["max_abs"] == 0.0
    assert figures["top1_agreement"] == 1.0
    assert figures["cosine_min"] == pytest.approx(1.0)
    assert TOLERANCES["fp16"].breaches(found) == []


def test_a_flipped_class_and_a_turned_row_are_breaches():
    ref = [_logits([[1.0, 2.0], [3.0, 0.5]]), _logits([[0.0, 1.0], [1.0, 0.0]])]
    low = [_logits([[2.1, 2.0], [3.0, 0.5]]), _logits([[0.0, 1.0], [1.0, 0.0]])]
    found = agreement(ref, low, classifier=True)
    figures = found["outputs"]["logits"]
    assert figures["rows"] == 4
    assert figures["top1_agreement"] == 0.75
    assert figures["max_abs"] == pytest.approx(1.1)
    breaches = Tolerance(top1_agreement=0.99, cosine_min=0.999).breaches(found)
    assert breaches[0] == "logits: top-1 agreement 75.0% < 99%"
    assert breaches[1].startswith("logits: cosine similarity min 0.9")


def test_embeddings_are_judged_by_cosine_only():
    ref = [{"embedding": np.ones((3, 4), np.float32)}]
    low = [{"embedding": np.ones((3, 4), np.float32) * 2}]  # same direction, twice as long
    found = agreement(ref, low, classifier=False)
    figures = found["outputs"]["embedding"]
    assert "top1_agreement" not in figures
    assert figures["cosine_min"] == pytest.approx(1.0)
    assert figures["mean_abs"] == pytest.approx(1.0)


def test_calls_are_interleaved_abba_until_both_have_their_samples():
    calls: list[str] = []
    pool = [{"x": np.zeros(1)}, {"x": np.ones(1)}]
    timed = interleaved(
        lambda b: calls.append("A") or {},
        lambda b: calls.append("B") or {},
        pool,
        window_s=0.0,
        min_samples=4,
        budget_s=60.0,
    )
    assert "".join(calls) == "ABBAABBA"
    assert len(timed.reference) == len(timed.reduced) == 4


def test_speedup_is_the_ratio_of_medians_with_a_conservative_interval():
    rng = np.random.default_rng(0)
    ref = list(2.0 + rng.uniform(-0.1, 0.1, 400))
    low = list(1.0 + rng.uniform(-0.05, 0.05, 400))
    result = speedup(Timed(ref, low, 1.0))
    assert result["p50_ratio"] == pytest.approx(2.0, rel=0.02)
    lower, upper = result["ci95"]
    assert lower < result["p50_ratio"] < upper
    assert upper - lower < 0.2
    few = speedup(Timed([1.0, 1.1], [0.5, 0.6], 1.0))
    assert few["ci95"] == [None, None]  # two samples cannot bound a median
