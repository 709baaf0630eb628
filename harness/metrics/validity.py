"""The one function that decides whether a cell's numbers may be reported.

Every workload hands ``judge`` the same kind of evidence; the verdict and its reasons
are stored with the record and shown in every output. Warnings describe conditions a
reader must know (a saturated system, a noisy clock) without voiding the numbers; the
ones that say the latency figures are not a stable property of the system (saturated,
trending, drifting) are found by ``unstable_latency``, and the reasons about the
measurement rather than the system by ``measurement_reasons``.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from harness.metrics.stats import min_samples_for

# Warnings whose cell's latency figures describe the window, not the system: a reader (and
# ``compare``) must not take its percentiles as a stable property. Classify by these
# prefixes (``unstable_latency``), never by ad-hoc strings; old records hold these texts.
SATURATED = "saturated:"
"""The system completed clearly less than it was offered: latency grows with the window."""
TRENDING = "latency trends over the window:"
"""Latency rose or fell materially from the first third of the requests to the last."""
DRIFTED = "latency drifted:"
"""The soak's last window p99 above twice its first's (``workloads.lib.load._drift_warnings``)."""
UNSTABLE_LATENCY = (SATURATED, TRENDING, DRIFTED)

# The start of each invalid reason ``judge`` writes about the *measurement*, not the
# system: the numbers could not be measured well enough, whatever the system did. The
# messages are built from these constants and ``measurement_reasons`` matches them (a
# count leads two of them, so the match is a pattern anchored at the start).
WINDOW_TOO_SHORT = "measured window "
TOO_FEW_SAMPLES = " successful samples < minimum "  # after the count
PERCENTILE_SAMPLES = " needs >= "  # after ``p99``, before the count and "samples, have"
GENERATOR_LAG = "load-generator lag p99 "
GENERATOR_BEHIND = "the load generator sent "
CLOCK_SANITY = "clock sanity:"
ERROR_RATE = "error rate "
"""About the system (it failed requests), so not a measurement reason."""

_MEASUREMENT = tuple(
    re.compile(pattern)
    for pattern in (
        re.escape(WINDOW_TOO_SHORT),
        r"\d+" + re.escape(TOO_FEW_SAMPLES),
        r"p[0-9.e+-]+" + re.escape(PERCENTILE_SAMPLES) + r"\d+ samples",
        re.escape(GENERATOR_LAG),
        re.escape(GENERATOR_BEHIND),
        re.escape(CLOCK_SANITY),
    )
)


def unstable_latency(warnings: Sequence[str]) -> tuple[str, ...]:
    """The warnings saying the cell's latency is not a stable property of the system."""
    return tuple(w for w in warnings if w.startswith(UNSTABLE_LATENCY))


def measurement_reasons(reasons: Sequence[str]) -> tuple[str, ...]:
    """The invalid reasons about the measurement (too short, too few samples, a lagging or
    slow load generator, a broken clock); the rest (error rate, a workload's problems) are
    about the system."""
    return tuple(r for r in reasons if any(m.match(r) for m in _MEASUREMENT))


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
    span: tuple[float, float] | None = None
    """The measured window's first and last instant on ``time.perf_counter``, the clock the
    cell's telemetry samples on, so the energy of exactly that window can be taken from
    its power series (harness.metrics.energy); None: not known, and no energy is given.
    ``judge`` does not read it, and an empty or reversed span only leaves energy absent."""

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
        reasons.append(f"{WINDOW_TOO_SHORT}{ev.window_s:.3g} s < minimum {policy.min_window_s:g} s")
    if ev.samples < policy.min_samples:
        reasons.append(f"{ev.samples}{TOO_FEW_SAMPLES}{policy.min_samples}")
    for p in policy.required_percentiles:
        need = min_samples_for(p)
        if ev.samples < need:
            reasons.append(f"p{p:g}{PERCENTILE_SAMPLES}{need} samples, have {ev.samples}")
    if total and ev.failed / total > policy.max_error_rate:
        reasons.append(
            f"{ERROR_RATE}{ev.failed / total:.2%} > ceiling {policy.max_error_rate:.2%}"
            f" ({ev.failed} of {total} requests failed)"
        )
    if ev.lag_p99_s is not None and ev.lag_p99_s > policy.max_lag_p99_s:
        reasons.append(
            f"{GENERATOR_LAG}{ev.lag_p99_s * 1e3:.3g} ms > bound"
            f" {policy.max_lag_p99_s * 1e3:g} ms: the client, not the system, set the timing"
        )
    if ev.sent_rate is not None and ev.offered_rate:
        ratio = ev.sent_rate / ev.offered_rate
        if ratio < policy.min_sent_ratio:
            reasons.append(
                f"{GENERATOR_BEHIND}{ev.sent_rate:.4g} req/s of {ev.offered_rate:.4g}"
                f" offered ({ratio:.1%} < {policy.min_sent_ratio:.0%}): it could not keep up"
            )
    if ev.negative_durations:
        reasons.append(f"{CLOCK_SANITY} {ev.negative_durations} negative durations")
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
        f"{SATURATED} completed {ev.achieved_rate:.4g} req/s of {ev.offered_rate:.4g} offered"
        f" ({ratio:.0%}); latency grows with the window"
    ]


