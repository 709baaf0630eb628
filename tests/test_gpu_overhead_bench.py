"""benchmarks/gpu_overhead.py's figures from fabricated samples: the ratio is the
harness's median over the plain loop's, the added latency their difference, and the goal
is judged on that ratio. The benchmark run itself (torch, on the CPU) is in
tests/test_torch_run.py, which ``tox -e torch`` runs."""

from __future__ import annotations

import pytest

from benchmarks import gpu_overhead


def _measured(plain: float, harness: float, n: int = 200, waited: int = 0) -> dict:
    return {
        "plain": {"timed": [plain] * n, "wall": [plain * 1.01] * n, "e2e": [plain * 1.02] * n},
        "harness": {
            "e2e": [harness] * n,
            "service": [harness * 0.99] * n,
            "queue": [2e-5] * n,
            "lag": [1e-5] * n,
        },
        "rounds": [
            {"plain_median_s": plain, "harness_median_s": harness, "ratio": harness / plain}
        ],
        "waited": waited,
    }


def test_the_ratio_is_the_harness_median_over_the_plain_one():
    doc = gpu_overhead.result(_measured(0.010, 0.0101), cuda=True)
    assert doc["plain"]["median_s"] == pytest.approx(0.010)
    assert doc["plain"]["p99_s"] == pytest.approx(0.010)
    assert doc["plain"]["timer"] == "CUDA events, h2d to d2h"
    assert doc["harness"]["median_s"] == pytest.approx(0.0101)
    assert doc["ratio"] == pytest.approx(1.01)
    assert doc["added_latency_s"] == pytest.approx(0.0001)
    assert doc["service_ratio"] == pytest.approx(0.0101 * 0.99 / 0.010)
    assert doc["goal"]["met"] is True
    assert gpu_overhead.result(_measured(0.010, 0.0103), cuda=False)["goal"]["met"] is False


def test_too_few_requests_for_a_p99_leave_it_out_rather_than_show_the_maximum():
    doc = gpu_overhead.result(_measured(0.010, 0.012, n=50), cuda=False)
    assert doc["plain"]["timer"] == "perf_counter"
    assert doc["plain"]["p99_s"] is None
    assert doc["plain"]["median_s"] == pytest.approx(0.010)


def _doc(measured: dict) -> dict:
    return {
        "command": "python -m benchmarks.gpu_overhead --device cuda",
        "model": {"name": "resnet50", "batch": 1, "dtype": "float32"},
        "device": "cuda",
        "schedule": {"iterations": 1000, "rate": 150.0, "rounds": 5},
        **gpu_overhead.result(measured, cuda=True),
    }


def test_the_summary_says_both_ways_the_difference_and_the_ratio():
    text = gpu_overhead.summary(_doc(_measured(0.004, 0.00404)))
    assert "| plain loop | CUDA events, h2d to d2h | 4 ms | 4 ms |" in text
    assert "| (plain, host clock) | perf_counter | 4.04 ms | 4.04 ms |" in text
    assert "| through the harness | perf_counter, due to done (the cell's e2e) | 4.04 ms |" in text
    assert "added latency (median difference): 0.04 ms" in text
    assert "ratio of medians 1.0100 (rounds 1.0100 to 1.0100)" in text
    assert ": met" in text
    assert "note:" not in text


def test_the_summary_calls_out_requests_that_queued():
    text = gpu_overhead.summary(_doc(_measured(0.004, 0.009, waited=50)))
    assert "note: 50 of 200 requests through the harness were due before the one" in text
    assert "note:" not in gpu_overhead.summary(_doc(_measured(0.004, 0.009, waited=2)))


def test_iterations_must_leave_a_p99():
    with pytest.raises(SystemExit):
        gpu_overhead._parse(["--iterations", "99", "--rounds", "1"])
    with pytest.raises(SystemExit):
        gpu_overhead._parse(["--iterations", "100", "--rounds", "3"])  # 33 a round: 99 in all
    assert gpu_overhead._parse(["--iterations", "100", "--rounds", "2"]).iterations == 100


def test_the_default_model_is_the_reference_cnn_where_the_embedded_set_has_it(monkeypatch):
    assert gpu_overhead.default_model() == "resnet50"  # the reference set's CNN
    model, info = gpu_overhead.model_path("tiny-cnn", 0)  # the tiny one stays selectable
    assert model.is_file()
    assert info["name"] == "tiny-cnn"
    monkeypatch.setattr(gpu_overhead, "EMBEDDED", {"tiny-cnn": None})
    assert gpu_overhead.default_model() == "tiny-cnn"
