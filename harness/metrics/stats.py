"""Latency statistics: nearest-rank percentiles, error-adjusted forms, sample minimums,
and confidence intervals; and the significance of a change between two sample sets (a
seeded bootstrap interval, a rank or t test, Holm's correction over many tests).

Percentiles use the nearest-rank definition: the p-th percentile is the smallest
sample x such that at least p% of samples are <= x (the ceil(p/100 * n)-th smallest). It never
interpolates, so every reported value was observed, and it stays defined when failed
requests enter as infinite latencies (the error-adjusted form).

Confidence intervals for p50 and p99 are distribution-free: the interval between two
order statistics whose ranks come from the binomial law of "samples below the true
percentile", so its coverage is at least the stated confidence whatever the latency
distribution (a bootstrap would understate the uncertainty of a tail percentile). A
bound that would need a sample beyond the smallest or largest is None: the data
cannot bound it. Rates get the exact Poisson (Garwood) interval of their count.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)
CI_PERCENTILES: tuple[float, ...] = (50.0, 99.0)
CONFIDENCE = 0.95

Interval = tuple[float | None, float | None]


def percentile_key(p: float) -> str:
    """``50.0 -> 'p50'``, ``99.9 -> 'p99.9'`` (the names used in records)."""
    return "p" + (f"{p:g}")


def min_samples_for(p: float) -> int:
    """Fewest samples for which the p-th percentile is not simply the maximum.

    With n samples, nearest rank p lands below the max only when n >= 1 / (1 - p/100):
    p99 needs 100 samples, p99.9 needs 1000. Below that the value would be the max
    dressed up as a percentile, so it is not reported.
    """
    if not 0.0 < p < 100.0:
        raise ValueError(f"percentile must be in (0, 100), got {p}")
    return math.ceil(round(1.0 / (1.0 - p / 100.0), 9))


def _rank(n: int, p: float) -> int:
    # Rounded before ceil: p*n/100 in floating point can land a hair above an integer
    # (99.9% of 1000 is 999.0000000000001), which would skip a rank.
    return max(1, math.ceil(round(p * n / 100.0, 9)))


def _at_rank(ordered: npt.NDArray[np.float64], p: float) -> float:
    return float(ordered[_rank(ordered.size, p) - 1])


def nearest_rank(values: npt.ArrayLike, p: float) -> float:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("no samples")
    return _at_rank(np.sort(arr), p)


@dataclass(frozen=True)
class Summary:
    """Summary of one latency-like sample set, in seconds.

    ``percentiles`` holds only those with enough samples; ``adjusted`` is the same set
    computed with every failed request counted as an infinite latency.
    """

    count: int
    failed: int
    mean: float | None
    min: float | None
    max: float | None
    percentiles: dict[str, float]
    adjusted: dict[str, float]
    ci: dict[str, Interval] | None = None

    def __post_init__(self) -> None:
        if self.count < 0 or self.failed < 0:
            raise ValueError("counts must be >= 0")
        if self.count and self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError("min > max")


def summarize(samples: Sequence[float] | npt.NDArray[np.float64], failed: int = 0) -> Summary:
    """Summarize successful-request samples plus a count of failed requests."""
    arr = np.asarray(samples, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError("samples must be one-dimensional")
    if np.any(~np.isfinite(arr)):
        raise ValueError("samples must be finite; count failures with `failed`")
    n = int(arr.size)
    pct: dict[str, float] = {}
    adj: dict[str, float] = {}
    ordered = np.sort(arr)
    with_failures = np.concatenate([ordered, np.full(failed, np.inf)])  # still sorted
    for p in PERCENTILES:
        key = percentile_key(p)
        if n >= min_samples_for(p):
            pct[key] = _at_rank(ordered, p)
        if with_failures.size >= min_samples_for(p):
            adj[key] = _at_rank(with_failures, p)
    if n == 0:
        return Summary(0, failed, None, None, None, pct, adj)
    ci = {
        key: quantile_ci(ordered, p)
        for p in CI_PERCENTILES
        if (key := percentile_key(p)) in pct  # only for percentiles with enough samples
    }
    return Summary(n, failed, float(arr.mean()), float(arr.min()), float(arr.max()), pct, adj, ci)


def quantile_ci(
    ordered: npt.NDArray[np.float64], p: float, confidence: float = CONFIDENCE
) -> Interval:
    """Distribution-free interval for the p-th percentile from sorted samples."""
    n, q, tail = int(ordered.size), p / 100.0, (1.0 - confidence) / 2.0
    lo_rank = int(sps.binom.ppf(tail, n, q))  # P(fewer than lo_rank below) < tail
    hi_rank = int(sps.binom.ppf(1.0 - tail, n, q)) + 1
    lo = float(ordered[lo_rank - 1]) if lo_rank >= 1 else None
    hi = float(ordered[hi_rank - 1]) if hi_rank <= n else None
    return lo, hi


def rate_ci(count: int, window_s: float, confidence: float = CONFIDENCE) -> Interval:
    """Exact Poisson interval for ``count`` events in ``window_s`` seconds, per second."""
    if count < 0 or not window_s > 0:
        raise ValueError("count must be >= 0 and the window > 0")
    tail = (1.0 - confidence) / 2.0
    lo = float(sps.chi2.ppf(tail, 2 * count)) / 2.0 if count else 0.0
    hi = float(sps.chi2.ppf(1.0 - tail, 2 * count + 2)) / 2.0
    return lo / window_s, hi / window_s


def histogram(values: Sequence[int]) -> dict[str, int]:
    """Exact counts of integer values (e.g. batch sizes), keys sorted numerically."""
    uniq, counts = np.unique(np.asarray(values, dtype=np.int64), return_counts=True)
    return {str(int(u)): int(c) for u, c in zip(uniq, counts, strict=True)}


def conservative(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile when there are enough samples, else the max (an upper bound)."""
    if not len(values):
        return None
    if len(values) >= min_samples_for(p):
        return nearest_rank(values, p)
    return float(np.max(np.asarray(values, dtype=np.float64)))


