"""The precision comparison's arithmetic: agreement figures, tolerance verdicts, the
interleaved timing order and the speed-up interval, on constructed outputs and fake
engines (harness-test fakes: counters, not engines)."""

from __future__ import annotations

import time
import types

import numpy as np
import pytest

from harness.metrics.streamtiming import RequestRecord
from harness.metrics.validity import Policy
from harness.session.cell import Cell
from workloads.lib.precision import TOLERANCES, Timed, Tolerance, agreement, interleaved, speedup
from workloads.test_precision import _finish_generative


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


def test_the_interleaved_window_lies_on_perf_counter_for_its_energy():
    before = time.perf_counter()
    timed = interleaved(lambda b: {}, lambda b: {}, [{}], window_s=0.0, min_samples=3, budget_s=9)
    after = time.perf_counter()
    assert timed.span is not None
    lo, hi = timed.span
    assert before <= lo < hi <= after  # the telemetry's clock
    assert hi - lo == pytest.approx(timed.window_s, abs=1e-9)


def _phase(t0: float, n: int = 20) -> list[RequestRecord]:
    """``n`` streamed requests one after another from ``t0`` s, 0.1 s each."""
    return [
        RequestRecord(
            t_sched=t0 + 0.1 * i,
            t_send=t0 + 0.1 * i,
            t_end=t0 + 0.1 * i + 0.1,
            chunk_times=tuple(t0 + 0.1 * i + 0.025 * k for k in range(1, 5)),
            chunk_tokens=(1, 1, 1, 1),
            n_in=8,
            n_asked=4,
        )
        for i in range(n)
    ]


def test_the_generative_cell_places_the_reduced_phase_as_its_energy_window():
    # fp32 served 10..12 s, the bf16 engine loaded in between, bf16 served 20..22 s: the
    # energy is of the bf16 phase, never of a span over both (it would count the loading)
    cell = Cell(
        run_id="r",
        cell_id="c",
        workload="precision_generative",
        engine="e",
        params={"precision": "bf16"},
        policy=Policy(min_window_s=1.0, min_samples=10),
        environment={},
    )
    phases = {"fp32": {"records": _phase(10.0)}, "bf16": {"records": _phase(20.0)}}
    found = {"requests": 8, "prefix_share_mean": 1.0, "prefix_share_min": 1.0}
    settings = types.SimpleNamespace(seed=0)  # all _finish_generative reads of the settings
    _finish_generative(cell, settings, "bf16", phases, found, [], 0.8)  # type: ignore[arg-type]
    assert cell.result is not None
    assert cell.result.span == pytest.approx((20.0, 22.0))


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
