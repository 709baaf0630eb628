"""The slow-request log: the tail, one request at a time, so it can be explained.

A request is slow when its latency exceeds twice the cell's p99 or an SLO threshold.
Each one is kept with its stage spans (where time went), the generator's lag (was the
client late?), for a server the harness scraped its state when the request was sent
(how many requests ran and waited, how full its KV cache was) and, when the record is
written, the telemetry samples around it (was the machine busy, did memory jump?). The
log keeps the slowest ``LIMIT`` and counts all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

LIMIT = 50
FACTOR = 2.0

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SlowRequest:
    """One slow request; times are absolute clock seconds (``MonotonicClock``)."""

    index: int
    t_sched: float
    t_end: float
    latency_s: float
    why: str
    spans: Mapping[str, float]
    lag_s: float | None = None
    server: Mapping[str, float] | None = None
    """The server's state when it was sent (harness.metrics.servermetrics), where scraped."""

    def __post_init__(self) -> None:
        if self.t_end < self.t_sched or self.latency_s < 0:
            raise ValueError("a slow request ends after it was due and has a latency >= 0")


@dataclass(frozen=True)
class SlowLog:
    threshold_s: float
    total: int
    requests: tuple[SlowRequest, ...]


def select(
    latency: Array,
    t_sched: Array,
    *,
    p99_s: float | None,
    slo_s: float | None = None,
    spans: Mapping[str, Array] | None = None,
    lag: Array | None = None,
    limit: int = LIMIT,
) -> SlowLog | None:
    """Slow requests among ``latency`` (successful requests, seconds from ``t_sched``).

    None when there is no threshold (too few samples for p99 and no SLO).
    """
    bounds = [b for b in (None if p99_s is None else FACTOR * p99_s, slo_s) if b is not None]
    if not bounds:
        return None
    threshold = min(bounds)
    slow = np.flatnonzero(latency > threshold)
    slowest = slow[np.argsort(latency[slow])[::-1][:limit]]
    out = []
    for i in slowest:
        value = float(latency[i])
        why = (
            f"{value * 1e3:.4g} ms > {FACTOR:g} x p99 ({p99_s * 1e3:.4g} ms)"
            if p99_s is not None and value > FACTOR * p99_s
            else f"{value * 1e3:.4g} ms > SLO {slo_s * 1e3 if slo_s else 0:.4g} ms"
        )
        out.append(
            SlowRequest(
                index=int(i),
                t_sched=float(t_sched[i]),
                t_end=float(t_sched[i]) + value,
                latency_s=value,
                why=why,
                spans={k: round(float(v[i]), 7) for k, v in (spans or {}).items()},
                lag_s=None if lag is None else round(float(lag[i]), 7),
            )
        )
    return SlowLog(threshold, int(slow.size), tuple(out))


def with_telemetry(
    log: SlowLog, telemetry: Mapping[str, Any], origin: float | None
) -> tuple[dict[str, Any], ...]:
    """The log as record entries, each with the telemetry samples taken while it ran
    (and the one before and after: samples are ``interval_s`` apart)."""
    series = telemetry.get("series", {}) if origin is not None else {}
    t = np.asarray(series.get("t", []), dtype=np.float64)
    interval = float(telemetry.get("interval_s", 0.0))
    out = []
    for req in log.requests:
        entry: dict[str, Any] = {
            "index": req.index,
            "t_sched_s": round(req.t_sched - (origin or 0.0), 6) if origin is not None else None,
            "latency_s": round(req.latency_s, 7),
            "why": req.why,
            "threshold_s": log.threshold_s,
            "spans": dict(req.spans),
            "lag_s": req.lag_s,
        }
        if req.server is not None:
            entry["server"] = dict(req.server)
        if t.size and origin is not None:
            lo, hi = req.t_sched - origin - interval, req.t_end - origin + interval
            entry["telemetry"] = _around(series, t, lo, hi)
        out.append(entry)
    return tuple(out)


def _around(
    series: Mapping[str, Sequence[float]], t: Array, lo: float, hi: float
) -> dict[str, Any]:
    idx = [int(i) for i in np.flatnonzero((t >= lo) & (t <= hi))]
    picked: dict[str, Any] = {"t": [float(t[i]) for i in idx]}
    for key in ("rss_bytes", "system_cpu_pct"):
        values = series.get(key, [])
        picked[key] = [values[i] for i in idx if i < len(values)]
    for key in ("cpu_user_pct", "cpu_system_pct"):
        # rates are between samples i-1 and i: entry i-1 of the rate list
        values = series.get(key, [])
        picked[key] = [values[i - 1] for i in idx if 0 < i <= len(values)]
    return picked