def to_json(summary: Summary) -> dict[str, object]:
    return {
        "count": summary.count,
        "failed": summary.failed,
        "mean": summary.mean,
        "min": summary.min,
        "max": summary.max,
        **summary.percentiles,
        "adjusted": dict(summary.adjusted),
        "ci95": {k: list(v) for k, v in (summary.ci or {}).items()},
        # percentiles left out, with the sample count each would need
        "needs_samples": {
            percentile_key(p): min_samples_for(p)
            for p in PERCENTILES
            if percentile_key(p) not in summary.percentiles
        },
    }


def as_samples(values: npt.ArrayLike, digits: int = 7) -> list[float]:
    """Raw samples for a record, rounded to 0.1 us: enough to recompute any percentile."""
    return [round(float(v), digits) for v in np.asarray(values, dtype=np.float64)]


def is_nested(span: str) -> bool:
    """``infer.compute`` is a part of ``infer``, not a stage of its own."""
    return "." in span


def stage_breakdown(
    spans: Mapping[str, npt.NDArray[np.float64]], e2e: npt.NDArray[np.float64]
) -> dict[str, Any]:
    """``stages``: a summary per stage span (non-finite spans left out); ``time_account``:
    each stage's mean and its share of the mean e2e, where the request's time went.

    A nested span (``infer.compute``) also says which stage it lies ``within`` and its
    share of that stage; its e2e share overlaps its parent's, so shares of the top-level
    stages alone add up to at most 1.
    """
    total = float(e2e.mean()) if e2e.size else 0.0
    stages: dict[str, Any] = {}
    account: dict[str, Any] = {}
    for name, values in spans.items():
        finite = values[np.isfinite(values)]
        stages[name] = to_json(summarize(finite))
        mean = float(finite.mean()) if finite.size else 0.0
        account[name] = {"mean_s": mean, "share": mean / total if total > 0 else None}
    for name in filter(is_nested, account):
        parent = name.rsplit(".", 1)[0]
        outer = account.get(parent, {}).get("mean_s", 0.0)
        account[name]["within"] = parent
        account[name]["share_of_within"] = account[name]["mean_s"] / outer if outer else None
    return {"stages": stages, "time_account": account}


# --- significance of a change between two sample sets ---------------------------------

