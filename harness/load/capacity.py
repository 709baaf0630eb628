"""Finding the knee and the capacity from measured load points.

A ``Point`` is one measured load level (a request rate or a number of concurrent
users) with its validity verdict and SLO checks. Two searches use them:

* ``sweep`` raises the load step by step and stops at the first point where latency
  or errors blow up (or throughput stops growing); the knee is the last point before it.
* ``capacity_search`` finds the largest rate at which every SLO holds: it brackets
  (doubling, or halving when the first point already fails) and then bisects between
  the highest passing and the lowest failing rate until they are within a tolerance.

An invalid point (too few samples, a lagging generator, too many errors) never passes
and never becomes the knee or the capacity: it stops a sweep and bounds a search from
above, and the report says so. A point stopped early as saturated
(harness.load.saturation) is past the knee: it blows a sweep up and fails a search.
Both searches are pure over a ``measure`` callable, so their logic is tested with
synthetic systems.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from harness.load.saturation import EarlyStop


class LoadPoint(TypedDict, total=False):
    """A point as records keep it (``Point.to_json``), read back by the reports. The
    workload adds what it keeps of the point's metrics: here the keys the reports read
    (compact latency summaries such as ``e2e`` under the metric's own name)."""

    load: float
    offered: float | None
    valid: bool
    reasons: list[str]
    throughput: float
    error_rate: float
    latency_p99_s: float | None
    slo_failures: list[str]
    passes: bool
    throughput_ci95: list[float | None] | None
    failed: int
    warnings: list[str]
    stopped_early: bool
    early_stop: dict[str, Any]


@dataclass(frozen=True)
class Point:
    """One measured load level.

    ``latency_p99_s`` is the error-adjusted p99 of the judged latency (None when the
    point had too few samples for it); ``slo_failures`` the SLOs it missed.
    """

    load: float
    valid: bool
    reasons: tuple[str, ...]
    throughput: float
    error_rate: float
    latency_p99_s: float | None
    slo_failures: tuple[str, ...] = ()
    offered: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict, compare=False)
    early_stop: EarlyStop | None = None
    """Set when the point stopped before its window ended, saturated: past the knee."""

    def __post_init__(self) -> None:
        if not (self.load > 0 and math.isfinite(self.load)):
            raise ValueError(f"load must be a positive number, got {self.load}")
        if self.valid == bool(self.reasons):
            raise ValueError("an invalid point needs reasons and a valid one has none")
        if not 0.0 <= self.error_rate <= 1.0 or self.throughput < 0:
            raise ValueError("error rate is a fraction and throughput >= 0")

    @property
    def passes(self) -> bool:
        """Valid, within every SLO and not saturated: the only points a capacity may be."""
        return self.valid and not self.slo_failures and self.early_stop is None

    def to_json(self) -> dict[str, Any]:
        stopped = self.early_stop
        early = {} if stopped is None else {"stopped_early": True, "early_stop": stopped.to_json()}
        return {
            "load": self.load,
            "offered": self.offered,
            "valid": self.valid,
            "reasons": list(self.reasons),
            "throughput": self.throughput,
            "error_rate": self.error_rate,
            "latency_p99_s": self.latency_p99_s,
            "slo_failures": list(self.slo_failures),
            "passes": self.passes,
            **self.metrics,
            **early,
        }


Measure = Callable[[float], Point]


class Stop(enum.StrEnum):
    BLOWUP = "blow-up"
    INVALID = "invalid point"
    END = "end of the load range"


@dataclass(frozen=True)
class KneeRule:
    """When a sweep's next point counts as blown up.

    Latency: the adjusted p99 above ``latency_factor`` times the lowest load's; errors:
    above ``max_error_rate``; throughput (``plateau``): the next load added less than
    ``min_gain`` of relative throughput while the load itself grew (closed loop: more
    users only queue), or completed less than ``min_achieved`` of an offered rate.
    """

    latency_factor: float = 3.0
    max_error_rate: float = 0.01
    min_gain: float = 0.05
    min_achieved: float = 0.95
    plateau: bool = False

    def __post_init__(self) -> None:
        if self.latency_factor <= 1.0 or not 0.0 <= self.max_error_rate < 1.0:
            raise ValueError("latency_factor must be > 1 and max_error_rate in [0, 1)")

    def blown(self, point: Point, base: Point, prev: Point) -> str | None:
        """Why ``point`` is past the knee, or None."""
        if point.error_rate > self.max_error_rate:
            return f"error rate {point.error_rate:.2%} > {self.max_error_rate:.2%}"
        p99, p99_base = point.latency_p99_s, base.latency_p99_s
        if p99 is None or math.isinf(p99):
            return "p99 unbounded (failed requests count as infinite latency)"
        if p99_base is not None and p99 > self.latency_factor * p99_base:
            return (
                f"p99 {p99 * 1e3:.4g} ms > {self.latency_factor:g} x the lowest load's"
                f" {p99_base * 1e3:.4g} ms"
            )
        if point.offered and point.throughput < self.min_achieved * point.offered:
            return (
                f"completed {point.throughput:.4g}/s of {point.offered:.4g}/s offered"
                f" (< {self.min_achieved:.0%})"
            )
        if self.plateau and point.load > prev.load and prev.throughput > 0:
            gain = point.throughput / prev.throughput - 1.0
            if gain < self.min_gain:
                return f"throughput gained {gain:.1%} (< {self.min_gain:.0%}) over the last load"
        return None


