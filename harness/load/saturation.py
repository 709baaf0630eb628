"""Over-saturation early stop: a search's rate point whose queue and latency grow without
bound stops before its window ends.

A load search (sweep, capacity) spends most of its time on the points past the knee: an
open-loop point offered more than the system completes queues for its whole window and
then drains that queue. Its verdict is already certain long before: it is past the knee.
``Watch`` is asked by the serving loop while the point runs; it stops the point when,
over at least the profile's minimum valid window and a quarter of the planned one, the
backlog (requests due and not yet answered) grows faster than ``1 - min_achieved`` of
the offered rate (the "saturated" warning's bound, harness.metrics.validity) *and* the
latency of the answered requests trends up by the cell's own trend test
(``latency_trend``), on ``confirmations`` checks in a row. Both are the tests a full
window is judged by; a healthy point passes neither, and a point that passes them is
over the knee whichever way its full window would have ended.

The stop is evidence (``EarlyStop``), kept with the point: the trend's statistic, the
backlog and its slope, the latency slope, when it stopped and how much of the window
that used. The requests it cut off are counted (``backlog`` were due and unanswered,
``unsent`` never sent), never dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.metrics.validity import TREND_RULE, Policy, TrendRule, latency_trend

Array = npt.NDArray[np.float64]
Answered = Callable[[], tuple[Array, Array]]
"""The answered successful requests, in schedule order: their scheduled offsets (seconds
from the schedule's start) and latencies. Called only when the cheap backlog test holds."""


@dataclass(frozen=True)
class EarlyStopRule:
    """When a running point may stop: never before ``min_elapsed_s`` (the profile's
    minimum valid window, so a stopped point is still long enough to judge) and
    ``min_fraction`` of the planned window, nor with fewer than ``min_samples`` answered
    requests; checked every ``every_fraction`` of the window; stopped after
    ``confirmations`` positive checks in a row."""

    min_elapsed_s: float
    min_fraction: float = 0.25
    min_samples: int = 100
    every_fraction: float = 0.05
    confirmations: int = 2
    min_achieved: float = 0.95
    trend: TrendRule = field(default=TREND_RULE)

    def __post_init__(self) -> None:
        if self.min_elapsed_s < 0 or not 0.0 < self.min_fraction < 1.0:
            raise ValueError("min_elapsed_s must be >= 0 and min_fraction in (0, 1)")
        if not 0.0 < self.every_fraction < 1.0 or self.confirmations < 1:
            raise ValueError("every_fraction must be in (0, 1) and confirmations >= 1")
        if not 0.0 < self.min_achieved < 1.0:
            raise ValueError("min_achieved is a fraction in (0, 1)")
        if self.min_samples < self.trend.min_samples:
            raise ValueError("min_samples must be at least the trend test's own minimum")

    @classmethod
    def for_policy(cls, policy: Policy) -> EarlyStopRule:
        """Conservative by the profile's own validity bounds."""
        return cls(
            min_elapsed_s=policy.min_window_s,
            min_samples=max(policy.min_samples, TREND_RULE.min_samples),
            min_achieved=policy.min_achieved_ratio,
        )


@dataclass(frozen=True)
class EarlyStop:
    """Why and when a point stopped. ``at_s``: seconds into its schedule; ``window_s``: the
    schedule's planned length; ``backlog``: requests due and unanswered at the stop (cut
    off); ``unsent``: requests scheduled after it (never sent)."""

    at_s: float
    window_s: float
    trend: str
    backlog: int
    backlog_slope_per_s: float
    latency_slope: float
    """Seconds of latency added per second of schedule (least squares)."""
    completion_rate: float
    offered_rate: float
    unsent: int = 0

    def __post_init__(self) -> None:
        if not self.at_s > 0.0 or not self.window_s > 0.0:
            raise ValueError("an early stop happens inside a window of positive length")
        if self.backlog < 0 or self.unsent < 0:
            raise ValueError("cut-off request counts are >= 0")

    @property
    def used_fraction(self) -> float:
        return min(self.at_s / self.window_s, 1.0)

    @property
    def saved_s(self) -> float:
        """The scheduled window not run: a lower bound, since a saturated point would
        also have drained its backlog after the schedule ended."""
        return max(self.window_s - self.at_s, 0.0)

    def describe(self) -> str:
        return (
            f"stopped early at {self.at_s:.3g} s of {self.window_s:g} s: saturated, backlog"
            f" {self.backlog} growing {self.backlog_slope_per_s:.4g}/s, completed"
            f" {self.completion_rate:.4g}/s of {self.offered_rate:.4g}/s offered"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "at_s": self.at_s,
            "window_s": self.window_s,
            "used_fraction": self.used_fraction,
            "saved_s": self.saved_s,
            "trend": self.trend,
            "backlog": self.backlog,
            "backlog_slope_per_s": self.backlog_slope_per_s,
            "latency_slope_s_per_s": self.latency_slope,
            "completion_rate": self.completion_rate,
            "offered_rate": self.offered_rate,
            "cut_off": {"unanswered": self.backlog, "unsent": self.unsent},
        }


class Watch:
    """One running point's early-stop state: the backlog it has seen and its streak of
    positive checks. The driver asks ``due`` (cheap) as often as it likes, and ``check``
    when it is due; ``check`` returns the evidence once the point should stop."""

    def __init__(self, rule: EarlyStopRule, window_s: float, offered_rate: float) -> None:
        if not window_s > 0 or not offered_rate > 0:
            raise ValueError("a watched point needs a window and an offered rate")
        self.rule, self.window_s, self.offered_rate = rule, window_s, offered_rate
        self._every = rule.every_fraction * window_s
        self._earliest = max(rule.min_elapsed_s, rule.min_fraction * window_s)
        self._next = self._every
        self._backlog: list[tuple[float, int]] = []
        self._streak = 0

    def due(self, elapsed: float) -> bool:
        return elapsed >= self._next

    def check(
        self, elapsed: float, arrived: int, answered: int, latency: Answered
    ) -> EarlyStop | None:
        """``elapsed``: seconds since the schedule's start; ``arrived``: requests due so far;
        ``answered``: of those, answered (ok or failed)."""
        self._next = elapsed + self._every
        self._backlog.append((elapsed, arrived - answered))
        found = self._judge(elapsed, arrived, answered, latency)
        self._streak = self._streak + 1 if found else 0
        return found if self._streak >= self.rule.confirmations else None

    def _judge(
        self, elapsed: float, arrived: int, answered: int, latency: Answered
    ) -> EarlyStop | None:
        rule = self.rule
        if elapsed < self._earliest or answered < rule.min_samples or len(self._backlog) < 3:
            return None
        completion = answered / elapsed
        slope = _slope(*(np.array(v, dtype=np.float64) for v in zip(*self._backlog, strict=True)))
        behind = (1.0 - rule.min_achieved) * self.offered_rate
        if completion >= rule.min_achieved * self.offered_rate or slope <= behind:
            return None  # the queue is not growing: the common, cheap answer
        t_sched, lat = latency()
        trend = latency_trend(lat, rule.trend)
        lat_slope = _slope(t_sched, lat)
        if trend is None or not lat_slope > 0:
            return None
        return EarlyStop(
            at_s=elapsed,
            window_s=self.window_s,
            trend=trend,
            backlog=arrived - answered,
            backlog_slope_per_s=slope,
            latency_slope=lat_slope,
            completion_rate=completion,
            offered_rate=self.offered_rate,
        )


def _slope(x: Array, y: Array) -> float:
    """Least-squares slope of ``y`` over ``x``; 0 where it is not defined."""
    if x.size < 2 or float(np.ptp(x)) == 0.0:
        return 0.0
    return float(np.polyfit(x, y, 1)[0])
