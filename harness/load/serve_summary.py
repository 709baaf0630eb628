"""From an open-loop serve trace (tensor engines) to a cell's metrics, evidence and samples.

Shared by every workload that serves requests through ``harness.load.serving``: latency from
the scheduled time, queue and service, the per-request stage breakdown with its time
account, throughput and goodput with intervals, generator lag, and the slow-request log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.load.saturation import EarlyStop
from harness.load.serving import ServeTrace
from harness.metrics import failures, slowlog, stats
from harness.metrics.slo import SLO, slo_verdicts, slos_on, within
from harness.metrics.validity import Evidence, latency_trend

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class TraceSummary:
    metrics: dict[str, Any]
    evidence: Evidence
    samples: dict[str, list[float]]
    slow: slowlog.SlowLog | None
    e2e: Array
    """Latency of the successful requests, seconds from their scheduled time."""
    early_stop: EarlyStop | None = None


SERVED_LATENCIES = ("e2e",)
"""What a served tensor request is held to: its end-to-end latency from its scheduled
time. The tensor workloads that serve through here declare it (``ReportSpec.latencies``)."""


def summarize_trace(
    trace: ServeTrace, offered_rate: float, slos: Sequence[SLO] = (), *, stationary: bool = True
) -> TraceSummary:
    """``slos``: the run's; those on ``SERVED_LATENCIES`` apply. ``stationary``: the offered
    rate is constant over the window, so a trend in latency is the system's and becomes a
    warning; False for a shaped load (a ramp, a burst)."""
    ok = ~trace.failed
    e2e_all = trace.t_done - trace.t_sched
    e2e = e2e_all[ok]
    n_ok, n_failed, window = int(ok.sum()), int(trace.failed.sum()), trace.window
    spans = {k: v[ok] for k, v in trace.request_spans().items()}
    e2e_summary = stats.summarize(e2e, n_failed)
    good = int(np.sum(ok & within({"e2e": e2e_all}, slos)))
    metrics: dict[str, Any] = {
        "e2e": stats.to_json(e2e_summary),
        "queue": stats.to_json(stats.summarize(spans["queue"])),
        "service": stats.to_json(stats.summarize((trace.t_done - trace.t_send)[ok])),
        **stats.stage_breakdown(spans, e2e),
        "lag": stats.to_json(stats.summarize(trace.lag)),
        "throughput": _throughput(n_ok, good, window),
        "requests": {"total": n_ok + n_failed, "ok": n_ok, "failed": n_failed, "met_slo": good},
        "errors": failures.tally(trace.errors),
    }
    metrics["slo"] = slo_verdicts(metrics, slos, SERVED_LATENCIES)
    stop = trace.early_stop
    if stop is not None:  # the requests it cut off are counted, not dropped
        metrics["requests"]["cut_off"] = stop.backlog + stop.unsent
        metrics["early_stop"] = stop.to_json()
    lag_p99 = stats.conservative(trace.lag, 99.0)
    evidence = Evidence(
        samples=n_ok,
        failed=n_failed,
        window_s=window,
        lag_p99_s=lag_p99,
        offered_rate=offered_rate,
        achieved_rate=n_ok / window if window > 0 else 0.0,
        negative_durations=int(np.sum(spans["queue"] < 0) + np.sum(e2e < spans["queue"])),
        notes=(_trend(e2e, trace.t_sched[ok], lag_p99) if stationary else ())
        + ((stop.describe(),) if stop else ()),
        span=(float(trace.t_sched.min()), float(trace.t_done.max())) if window > 0 else None,
    )
    threshold = min((s.threshold_s for s in slos_on(slos, SERVED_LATENCIES)), default=None)
    slow = slowlog.select(
        e2e,
        trace.t_sched[ok],
        p99_s=e2e_summary.percentiles.get("p99"),
        slo_s=threshold,
        spans=spans,
    )
    samples = {"e2e": stats.as_samples(e2e), "queue": stats.as_samples(spans["queue"])}
    samples["lag"] = stats.as_samples(trace.lag)
    return TraceSummary(metrics, evidence, samples, slow, e2e, stop)


def _trend(e2e: Array, t_sched: Array, lag_p99_s: float | None) -> tuple[str, ...]:
    """The serving loop keeps requests in schedule order (sorted offsets, index = order
    due); ordering by ``t_sched`` again (stable) costs little and keeps it so."""
    trend = latency_trend(e2e[np.argsort(t_sched, kind="stable")], floor_s=lag_p99_s)
    return (trend,) if trend else ()


def _throughput(n_ok: int, good: int, window: float) -> dict[str, Any]:
    if window <= 0:
        return {"requests_per_s": 0.0, "requests_per_s_ci95": [], "goodput_requests_per_s": 0.0}
    return {
        "requests_per_s": n_ok / window,
        "requests_per_s_ci95": list(stats.rate_ci(n_ok, window)),
        "items_per_s": n_ok / window,
        "goodput_requests_per_s": good / window,
        "goodput_requests_per_s_ci95": list(stats.rate_ci(good, window)),
    }
