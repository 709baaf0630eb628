"""The latency-trend warning and the classifiers of validity messages (harness.metrics.validity).

Synthetic, seeded series: stationary latency (independent or queued) must not trend, a
material ramp must; the classifiers must recognize the exact texts old records hold.
"""

import re

import numpy as np
import pytest

from harness.load.serve_summary import summarize_trace
from harness.load.serving import ServeTrace
from harness.load.stream_summary import summarize_stream
from harness.metrics.streamtiming import RequestRecord
from harness.metrics.validity import (
    DRIFTED,
    SATURATED,
    TREND_RULE,
    TRENDING,
    Evidence,
    Policy,
    TrendRule,
    Verdict,
    judge,
    latency_trend,
    measurement_reasons,
    unstable_latency,
)
from workloads.lib.load import _drift_warnings

MS = 1e-3
SHOWN = re.compile(
    r"median (?P<first>[\d.]+) ms in the first third of the requests,"
    r" (?P<last>[\d.]+) ms in the last \((?P<ratio>[\d.]+)x, (?P<dir>rising|falling);"
)


def shown(warning: str) -> dict[str, str]:
    assert warning.startswith(TRENDING), warning
    m = SHOWN.search(warning)
    assert m, warning
    return m.groupdict()


def ramp(start_ms: float, end_ms: float, n: int, seed: int, sigma: float = 0.1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.linspace(start_ms, end_ms, n) * MS * rng.lognormal(0.0, sigma, n)


def mm1(n: int, load: float, seed: int, service_rate: float = 4000.0) -> np.ndarray:
    """Sojourn times of a stationary M/M/1 queue (Lindley), its start-up transient cut."""
    rng = np.random.default_rng(seed)
    skip = n // 10
    gaps = rng.exponential(1.0 / (load * service_rate), n + skip)
    service = rng.exponential(1.0 / service_rate, n + skip)
    wait = np.zeros(n + skip)
    for i in range(1, n + skip):
        wait[i] = max(0.0, wait[i - 1] + service[i - 1] - gaps[i])
    return (wait + service)[skip:]


# --- the detector --------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_stationary_lognormal_noise_does_not_trend(seed):
    x = np.random.default_rng(seed).lognormal(np.log(2 * MS), 0.5, 5000)
    assert latency_trend(x) is None


def test_a_ramp_up_trends_with_its_medians_and_ratio():
    warning = latency_trend(ramp(1.0, 3.0, 3000, seed=1))
    assert warning is not None
    got = shown(warning)
    assert got["dir"] == "rising"
    # a linear ramp's thirds have their medians at 1/6 and 5/6 of the way: 1.33 and 2.67 ms
    assert float(got["first"]) == pytest.approx(4 / 3, rel=0.03)
    assert float(got["last"]) == pytest.approx(8 / 3, rel=0.03)
    assert float(got["ratio"]) == pytest.approx(2.0, rel=0.03)
    assert "Kendall tau +" in warning


def test_a_ramp_down_from_warm_up_trends_falling():
    warning = latency_trend(ramp(3.0, 1.0, 3000, seed=2))
    assert warning is not None
    got = shown(warning)
    assert got["dir"] == "falling"
    assert float(got["first"]) == pytest.approx(8 / 3, rel=0.03)
    assert float(got["ratio"]) == pytest.approx(0.5, rel=0.03)
    assert "Kendall tau -" in warning


def test_too_few_samples_is_no_trend_however_steep():
    steep = ramp(1.0, 10.0, TREND_RULE.min_samples, seed=3)
    assert latency_trend(steep[:-1]) is None
    assert latency_trend(steep) is not None  # the bound is the rule's minimum, not more


@pytest.mark.parametrize("seed", range(5))
def test_heavy_tailed_stationary_latency_with_spikes_does_not_trend(seed):
    rng = np.random.default_rng(seed)
    x = rng.lognormal(np.log(1 * MS), 1.2, 10_000)
    spikes = rng.random(x.size) < 0.01
    x[spikes] *= rng.pareto(1.1, int(spikes.sum())) * 50 + 20  # a 1 % of 20x..10^4x stalls
    assert latency_trend(x) is None


def test_a_significant_but_immaterial_drift_is_no_trend():
    x = ramp(1.0, 1.25, 20_000, seed=4, sigma=0.3)  # rank correlation certain, effect 1.2x
    assert latency_trend(x) is None
    assert latency_trend(x, TrendRule(min_ratio=1.1)) is not None


@pytest.mark.parametrize("seed", range(6))
def test_a_stationary_queue_at_high_load_does_not_trend(seed):
    """Queued latency wanders slowly (autocorrelated): not a trend of the system."""
    assert latency_trend(mm1(3500, 0.8, seed)) is None


def test_the_order_not_the_values_makes_a_trend():
    x = ramp(1.0, 3.0, 3000, seed=5)
    assert latency_trend(x) is not None
    assert latency_trend(np.random.default_rng(5).permutation(x)) is None


def test_a_step_half_way_is_a_trend():
    rng = np.random.default_rng(6)
    x = np.where(np.arange(3000) < 1500, 1.0, 2.0) * MS * rng.lognormal(0.0, 0.5, 3000)
    warning = latency_trend(x)
    assert warning is not None
    assert shown(warning)["dir"] == "rising"


def test_a_change_within_the_generators_timing_error_is_no_trend():
    """The rate sweep's first null-engine point: 43 -> 77 us under a 0.56 ms lag p99."""
    x = ramp(0.035, 0.085, 1000, seed=12)  # 1.8x, 0.03 ms between the thirds' medians
    assert latency_trend(x) is not None
    assert latency_trend(x, floor_s=0.56 * MS) is None
    assert latency_trend(ramp(1.0, 3.0, 1000, seed=12), floor_s=0.56 * MS) is not None


def test_failed_requests_infinite_latency_are_dropped_not_counted():
    x = np.random.default_rng(7).lognormal(np.log(MS), 0.3, 600)
    x[-150:] = np.inf  # timed-out requests at the end are the error rate's business
    assert latency_trend(x) is None


def test_the_rule_checks_itself():
    with pytest.raises(ValueError, match="blocks"):
        TrendRule(min_samples=20, blocks=30)
    with pytest.raises(ValueError, match="min_ratio"):
        TrendRule(min_ratio=1.0)


# --- where open-loop cells build their evidence ----------------------------------------


def trace_of(latency: np.ndarray, rate: float = 1000.0) -> ServeTrace:
    n = latency.size
    t_sched = 100.0 + np.arange(n) / rate
    return ServeTrace(
        t_sched=t_sched,
        t_send=t_sched.copy(),
        t_done=t_sched + latency,
        failed=np.zeros(n, dtype=np.bool_),
        batch_of=np.arange(n),
    )


def test_a_serve_trace_that_ramps_carries_the_warning_into_judge():
    summary = summarize_trace(trace_of(ramp(1.0, 3.0, 2000, seed=8)), offered_rate=1000.0)
    assert len(summary.evidence.notes) == 1
    validity = judge(summary.evidence, Policy(min_window_s=1.0, min_samples=100))
    assert validity.verdict is Verdict.VALID  # a warning, not a verdict
    assert unstable_latency(validity.warnings) == summary.evidence.notes
    assert shown(validity.warnings[0])["dir"] == "rising"


def test_a_serve_trace_drift_below_its_own_lag_p99_is_no_trend():
    trace = trace_of(ramp(0.035, 0.085, 2000, seed=13))
    assert len(summarize_trace(trace, 1000.0).evidence.notes) == 1  # no lag recorded
    trace.lag.extend([0.0002] * 200 + [0.001] * 10)  # lag p99 1 ms
    assert summarize_trace(trace, 1000.0).evidence.notes == ()


def test_a_shaped_load_and_a_stationary_trace_carry_no_trend():
    ramped = trace_of(ramp(1.0, 3.0, 2000, seed=9))
    assert summarize_trace(ramped, 1000.0, stationary=False).evidence.notes == ()
    flat = trace_of(np.random.default_rng(9).lognormal(np.log(MS), 0.5, 2000))
    assert summarize_trace(flat, 1000.0).evidence.notes == ()


def stream_records(latency: np.ndarray, rate: float = 50.0) -> list[RequestRecord]:
    out = []
    for i, e2e in enumerate(latency):
        t = 10.0 + i / rate
        out.append(
            RequestRecord(
                t_sched=t,
                t_send=t,
                t_end=t + e2e,
                chunk_times=(t + e2e / 2, t + e2e),
                chunk_tokens=(1, 1),
                n_in=8,
                n_asked=2,
            )
        )
    return out


def test_a_stream_that_ramps_warns_in_schedule_order_whatever_the_record_order():
    records = stream_records(ramp(20.0, 60.0, 300, seed=10))
    shuffled = [records[i] for i in np.random.default_rng(10).permutation(len(records))]
    for given in (records, shuffled):
        notes = summarize_stream(given, (), offered_rate=50.0).evidence.notes
        assert len(notes) == 1
        got = shown(notes[0])
        assert got["dir"] == "rising"
        assert float(got["ratio"]) == pytest.approx(2.0, rel=0.05)
    assert summarize_stream(records, (), offered_rate=None).evidence.notes == ()  # closed loop
    assert summarize_stream(records, (), 50.0, stationary=False).evidence.notes == ()


# --- the classifiers -------------------------------------------------------------------

POLICY = Policy(min_window_s=1.0, min_samples=100, max_error_rate=0.01, max_lag_p99_s=0.005)
GOOD = dict(samples=1000, failed=0, window_s=5.0, lag_p99_s=0.0002, offered_rate=100.0)

# The exact texts records written before the constants hold (each one's whole message).
MEASUREMENT_TEXTS = [
    (dict(window_s=0.5), "measured window 0.5 s < minimum 1 s"),
    (dict(samples=50), "50 successful samples < minimum 100"),
    (dict(samples=50), "p99 needs >= 100 samples, have 50"),
    (
        dict(lag_p99_s=0.010),
        "load-generator lag p99 10 ms > bound 5 ms: the client, not the system, set the timing",
    ),
    (
        dict(sent_rate=95.0),
        "the load generator sent 95 req/s of 100 offered (95.0% < 99%): it could not keep up",
    ),
    (dict(negative_durations=3), "clock sanity: 3 negative durations"),
]


@pytest.mark.parametrize(("violation", "text"), MEASUREMENT_TEXTS)
def test_each_measurement_reason_keeps_its_text_and_is_classified(violation, text):
    v = judge(Evidence(**(GOOD | violation)), POLICY)
    assert v.verdict is Verdict.INVALID
    assert text in v.reasons, v.reasons
    assert text in measurement_reasons(v.reasons)
    assert measurement_reasons([text]) == (text,)  # an old record's text, as stored


def test_the_error_rate_and_a_workload_problem_are_about_the_system():
    ev = Evidence(**(GOOD | dict(samples=980, failed=20, problems=("no knee: blew up",))))
    v = judge(ev, POLICY)
    assert v.reasons == (
        "error rate 2.00% > ceiling 1.00% (20 of 1000 requests failed)",
        "no knee: blew up",
    )
    assert measurement_reasons(v.reasons) == ()


def test_a_cell_with_every_reason_splits_into_measurement_and_system():
    ev = Evidence(samples=50, failed=5, window_s=0.5, lag_p99_s=0.01, negative_durations=1)
    v = judge(ev, POLICY)
    measured = measurement_reasons(v.reasons)
    assert [r for r in v.reasons if r not in measured] == [
        "error rate 9.09% > ceiling 1.00% (5 of 55 requests failed)"
    ]
    assert len(measured) == len(v.reasons) - 1 == 5


def test_saturation_trend_and_soak_drift_are_unstable_latency_and_nothing_else_is():
    saturated = judge(Evidence(**(GOOD | dict(achieved_rate=60.0))), POLICY).warnings
    assert saturated == (
        "saturated: completed 60 req/s of 100 offered (60%); latency grows with the window",
    )
    trend = latency_trend(ramp(1.0, 3.0, 600, seed=11))
    assert trend is not None
    windows = [{"e2e_p99_or_max": 0.010}, {"e2e_p99_or_max": 0.030}]
    soak = _drift_warnings(windows, {"rss_growth_fraction": 0.5})
    assert soak[1] == "latency drifted: last window p99 30 ms > 2 x the first's 10 ms"
    others = [
        soak[0],  # memory growth: the soak's other finding, not a latency one
        "the knee is a lower bound: the sweep ran out of points",
        "the GPU throttled during the cell (software power cap); its figures are not a"
        " steady clock's",
    ]
    found = unstable_latency([*saturated, trend, *soak, *others])
    assert found == (*saturated, trend, soak[1])
    assert [w.split(":")[0] + ":" for w in found] == [SATURATED, TRENDING, DRIFTED]
