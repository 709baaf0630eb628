"""From streamed request records (generative engines) to a cell's metrics, evidence,
samples and slow-request log; the streaming counterpart of ``harness.load.serve_summary``.

Per request, the stages are ``queue`` (due to sent: the generator's lag in open loop),
for an HTTP engine ``network`` (sent to response headers: connection, transfer and the
server's admission), ``first_token`` (to the first token: queueing in the engine and
prefill) and ``decode`` (first to last token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.metrics import peers, slowlog, stats
from harness.metrics.streamtiming import SLO, RequestRecord, StreamMetrics
from harness.metrics.validity import Evidence, latency_trend

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class StreamSummary:
    metrics: dict[str, Any]
    evidence: Evidence
    samples: dict[str, list[float]]
    slow: slowlog.SlowLog | None


def spans(ok: Sequence[RequestRecord]) -> dict[str, Array]:
    """Per request; ``network`` (sent to response headers) where every request has it."""
    out = {
        "queue": np.array([r.t_send - r.t_sched for r in ok]),
        "first_token": np.array([r.t_first - r.t_send for r in ok]),
        "decode": np.array([r.t_last - r.t_first for r in ok]),
    }
    headers = [(r.client_stats or {}).get("http_headers_s") for r in ok]
    if ok and all(h is not None for h in headers):
        network = np.array(headers, dtype=np.float64)
        out = {"queue": out["queue"], "network": network} | {
            "first_token": out["first_token"] - network,
            "decode": out["decode"],
        }
    return out


def summarize_stream(
    records: Sequence[RequestRecord],
    slos: Sequence[SLO],
    offered_rate: float | None,
    *,
    stationary: bool = True,
) -> StreamSummary:
    """``offered_rate`` None: closed loop (no schedule, so no lag bound, no saturation and no
    trend). ``stationary``: the offered rate is constant over the window, so a trend in
    latency is the system's and becomes a warning; False for a shaped load."""
    m = StreamMetrics(records, slos)
    lag = [r.lag for r in records]
    ok = m.ok
    stage = spans(ok)
    e2e = np.array([r.t_last - r.t_sched for r in ok])
    t_sched = np.array([r.t_sched for r in ok])
    metrics = (
        m.to_json()
        | {"lag": stats.to_json(stats.summarize(lag))}
        | stats.stage_breakdown(stage, e2e)
        # the same requests under vllm bench serve's, AIPerf's and GuideLLM's definitions
        | {"peers": peers.reconcile(records)}
    )
    achieved = len(ok) / m.window_s if m.window_s > 0 else 0.0
    lag_p99 = stats.conservative(lag, 99.0) if offered_rate else None
    evidence = Evidence(
        samples=len(ok),
        failed=m.failed,
        window_s=m.window_s,
        lag_p99_s=lag_p99,
        offered_rate=offered_rate,
        achieved_rate=achieved if offered_rate else None,
        sent_rate=_sent_rate(records) if offered_rate else None,
        notes=_trend(e2e, t_sched, lag_p99) if offered_rate and stationary else (),
        span=_span(records),
    )
    samples = {k: stats.as_samples(v) for k, v in m.samples().items() if k != "icl"}
    samples["lag"] = stats.as_samples(lag)
    e2e_slo = min((s.threshold_s for s in slos if s.metric == "e2e"), default=None)
    slow = slowlog.select(
        e2e,
        t_sched,
        p99_s=stats.nearest_rank(e2e, 99.0) if e2e.size >= stats.min_samples_for(99.0) else None,
        slo_s=e2e_slo,
        spans=stage,
        lag=np.array([r.lag for r in ok]),
    )
    return StreamSummary(metrics, evidence, samples, slow)


def _trend(e2e: Array, t_sched: Array, lag_p99_s: float | None) -> tuple[str, ...]:
    """In schedule order: the driver returns records by request index (sorted offsets) and
    merging client processes puts each back at its index; a stable sort by ``t_sched``
    keeps it so for any caller."""
    trend = latency_trend(e2e[np.argsort(t_sched, kind="stable")], floor_s=lag_p99_s)
    return (trend,) if trend else ()


def _span(records: Sequence[RequestRecord]) -> tuple[float, float]:
    """The window ``StreamMetrics.window_s`` measures, on the records' clock."""
    return min(r.t_sched for r in records), max(r.t_end for r in records)


def _sent_rate(records: Sequence[RequestRecord]) -> float | None:
    """Requests per second from the first one due to the last one sent."""
    span = max(r.t_send for r in records) - min(r.t_sched for r in records)
    return len(records) / span if span > 0 and len(records) > 1 else None