@dataclass(frozen=True)
class TrendRule:
    """When latency "trends over the window" (``latency_trend``): both a significant rank
    correlation with position and a material effect.

    The significance is Kendall's tau of the medians of ``blocks`` consecutive blocks of
    requests against the block's position, not of every request: queued requests are
    not independent (a queue wanders slowly), and a per-request test reads that wander as
    significance. On simulated M/M/1 latency at 80 % load, 3500 requests, the
    per-request test flagged 8 of 40 stationary windows at p < 1e-3; 30 block medians
    (each ~1/30 of the window, longer than such a queue's memory) flagged none, and
    still flagged most 2x steps at a third, half or two thirds of the window (29 to 35
    of 40). At 95 % load a window of a few thousand requests does wander materially (1
    to 4 of 40 flagged), and says so.

    The effect is the median of the last third of the requests over the first third's:
    a p-value alone flags immaterial drifts once there are tens of thousands of samples.
    ``min_ratio`` 1.5 (rising, or falling to 1/1.5) is above the run-to-run spread of a
    median on a busy shared machine (tens of percent) and below the soak's 2x p99 drift:
    a change that would decide a latency comparison. ``latency_trend`` also takes the
    cell's timing floor (its generator lag p99): a smaller change is not called either.
    ``min_samples`` 60: two requests a block, 20 a third (on lognormal latency with
    sigma 0.5 the log of such a median has a standard error near 0.14).
    """

    min_samples: int = 60
    min_ratio: float = 1.5
    alpha: float = 1e-3
    blocks: int = 30

    def __post_init__(self) -> None:
        if not 6 <= self.blocks <= self.min_samples:
            raise ValueError("a trend needs 6 <= blocks <= min_samples")
        if not self.min_ratio > 1.0 or not 0.0 < self.alpha < 1.0:
            raise ValueError("a trend needs min_ratio > 1 and alpha in (0, 1)")


TREND_RULE = TrendRule()


def latency_trend(
    latency_in_arrival_order: npt.ArrayLike,
    rule: TrendRule = TREND_RULE,
    *,
    floor_s: float | None = None,
) -> str | None:
    """A warning starting with ``TRENDING`` when latency rises or falls over the window.

    ``latency_in_arrival_order``: seconds, one per successful request, in the order the
    requests were scheduled (not sorted, not in completion order); non-finite values are
    dropped. ``rule`` says how significant and how large a change is a trend.
    ``floor_s``: the cell's resolution, the load generator's lag p99 (as ``compare`` calls
    no latency change below it): a change of the median no larger is not a trend either
    (on a 50 us engine, 1.8x can be 30 us of a busy machine's scheduling).
    """
    x = np.asarray(latency_in_arrival_order, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size < rule.min_samples:
        return None
    third = x.size // 3
    first, last = float(np.median(x[:third])), float(np.median(x[-third:]))
    if not (first > 0 and last > 0):
        return None  # a broken clock is the clock-sanity check's finding
    ratio = last / first
    if 1.0 / rule.min_ratio < ratio < rule.min_ratio or abs(last - first) <= (floor_s or 0.0):
        return None
    medians = [float(np.median(b)) for b in np.array_split(x, rule.blocks)]
    tau, p = (float(v) for v in sps.kendalltau(np.arange(rule.blocks), medians))
    if not (p < rule.alpha and math.copysign(1.0, tau) == math.copysign(1.0, ratio - 1.0)):
        return None
    shown_p = "p < 1e-16" if p < 1e-16 else f"p = {p:.2g}"
    return (
        f"{TRENDING} median {first * 1e3:.4g} ms in the first third of the requests,"
        f" {last * 1e3:.4g} ms in the last ({ratio:.2f}x, {'rising' if ratio > 1 else 'falling'};"
        f" Kendall tau {tau:+.2f} over {rule.blocks} blocks, {shown_p})"
    )
