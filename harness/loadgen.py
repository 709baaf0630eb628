"""Arrival schedules for open-loop load: when each request is due, decided up front.

A schedule is fixed before the run from a seeded generator, so a slow system cannot
slow the arrivals down (no coordinated omission): latency is measured from these
scheduled times, and the serving loop records how late it was to notice them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


class Arrivals(enum.StrEnum):
    CONSTANT = "constant"
    POISSON = "poisson"


@dataclass(frozen=True)
class OpenLoop:
    """Open-loop load: ``rate`` requests/s for ``duration`` seconds."""

    rate: float
    duration: float
    arrivals: Arrivals = Arrivals.POISSON

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if not self.duration > 0:
            raise ValueError(f"duration must be > 0 s, got {self.duration}")

    def schedule(self, seed: int) -> npt.NDArray[np.float64]:
        """Offsets in seconds from the start, sorted, all within ``[0, duration)``."""
        if self.arrivals is Arrivals.CONSTANT:
            n = int(self.rate * self.duration)
            return np.arange(n, dtype=np.float64) / self.rate
        rng = np.random.default_rng(seed)
        # Draw more gaps than the mean needs so one draw almost always covers the window.
        expected = self.rate * self.duration
        n = int(expected + 8.0 * np.sqrt(expected) + 16)
        times = np.cumsum(rng.exponential(1.0 / self.rate, size=n))
        while times[-1] < self.duration:
            more = times[-1] + np.cumsum(rng.exponential(1.0 / self.rate, size=n))
            times = np.concatenate([times, more])
        # Shift so the first request is due at t=0: the window starts with work.
        times = times - times[0]
        inside: npt.NDArray[np.float64] = times[times < self.duration]
        return inside
