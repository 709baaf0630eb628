"""Arrival schedules for open-loop load: when each request is due, decided up front.

A schedule is fixed before the run from a seeded generator, so a slow system cannot
slow the arrivals down (no coordinated omission): latency is measured from these
scheduled times, and the serving loop records how late it was to notice them.

Gaps are constant, exponential (Poisson arrivals) or gamma-distributed with a chosen
``burstiness``, the coefficient of variation of the gaps: 1 is Poisson, above 1 requests
come in clumps, below 1 they are more even. A rate that changes over time (a burst, a
ramp) is a ``RateShape``: arrivals are drawn at unit rate and mapped through the
inverse of the cumulative rate, so the same gap law holds at every instant.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Offsets = npt.NDArray[np.float64]


class Arrivals(enum.StrEnum):
    CONSTANT = "constant"
    POISSON = "poisson"
    GAMMA = "gamma"


def _unit_gaps(arrivals: Arrivals, burstiness: float, n: int, rng: np.random.Generator) -> Offsets:
    """``n`` gaps of mean 1."""
    if arrivals is Arrivals.CONSTANT:
        return np.ones(n)
    if arrivals is Arrivals.POISSON:
        return rng.exponential(1.0, size=n)
    shape = 1.0 / burstiness**2  # gamma: CV = 1/sqrt(shape); mean = shape * scale = 1
    return rng.gamma(shape, 1.0 / shape, size=n)


def _unit_times(
    arrivals: Arrivals, burstiness: float, horizon: float, rng: np.random.Generator
) -> Offsets:
    """Arrival times of a unit-rate process up to ``horizon``, the first at 0."""
    if arrivals is Arrivals.CONSTANT:
        return np.arange(math.ceil(horizon), dtype=np.float64)
    # Draw more gaps than the mean needs so one draw almost always covers the horizon.
    spread = max(burstiness, 1.0)
    n = int(horizon + 8.0 * spread * math.sqrt(horizon) + 16)
    times = np.cumsum(_unit_gaps(arrivals, burstiness, n, rng))
    while times[-1] < horizon:
        more = times[-1] + np.cumsum(_unit_gaps(arrivals, burstiness, n, rng))
        times = np.concatenate([times, more])
    # Shift so the first request is due at t=0: the window starts with work.
    times = times - times[0]
    inside: Offsets = times[times < horizon]
    return inside


def _check_arrivals(arrivals: Arrivals, burstiness: float) -> None:
    if not (math.isfinite(burstiness) and burstiness > 0):
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if burstiness != 1.0 and arrivals is not Arrivals.GAMMA:
        raise ValueError("burstiness applies to gamma arrivals only")


@dataclass(frozen=True)
class OpenLoop:
    """Open-loop load: ``rate`` requests/s for ``duration`` seconds."""

    rate: float
    duration: float
    arrivals: Arrivals = Arrivals.POISSON
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if not self.duration > 0:
            raise ValueError(f"duration must be > 0 s, got {self.duration}")
        _check_arrivals(self.arrivals, self.burstiness)

    def schedule(self, seed: int) -> Offsets:
        """Offsets in seconds from the start, sorted, all within ``[0, duration)``."""
        rng = np.random.default_rng(seed)
        unit = _unit_times(self.arrivals, self.burstiness, self.rate * self.duration, rng)
        return unit / self.rate


@dataclass(frozen=True)
class RateShape:
    """A rate over time, piecewise linear through ``points`` of (seconds, requests/s);
    two points at the same time make a step. Starts at 0, ends at the last point."""

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        times = [t for t, _ in self.points]
        if len(self.points) < 2 or times[0] != 0.0 or times != sorted(times):
            raise ValueError("a rate shape needs >= 2 points, from t=0, in time order")
        if times[-1] <= 0 or any(not (r > 0 and math.isfinite(r)) for _, r in self.points):
            raise ValueError("a rate shape needs a positive duration and rates > 0")

    @classmethod
    def burst(
        cls, base: float, peak: float, start: float, length: float, duration: float
    ) -> RateShape:
        """``base`` requests/s, stepping to ``peak`` for ``length`` seconds from ``start``."""
        if not 0 < start < start + length < duration:
            raise ValueError("the burst must start after 0 and end before the duration")
        return cls(
            (
                (0.0, base),
                (start, base),
                (start, peak),
                (start + length, peak),
                (start + length, base),
                (duration, base),
            )
        )

    @classmethod
    def ramp(cls, start_rate: float, end_rate: float, duration: float) -> RateShape:
        return cls(((0.0, start_rate), (duration, end_rate)))

    @property
    def duration(self) -> float:
        return self.points[-1][0]

    def cumulative(self, t: Offsets) -> Offsets:
        """Expected arrivals by time ``t``: the integral of the rate (exact, per segment)."""
        out = np.zeros_like(t, dtype=np.float64)
        for (t0, r0), (t1, r1) in zip(self.points, self.points[1:], strict=False):
            if t1 == t0:
                continue
            span = np.clip(t - t0, 0.0, t1 - t0)
            slope = (r1 - r0) / (t1 - t0)
            out += r0 * span + 0.5 * slope * span**2
        return out

    def expected(self) -> float:
        return float(self.cumulative(np.array([self.duration]))[0])


@dataclass(frozen=True)
class ShapedLoad:
    """Open-loop load whose rate follows ``shape`` (bursts, ramps)."""

    shape: RateShape
    arrivals: Arrivals = Arrivals.POISSON
    burstiness: float = 1.0
    resolution: int = 20_000

    def __post_init__(self) -> None:
        _check_arrivals(self.arrivals, self.burstiness)

    @property
    def duration(self) -> float:
        return self.shape.duration

    def schedule(self, seed: int) -> Offsets:
        """Unit-rate arrivals mapped through the inverse cumulative rate (time rescaling)."""
        rng = np.random.default_rng(seed)
        unit = _unit_times(self.arrivals, self.burstiness, self.shape.expected(), rng)
        grid = np.unique(
            np.concatenate(
                [
                    np.linspace(0.0, self.duration, self.resolution),
                    [t for t, _ in self.shape.points],
                ]
            )
        )
        times: Offsets = np.interp(unit, self.shape.cumulative(grid), grid)
        return times[times < self.duration]


Schedule = OpenLoop | ShapedLoad
"""Any open-loop schedule: ``.schedule(seed)`` offsets and a ``.duration``."""
