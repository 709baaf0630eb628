import pytest

from harness.metrics.validity import Evidence, Policy, Verdict, judge

POLICY = Policy(min_window_s=1.0, min_samples=100, max_error_rate=0.01, max_lag_p99_s=0.005)


def good(**kw):
    base = dict(
        samples=1000,
        failed=0,
        window_s=5.0,
        lag_p99_s=0.0002,
        offered_rate=200.0,
        achieved_rate=199.0,
    )
    base.update(kw)
    return Evidence(**base)


def test_a_clean_cell_is_valid_without_warnings():
    v = judge(good(), POLICY)
    assert v.verdict is Verdict.VALID
    assert v.reasons == ()
    assert v.warnings == ()


@pytest.mark.parametrize(
    ("evidence", "reason"),
    [
        (good(window_s=0.5), "measured window 0.5 s < minimum 1 s"),
        (good(samples=50), "50 successful samples < minimum 100"),
        (good(samples=50), "p99 needs >= 100 samples, have 50"),
        (
            good(samples=980, failed=20),
            "error rate 2.00% > ceiling 1.00% (20 of 1000 requests failed)",
        ),
        (good(lag_p99_s=0.010), "load-generator lag p99 10 ms > bound 5 ms"),
        (good(negative_durations=3), "clock sanity: 3 negative durations"),
    ],
)
def test_each_violated_bound_is_a_reason(evidence, reason):
    v = judge(evidence, POLICY)
    assert v.verdict is Verdict.INVALID
    assert any(r.startswith(reason) for r in v.reasons), v.reasons


def test_error_rate_at_the_ceiling_is_still_valid():
    assert judge(good(samples=990, failed=10), POLICY).verdict is Verdict.VALID


def test_saturation_is_a_warning_not_a_verdict():
    v = judge(good(achieved_rate=120.0), POLICY)
    assert v.verdict is Verdict.VALID
    assert v.warnings == (
        "saturated: completed 120 req/s of 200 offered (60%); latency grows with the window",
    )


def test_closed_loop_evidence_skips_rate_and_lag_checks():
    v = judge(Evidence(samples=500, failed=0, window_s=2.0), POLICY)
    assert v.verdict is Verdict.VALID


def test_policy_validates_itself():
    with pytest.raises(ValueError, match="fraction"):
        Policy(min_window_s=1, min_samples=1, max_error_rate=2.0)


def test_a_generator_that_sent_too_slowly_makes_the_cell_invalid():
    policy = Policy(min_window_s=1.0, min_samples=100)
    base = {"samples": 1000, "failed": 0, "window_s": 10.0, "offered_rate": 100.0}
    late = judge(Evidence(**base, sent_rate=95.0), policy)
    assert late.verdict is Verdict.INVALID
    assert "sent 95 req/s of 100 offered (95.0% < 99%)" in late.reasons[0]
    assert judge(Evidence(**base, sent_rate=99.5), policy).verdict is Verdict.VALID
    assert judge(Evidence(**base), policy).verdict is Verdict.VALID  # not measured: no verdict