Array = npt.NDArray[np.float64]
TestName = Literal["mann-whitney-u", "welch-t", "welch-t-repeats"]

RESAMPLES = 2000
MEAN_CHUNK = 4_000_000
"""Indices drawn at once when resampling a mean: bounds memory whatever the sample count."""


@dataclass(frozen=True)
class Statistic:
    """The statistic a headline path names, computed from the samples under ``key``."""

    key: str
    percentile: float | None  # None: the mean

    def of(self, values: Array) -> float:
        if self.percentile is None:
            return float(values.mean())
        return nearest_rank(values, self.percentile)

    def enough(self, values: Array) -> bool:
        """Whether ``values`` bound the statistic: a tail percentile whose distribution-free
        interval reaches past the largest sample is not resampled (a bootstrap cannot draw
        beyond the largest sample, so it would understate the uncertainty)."""
        if self.percentile is None:
            return values.size >= 2
        if values.size < min_samples_for(self.percentile):
            return False
        return None not in quantile_ci(np.sort(values), self.percentile)


REPRODUCE_REL = 1e-9
REPRODUCE_ABS = 1e-7
"""Records keep samples rounded to 7 decimals (``as_samples``): a statistic recomputed
from them may differ from the one computed before rounding by half of that."""


def reproduces(stat: Statistic, values: npt.ArrayLike, recorded: float) -> bool:
    """Whether ``stat`` computed from ``values`` gives the ``recorded`` figure.

    The tolerance is relative 1e-9 (float noise) or absolute ``REPRODUCE_ABS`` = 1e-7:
    samples are stored rounded to 7 decimals (``as_samples``), which moves a nearest-rank
    percentile (it keeps the order, so it picks the same sample) or a mean by at most
    half of that. A figure computed from other values is almost never that close.

    "No value" reproduces "no value": no samples reproduce only a NaN figure (nothing
    to compute it from), and a NaN statistic (a NaN among the samples) only a NaN one.
    Infinite figures reproduce when equal.
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return math.isnan(recorded)
    again = stat.of(arr)
    if math.isnan(again) or math.isnan(recorded):
        return math.isnan(again) and math.isnan(recorded)
    return math.isclose(again, recorded, rel_tol=REPRODUCE_REL, abs_tol=REPRODUCE_ABS)


_STAT_PATH = re.compile(r"(?P<key>.+)\.(?:mean|p(?P<p>\d+(?:\.\d+)?))")


def statistic(metric: str) -> Statistic | None:
    """``e2e.p99`` -> the 99th percentile of samples["e2e"]; None for other paths."""
    m = _STAT_PATH.fullmatch(metric)
    if m is None:
        return None
    p = float(m["p"]) if m["p"] else None
    if p is not None and not 0.0 < p < 100.0:
        return None
    return Statistic(m["key"], p)


@dataclass(frozen=True)
class Estimate:
    change: float
    ci95: tuple[float, float]
    p: float
    test: TestName
    n_base: int
    n_new: int
    agrees: bool
    """Whether the test statistic moved the same way as the figure: a p99 that fell while
    the whole distribution shifted up is not called on the strength of that shift."""


def estimate(stat: Statistic, xs: Array, ys: Array, rng: np.random.Generator) -> Estimate | str:
    """The change of ``stat`` from ``xs`` to ``ys`` (ys / xs - 1), its bootstrap interval
    and a two-sided p-value; or why there is none."""
    before = stat.of(xs)
    if before <= 0.0:  # a recorded figure within rounding of zero
        return "BASE value is not positive: no relative change"
    change = stat.of(ys) / before - 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = resample(stat, ys, rng) / resample(stat, xs, rng) - 1.0
    tail = (1.0 - CONFIDENCE) / 2.0
    lo, hi = (float(v) for v in np.quantile(boot, [tail, 1.0 - tail]))
    p, test, shift = shift_test(stat, xs, ys)
    if not all(math.isfinite(v) for v in (change, lo, hi, p)):
        return "undefined for these samples (zero values or no spread)"
    agrees = np.sign(shift) == np.sign(change)
    return Estimate(change, (lo, hi), p, test, int(xs.size), int(ys.size), bool(agrees))


def between_repeats(xs: Array, ys: Array, confidence: float = CONFIDENCE) -> Estimate | str:
    """The change of a figure measured once per repeat (one value per worker process,
    ``--repeats``) from the BASE values ``xs`` to the NEW values ``ys``: the ratio of the
    means, Welch's t-test on the per-repeat values, and the Welch interval of the
    difference of the means divided by the BASE mean; or why there is none.

    Each repeat ran in its own process after the others, so the spread between repeats
    holds what a run-to-run difference is made of (machine state, placement, neighbours),
    which the spread of one run's requests does not (pyperf judges across its worker
    processes for the same reason).
    """
    if xs.size < 2 or ys.size < 2:
        return f"needs 2 or more repeats on both sides (BASE {xs.size}, NEW {ys.size})"
    mx, my = float(xs.mean()), float(ys.mean())
    if mx <= 0.0:
        return "BASE value is not positive: no relative change"
    vx, vy = float(xs.var(ddof=1)) / xs.size, float(ys.var(ddof=1)) / ys.size
    se = math.sqrt(vx + vy)
    if se == 0.0:
        return "no spread between repeats to judge a change against"
    # Welch-Satterthwaite degrees of freedom
    df = (vx + vy) ** 2 / (vx**2 / (xs.size - 1) + vy**2 / (ys.size - 1))
    t = (my - mx) / se
    p = float(2.0 * sps.t.sf(abs(t), df))
    half = float(sps.t.ppf(0.5 + confidence / 2.0, df)) * se
    ci = ((my - mx - half) / mx, (my - mx + half) / mx)
    return Estimate(my / mx - 1.0, ci, p, "welch-t-repeats", int(xs.size), int(ys.size), True)


def resample(stat: Statistic, values: Array, rng: np.random.Generator) -> Array:
    if stat.percentile is None:
        return resample_mean(values, rng)
    return resample_percentile(values, stat.percentile, rng)


def resample_percentile(values: Array, p: float, rng: np.random.Generator) -> Array:
    """The nearest-rank percentile of RESAMPLES bootstrap resamples of ``values``."""
    ordered = np.sort(values)
    n = ordered.size
    # The rank nearest_rank picks, by its own definition: the percentile of ranks 1..n.
    rank = round(nearest_rank(np.arange(1, n + 1), p))
    # In a resample (n draws of indices into ``ordered``) the rank-th smallest value is
    # ordered[j] for the rank-th smallest index drawn, and P(j <= i) is the chance that at
    # least ``rank`` of the n draws land in 0..i: a binomial tail. Inverting that law
    # draws j exactly, in O(n + resamples) instead of sorting every resample.
    cdf = sps.binom.sf(rank - 1, n, np.arange(1, n + 1) / n)
    j = np.searchsorted(cdf, rng.random(RESAMPLES), side="left")
    return ordered[np.minimum(j, n - 1)]


def resample_mean(values: Array, rng: np.random.Generator) -> Array:
    n = values.size
    per = max(1, MEAN_CHUNK // n)
    parts = [
        values[rng.integers(0, n, size=(min(per, RESAMPLES - done), n))].mean(axis=1)
        for done in range(0, RESAMPLES, per)
    ]
    return np.concatenate(parts)


def shift_test(stat: Statistic, xs: Array, ys: Array) -> tuple[float, TestName, float]:
    """(two-sided p-value, test, which way ``ys`` moved: > 0 up, < 0 down)."""
    if stat.percentile is None:
        welch = sps.ttest_ind(ys, xs, equal_var=False)
        return float(welch.pvalue), "welch-t", float(welch.statistic)
    mwu = sps.mannwhitneyu(ys, xs, alternative="two-sided")
    # U / (n_new * n_base) is P(a NEW sample > a BASE sample), ties counted half.
    return float(mwu.pvalue), "mann-whitney-u", float(mwu.statistic) / (ys.size * xs.size) - 0.5


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the order given."""
    p = np.asarray(p_values, dtype=np.float64)
    m = p.size
    order = np.argsort(p, kind="stable")
    # The i-th smallest of m is held to alpha / (m - i); monotone so ranks cannot swap.
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return [float(v) for v in adjusted]