@dataclass(frozen=True)
class SweepResult:
    points: tuple[Point, ...]
    knee: Point | None
    stop: Stop
    why: str

    def to_json(self) -> dict[str, Any]:
        return {
            "points": [p.to_json() for p in self.points],
            "knee": self.knee.load if self.knee else None,
            "stop": self.stop.value,
            "why": self.why,
            # the knee is exact only when a blow-up was seen past it
            "knee_is_lower_bound": self.stop is not Stop.BLOWUP,
            "early_stop": early_stop_summary(self.points),
        }


def sweep(measure: Measure, loads: Sequence[float], rule: KneeRule) -> SweepResult:
    """Measure ``loads`` in increasing order until the knee is passed."""
    if not loads or list(loads) != sorted(set(loads)):
        raise ValueError("loads must be distinct and increasing")
    points: list[Point] = []
    for load in loads:
        point = measure(load)
        points.append(point)
        if not point.valid and point.early_stop is None:  # a saturated stop is a blow-up
            knee = points[-2] if len(points) > 1 else None
            why = f"the point at {load:g} is invalid: {'; '.join(point.reasons)}"
            return SweepResult(tuple(points), knee, Stop.INVALID, why)
        prev = points[-2] if len(points) > 1 else point
        stopped = point.early_stop
        blown = stopped.describe() if stopped else rule.blown(point, points[0], prev)
        if blown is not None:
            knee = points[-2] if len(points) > 1 else None
            return SweepResult(tuple(points), knee, Stop.BLOWUP, f"at {load:g}: {blown}")
    return SweepResult(tuple(points), points[-1], Stop.END, f"no blow-up up to {loads[-1]:g}")


@dataclass(frozen=True)
class SearchPolicy:
    """Bracketing from ``start`` by factor ``growth`` within ``[floor, ceiling]``, then
    bisection until ``hi / lo <= 1 + tolerance``, in at most ``max_points`` measurements."""

    start: float
    floor: float
    ceiling: float
    growth: float = 2.0
    tolerance: float = 0.1
    max_points: int = 12

    def __post_init__(self) -> None:
        if not 0 < self.floor <= self.start <= self.ceiling:
            raise ValueError("need 0 < floor <= start <= ceiling")
        if self.growth <= 1.0 or self.tolerance <= 0 or self.max_points < 2:
            raise ValueError("growth must be > 1, tolerance > 0, max_points >= 2")


@dataclass(frozen=True)
class CapacityResult:
    """``capacity``: the highest passing point; ``above``: the lowest failing point
    above it (None: the ceiling passed, so capacity is a lower bound)."""

    points: tuple[Point, ...]
    capacity: Point | None
    above: Point | None
    converged: bool
    why: str

    def to_json(self) -> dict[str, Any]:
        return {
            "points": [p.to_json() for p in self.points],
            "capacity": self.capacity.load if self.capacity else None,
            "bracket": [
                self.capacity.load if self.capacity else None,
                self.above.load if self.above else None,
            ],
            "converged": self.converged,
            "why": self.why,
            "early_stop": early_stop_summary(self.points),
        }


def capacity_search(measure: Measure, policy: SearchPolicy) -> CapacityResult:
    points: list[Point] = []

    def probe(load: float) -> Point:
        point = measure(load)
        points.append(point)
        return point

    lo, hi = _bracket(probe, policy, points)
    if lo is None:
        assert hi is not None
        why = f"nothing passes down to {hi.load:g} ({_failure(hi)})"
        return CapacityResult(tuple(points), None, hi, False, why)
    if hi is None:
        why = f"the objective holds up to {lo.load:g}, the highest rate tried: capacity is above"
        return CapacityResult(tuple(points), lo, None, False, why)
    while hi.load / lo.load > 1.0 + policy.tolerance and len(points) < policy.max_points:
        mid = probe(math.sqrt(lo.load * hi.load))  # geometric: loads span decades
        lo, hi = (mid, hi) if mid.passes else (lo, mid)
    converged = hi.load / lo.load <= 1.0 + policy.tolerance
    why = f"between {lo.load:.4g} (passes) and {hi.load:.4g} (fails: {_failure(hi)})"
    if not converged:
        why += f"; stopped after {policy.max_points} points"
    return CapacityResult(tuple(points), lo, hi, converged, why)


def _bracket(
    probe: Callable[[float], Point], policy: SearchPolicy, points: list[Point]
) -> tuple[Point | None, Point | None]:
    first = probe(policy.start)
    if first.passes:
        lo = first
        while lo.load < policy.ceiling and len(points) < policy.max_points:
            nxt = probe(min(lo.load * policy.growth, policy.ceiling))
            if not nxt.passes:
                return lo, nxt
            lo = nxt
        return lo, None
    hi = first
    while hi.load > policy.floor and len(points) < policy.max_points:
        nxt = probe(max(hi.load / policy.growth, policy.floor))
        if nxt.passes:
            return nxt, hi
        hi = nxt
    return None, hi


def early_stop_summary(points: Sequence[Point]) -> dict[str, Any]:
    """The points a search stopped early and the scheduled seconds that saved."""
    stopped = [p for p in points if p.early_stop is not None]
    return {
        "points": [p.load for p in stopped],
        "saved_s": sum(p.early_stop.saved_s for p in stopped if p.early_stop is not None),
    }


def _failure(point: Point) -> str:
    if point.early_stop is not None:
        return point.early_stop.describe()
    if not point.valid:
        return "invalid: " + "; ".join(point.reasons)
    return "missed " + ", ".join(point.slo_failures)
