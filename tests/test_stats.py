import math

import numpy as np
import pytest

from harness.metrics import stats


def test_nearest_rank_matches_hand_computed_values():
    # 1..10: p50 is the 5th value (ceil(0.5*10)=5), p90 the 9th, p95 and p99 the 10th.
    values = list(range(10, 0, -1))
    assert stats.nearest_rank(values, 50) == 5
    assert stats.nearest_rank(values, 90) == 9
    assert stats.nearest_rank(values, 95) == 10
    assert stats.nearest_rank(values, 99) == 10
    # 1..100: p99 = 99th value, p50 = 50th.
    hundred = np.arange(1, 101)
    assert stats.nearest_rank(hundred, 99) == 99
    assert stats.nearest_rank(hundred, 50) == 50
    # 1..1000: p99.9 = 999th.
    assert stats.nearest_rank(np.arange(1, 1001), 99.9) == 999


def test_min_samples_for_each_percentile():
    assert stats.min_samples_for(50) == 2
    assert stats.min_samples_for(90) == 10
    assert stats.min_samples_for(95) == 20
    assert stats.min_samples_for(99) == 100
    assert stats.min_samples_for(99.9) == 1000
    with pytest.raises(ValueError, match="percentile"):
        stats.min_samples_for(100)


def test_summarize_omits_percentiles_without_enough_samples():
    s = stats.summarize([0.003, 0.001, 0.002] * 10)  # 30 samples
    assert s.count == 30
    assert s.min == 0.001
    assert s.max == 0.003
    assert s.mean == pytest.approx(0.002)
    assert set(s.percentiles) == {"p50", "p90", "p95"}
    assert s.percentiles["p50"] == 0.002
    assert "p99" not in s.percentiles


def test_error_adjusted_percentiles_count_failures_as_infinite():
    ok = list(np.arange(1, 96) / 1000.0)  # 95 successes: 1..95 ms
    s = stats.summarize(ok, failed=5)  # 100 requests, the 5 slowest "infinite"
    assert "p99" not in s.percentiles  # 95 successes are not enough for p99 alone
    assert s.adjusted["p50"] == pytest.approx(0.050)
    assert s.adjusted["p95"] == pytest.approx(0.095)
    assert math.isinf(s.adjusted["p99"])
    assert s.failed == 5


def test_adjusted_equals_plain_without_failures():
    values = np.linspace(0.001, 0.1, 200)
    s = stats.summarize(values)
    assert s.adjusted == s.percentiles


def test_summarize_rejects_non_finite_samples():
    with pytest.raises(ValueError, match="finite"):
        stats.summarize([1.0, float("inf")])


def test_all_failed_has_no_plain_percentiles_but_infinite_adjusted():
    s = stats.summarize([], failed=3)
    assert s.count == 0
    assert s.mean is None
    assert s.percentiles == {}
    assert math.isinf(s.adjusted["p50"])


def test_conservative_percentile_falls_back_to_max():
    assert stats.conservative([0.1, 0.5, 0.2], 99) == 0.5
    assert stats.conservative(list(range(1, 101)), 99) == 99
    assert stats.conservative([], 99) is None


def test_histogram_counts_exactly():
    assert stats.histogram([8, 1, 8, 3, 8]) == {"1": 1, "3": 1, "8": 3}


def test_percentile_intervals_bracket_the_estimate_and_cover_the_truth():
    rng = np.random.default_rng(11)
    misses = {50.0: 0, 99.0: 0}
    truth = {50.0: np.log(2.0), 99.0: np.log(100.0)}  # exponential(1) quantiles
    for _ in range(200):
        ordered = np.sort(rng.exponential(1.0, size=2000))
        for p in misses:
            lo, hi = stats.quantile_ci(ordered, p)
            assert lo is not None
            assert hi is not None
            assert lo <= stats.nearest_rank(ordered, p) <= hi
            misses[p] += not (lo <= truth[p] <= hi)
    # at least 95 % coverage, allowing for the 200 trials' own noise
    assert misses[50.0] <= 20
    assert misses[99.0] <= 20


def test_an_interval_the_data_cannot_bound_says_so():
    lo, hi = stats.quantile_ci(np.arange(100.0), 99.0)
    assert lo is not None
    assert hi is None  # 100 samples cannot bound p99 from above
    summary = stats.summarize(np.arange(1000.0) / 1000)
    assert set(summary.ci or {}) == {"p50", "p99"}
    assert (
        stats.to_json(summary)["ci95"]["p50"][0] <= 0.5 <= stats.to_json(summary)["ci95"]["p50"][1]
    )


def test_rate_interval_is_the_exact_poisson_one():
    lo, hi = stats.rate_ci(100, 10.0)
    assert lo == pytest.approx(8.136, abs=1e-3)
    assert hi == pytest.approx(12.163, abs=1e-3)
    assert stats.rate_ci(0, 1.0)[0] == 0.0


def test_left_out_percentiles_say_how_many_samples_they_need():
    doc = stats.to_json(stats.summarize(np.linspace(0.001, 0.1, 150)))
    assert "p99" in doc
    assert "p99.9" not in doc
    assert doc["needs_samples"] == {"p99.9": 1000}
    small = stats.to_json(stats.summarize([0.1] * 20))
    assert small["needs_samples"] == {"p99": 100, "p99.9": 1000}  # p95 needs exactly 20
