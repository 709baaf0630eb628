"""Pareto fronts of rate against latency: which configurations no other one beats.

A configuration is a point (rate, latency): more rate is better, less latency is better.
A point is *dominated* when another point has at least its rate and at most its
latency, and is strictly better in one of the two; the points no other dominates are
the Pareto-optimal ones, the *front*. Two points with equal figures dominate neither
each other, so both are on the front: the numbers cannot tell them apart.

Pure functions of the numbers given, in the order given: the recommendation
(harness.report.recommend.ranking) marks its candidates with them and the report's
Decision section (harness.report.decision, harness.report.paretoplot) draws them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

METRICS: tuple[str, ...] = ("ttft", "e2e")
"""The latencies a front is drawn against, in the order they are shown: generative
cells have both, tensor cells ``e2e`` only."""

NAMES: dict[str, str] = {"ttft": "TTFT", "e2e": "E2E"}


@dataclass(frozen=True)
class Point:
    """One configuration on a rate / latency plane (``latency_s`` a p99, in seconds)."""

    rate: float
    latency_s: float

    def __post_init__(self) -> None:
        for what, value in (("rate", self.rate), ("latency", self.latency_s)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"a Pareto point's {what} is a finite number >= 0, got {value}")


def dominates(a: Point, b: Point) -> bool:
    """``a`` is at least as good as ``b`` on both figures and better on one."""
    at_least = a.rate >= b.rate and a.latency_s <= b.latency_s
    return at_least and (a.rate > b.rate or a.latency_s < b.latency_s)


def optimal(points: Sequence[Point]) -> tuple[bool, ...]:
    """For each point, in order: whether no other point dominates it.

    Quadratic, which is fine: a question holds tens of configurations, not thousands.
    """
    return tuple(not any(dominates(q, p) for q in points) for p in points)


def front(points: Sequence[Point]) -> tuple[Point, ...]:
    """The Pareto-optimal points, by latency then rate (the order a step line joins
    them in), each distinct point once."""
    kept = {p for p, best in zip(points, optimal(points), strict=True) if best}
    return tuple(sorted(kept, key=lambda p: (p.latency_s, p.rate)))


def staircase(points: Sequence[Point]) -> tuple[tuple[float, float], ...]:
    """The front as a step line of (latency, rate) vertices: for each latency budget on
    the x axis, the best rate any configuration reaches within it. Along the front the
    rate rises with the latency, so the line goes right at one rate, then up."""
    steps: list[tuple[float, float]] = []
    for p in front(points):
        if steps:
            steps.append((p.latency_s, steps[-1][1]))
        steps.append((p.latency_s, p.rate))
    return tuple(steps)
