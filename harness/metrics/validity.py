"""The one function that decides whether a cell's numbers may be reported.

Every workload hands ``judge`` the same kind of evidence; the verdict and its reasons
are stored with the record and shown in every output. Warnings describe conditions a
reader must know (a saturated system, a noisy clock) without voiding the numbers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from harness.metrics.stats import min_samples_for


class Verdict(enum.StrEnum):
    VALID = "valid"
    INVALID = "invalid"


@dataclass(frozen=True)
class Policy:
    """Bounds a cell must meet; one per profile (see harness.session.config)."""

    min_window_s: float
    min_samples: int
    max_error_rate: float = 0.01
    max_lag_p99_s: float = 0.005
    required_percentiles: tuple[float, ...] = (50.0, 99.0)
    min_achieved_ratio: float = 0.95
    min_sent_ratio: float = 0.99

    def __post_init__(self) -> None:
        if self.min_window_s < 0 or self.min_samples < 1:
            raise ValueError("window and sample minimums must be positive")
        if not 0.0 <= self.max_error_rate <= 1.0:
            raise ValueError("max_error_rate is a fraction in [0, 1]")
        if self.max_lag_p99_s <= 0:
            raise ValueError("max_lag_p99_s must be > 0")


@dataclass(frozen=True)
class Evidence:
    """What a workload observed, in the terms ``judge`` needs.

    ``lag_p99_s`` is None when the load generator did not sleep (closed loop).
    ``offered_rate``/``achieved_rate`` are None when the load is closed-loop.
    """

    samples: int
    failed: int
    window_s: float
    lag_p99_s: float | None = None
    offered_rate: float | None = None
    achieved_rate: float | None = None
    sent_rate: float | None = None
    """Requests the generator actually sent per second of schedule (first due to last
    sent); None where sending is the schedule itself (the in-process serving loop)."""
    negative_durations: int = 0
    notes: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    """Workload-specific reasons the cell cannot be reported (a search found nothing)."""

    def __post_init__(self) -> None:
        if self.samples < 0 or self.failed < 0:
            raise ValueError("sample counts must be >= 0")


@dataclass(frozen=True)
class Validity:
    verdict: Verdict
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if (self.verdict is Verdict.INVALID) != bool(self.reasons):
            raise ValueError("an invalid verdict needs reasons and a valid one has none")


def judge(ev: Evidence, policy: Policy) -> Validity:
    """Apply every bound in ``policy`` to ``ev``; each violated bound is one reason."""
    reasons: list[str] = []
    warnings: list[str] = list(ev.notes)
    total = ev.samples + ev.failed
    if ev.window_s < policy.min_window_s:
        reasons.append(f"measured window {ev.window_s:.3g} s < minimum {policy.min_window_s:g} s")
    if ev.samples < policy.min_samples:
        reasons.append(f"{ev.samples} successful samples < minimum {policy.min_samples}")
    for p in policy.required_percentiles:
        need = min_samples_for(p)
        if ev.samples < need:
            reasons.append(f"p{p:g} needs >= {need} samples, have {ev.samples}")
    if total and ev.failed / total > policy.max_error_rate:
        reasons.append(
            f"error rate {ev.failed / total:.2%} > ceiling {policy.max_error_rate:.2%}"
            f" ({ev.failed} of {total} requests failed)"
        )
    if ev.lag_p99_s is not None and ev.lag_p99_s > policy.max_lag_p99_s:
        reasons.append(
            f"load-generator lag p99 {ev.lag_p99_s * 1e3:.3g} ms > bound"
            f" {policy.max_lag_p99_s * 1e3:g} ms: the client, not the system, set the timing"
        )
    if ev.sent_rate is not None and ev.offered_rate:
        ratio = ev.sent_rate / ev.offered_rate
        if ratio < policy.min_sent_ratio:
            reasons.append(
                f"the load generator sent {ev.sent_rate:.4g} req/s of {ev.offered_rate:.4g}"
                f" offered ({ratio:.1%} < {policy.min_sent_ratio:.0%}): it could not keep up"
            )
    if ev.negative_durations:
        reasons.append(f"clock sanity: {ev.negative_durations} negative durations")
    reasons.extend(ev.problems)
    warnings.extend(_saturation(ev, policy))
    verdict = Verdict.INVALID if reasons else Verdict.VALID
    return Validity(verdict, tuple(reasons), tuple(warnings))


def _saturation(ev: Evidence, policy: Policy) -> list[str]:
    if ev.offered_rate is None or ev.achieved_rate is None or ev.offered_rate <= 0:
        return []
    ratio = ev.achieved_rate / ev.offered_rate
    if ratio >= policy.min_achieved_ratio:
        return []
    return [
        f"saturated: completed {ev.achieved_rate:.4g} req/s of {ev.offered_rate:.4g} offered"
        f" ({ratio:.0%}); latency grows with the window"
    ]
