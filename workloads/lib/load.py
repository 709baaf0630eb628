"""Measured load points for the load / capacity workloads, one family each.

A target measures one load level (``rate_point``: open loop at a request rate;
``users_point``: closed loop with that many users) and keeps everything the cell record
needs for the point the search settles on: its evidence, raw samples and slow log.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from harness.api import (
    Cell,
    EngineError,
    Evidence,
    Headline,
    MonotonicClock,
    OpenLoop,
    RunSettings,
    TensorEngine,
    stats,
    summarize_stream,
)
from harness.engine import device_spans
from harness.load.arrivals import Schedule
from harness.load.capacity import CapacityResult, Point, Stop, SweepResult
from harness.load.clock import Clock
from harness.load.saturation import EarlyStop, EarlyStopRule, Watch
from harness.load.serve_summary import summarize_trace
from harness.load.serving import BatchPolicy, NoBatching, serve_open_loop
from harness.load.streamstop import with_early_stop
from harness.metrics.slo import SLO
from harness.metrics.slowlog import SlowLog
from harness.metrics.telemetry import Telemetry
from harness.metrics.validity import DRIFTED, Verdict, judge
from workloads.lib import inputs
from workloads.lib.generative import LoadSource, Sent, make_requests

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Measured:
    """One load level: the search's view (``point``) and the record's (the rest)."""

    point: Point
    metrics: dict[str, Any]
    evidence: Evidence
    samples: dict[str, list[float]]
    slow: SlowLog | None


@dataclass(frozen=True)
class Served:
    """One open-loop run, with per-request times for splitting it into windows."""

    metrics: dict[str, Any]
    evidence: Evidence
    samples: dict[str, list[float]]
    slow: SlowLog | None
    t_sched: Array  # seconds from the schedule's start, every request
    latency: Array  # e2e seconds, inf for a failed request
    start: float  # absolute clock time of the schedule's start
    early_stop: EarlyStop | None = None


def slo_failures(metrics: Mapping[str, Any]) -> tuple[str, ...]:
    out = []
    for key, verdict in metrics.get("slo", {}).items():
        if not verdict["met"]:
            value = verdict["value_s"]
            shown = "no value" if value is None else f"{value * 1e3:.4g} ms"
            out.append(f"{key} {shown} > {verdict['threshold_s'] * 1e3:g} ms")
    return tuple(out)


def _compact(metrics: Mapping[str, Any], ev: Evidence, warnings: Sequence[str]) -> dict[str, Any]:
    """What a search point keeps of its metrics: enough to plot and to judge it."""
    e2e, tput = metrics["e2e"], metrics["throughput"]
    out: dict[str, Any] = {
        "e2e": {k: e2e.get(k) for k in ("p50", "p99", "max", "ci95")}
        | {"p99_adjusted": e2e["adjusted"].get("p99")},
        "throughput_ci95": tput.get("requests_per_s_ci95"),
        "goodput": tput.get("goodput_requests_per_s"),
        "lag_p99_s": ev.lag_p99_s,
        "samples": ev.samples,
        "failed": ev.failed,
        "window_s": ev.window_s,
        "warnings": list(warnings),
    }
    if "ttft" in metrics:
        ttft = metrics["ttft"]
        out["ttft"] = {k: ttft.get(k) for k in ("p50", "p99", "ci95")}
    if "clients" in metrics:  # several client processes: each one's share of the point
        keep = ("index", "requests", "failed", "lag_p99_s", "start_late_s", "error")
        out["clients"] = [{k: c[k] for k in keep} for c in metrics["clients"]["per_client"]]
    return out


class Summarized(Protocol):
    @property
    def metrics(self) -> dict[str, Any]: ...
    @property
    def evidence(self) -> Evidence: ...
    @property
    def samples(self) -> dict[str, list[float]]: ...
    @property
    def slow(self) -> SlowLog | None: ...


def measured(
    load: float, run: Summarized, settings: RunSettings, early_stop: EarlyStop | None = None
) -> Measured:
    metrics, evidence = run.metrics, run.evidence
    offered = evidence.offered_rate
    validity = judge(evidence, settings.profile.policy)
    total = evidence.samples + evidence.failed
    point = Point(
        load=load,
        valid=validity.verdict is Verdict.VALID,
        reasons=validity.reasons,
        throughput=float(metrics["throughput"]["requests_per_s"]),
        error_rate=evidence.failed / total if total else 0.0,
        latency_p99_s=metrics["e2e"]["adjusted"].get("p99"),
        slo_failures=slo_failures(metrics),
        offered=offered,
        metrics=_compact(metrics, evidence, validity.warnings),
        early_stop=early_stop,
    )
    return Measured(point, metrics, evidence, run.samples, run.slow)


def timed_batch(
    engine: TensorEngine, pool: Sequence[dict[str, Any]], indices: Sequence[int], clock: Clock
) -> dict[str, float]:
    """Run requests ``indices`` (inputs drawn round-robin from ``pool``) as one batch;
    stage spans: ``preprocess`` (collate), ``infer``, ``postprocess`` (output check),
    and ``infer.h2d`` / ``infer.compute`` / ``infer.d2h`` where the engine times the
    device (``ReportsDeviceTimes``)."""
    t0 = clock.now()
    batch = inputs.collate([pool[i % len(pool)] for i in indices])
    t1 = clock.now()
    outputs = engine.infer(batch)
    t2 = clock.now()
    device = device_spans(engine)
    for name, out in outputs.items():
        if out.shape[0] != len(indices):
            raise EngineError(
                f"output {name} has batch dim {out.shape[0]}, expected {len(indices)}"
            )
    spans = {"preprocess": t1 - t0, "infer": t2 - t1, "postprocess": clock.now() - t2}
    return spans | device


@dataclass
class TensorTarget:
    """Open-loop requests of one item each, served through ``policy`` (no batching by
    default), spans: ``preprocess`` (collate), ``infer``, ``postprocess`` (output check).
    ``early_stop``: a search's rule for stopping a saturated rate point (None: measure
    every point in full)."""

    engine: TensorEngine
    pool: list[dict[str, Any]]
    settings: RunSettings
    slos: tuple[SLO, ...]
    seed: int
    policy: BatchPolicy = field(default_factory=NoBatching)
    clock: MonotonicClock = field(default_factory=MonotonicClock)
    points: dict[float, Measured] = field(default_factory=dict)
    early_stop: EarlyStopRule | None = None

    def _run_batch(self, indices: Sequence[int]) -> dict[str, float]:
        return timed_batch(self.engine, self.pool, indices, self.clock)

    def serve(self, schedule: Schedule, seed: int, watch: Watch | None = None) -> Served:
        offsets = schedule.schedule(seed)
        timeout = self.settings.reliability.request_timeout_s
        trace = serve_open_loop(
            offsets, self.policy, self._run_batch, self.clock, timeout, watch=watch
        )
        # a shaped load (ramp, burst) moves latency by design: no trend warning for it
        stationary = isinstance(schedule, OpenLoop)
        s = summarize_trace(
            trace, offsets.size / schedule.duration, self.slos, stationary=stationary
        )
        latency = np.where(trace.failed, np.inf, trace.t_done - trace.t_sched)
        start = float(trace.t_sched[0] - offsets[0]) if offsets.size else self.clock.now()
        offsets = offsets[: trace.t_sched.size]  # an early stop keeps the answered ones
        return Served(
            s.metrics, s.evidence, s.samples, s.slow, offsets, latency, start, s.early_stop
        )

    def rate_point(self, rate: float) -> Point:
        load = OpenLoop(rate=rate, duration=self.settings.profile.window_s)
        rule = self.early_stop
        watch = Watch(rule, load.duration, rate) if rule is not None else None
        run = self.serve(load, self.seed + len(self.points), watch)
        m = measured(rate, run, self.settings, run.early_stop)
        self.points[rate] = m
        return m.point


@dataclass
class GenerativeTarget:
    """Streamed requests with seeded unique prompts; every point draws new prompts. The
    load comes from ``source``: this process, or ``--clients`` client processes."""

    source: LoadSource
    settings: RunSettings
    slos: tuple[SLO, ...]
    vocab: int
    seed: int
    prompt: tuple[int, int, int]
    output: tuple[int, int, int]
    points: dict[float, Measured] = field(default_factory=dict)
    early_stop: EarlyStopRule | None = None
    early_stop_off: str | None = None
    """Why the rule could not stop the points (several client processes)."""
    _draws: int = 0

    def requests(self, n: int) -> list[Any]:
        self._draws += 1
        return make_requests(
            n, self.seed + 7919 * self._draws, self.vocab, self.prompt, self.output
        )

    def _summarize(self, load: float, sent: Sent, offered: float | None) -> Point:
        s = with_early_stop(summarize_stream(sent.records, self.slos, offered), sent.early_stop)
        s = replace(s, metrics=s.metrics | sent.extra)
        m = measured(load, s, self.settings, sent.early_stop)
        self.early_stop_off = self.early_stop_off or sent.early_stop_off
        self.points[load] = m
        return m.point

    def serve(self, schedule: Schedule) -> Served:
        offsets = schedule.schedule(self.seed + self._draws)
        reqs = self.requests(int(offsets.size))
        sent = self.source.open_loop(reqs, offsets)
        records = sent.records
        offered = offsets.size / schedule.duration
        s = summarize_stream(records, self.slos, offered, stationary=isinstance(schedule, OpenLoop))
        s = replace(s, metrics=s.metrics | sent.extra)
        start = min(r.t_sched for r in records) - float(offsets[0])
        t_sched = np.array([r.t_sched - start for r in records])
        latency = np.array([r.t_last - r.t_sched if r.ok else np.inf for r in records])
        return Served(s.metrics, s.evidence, s.samples, s.slow, t_sched, latency, start)

    def rate_point(self, rate: float) -> Point:
        """At least the profile's request count, and at least its window."""
        n = max(
            self.settings.profile.gen_requests, math.ceil(rate * self.settings.profile.window_s)
        )
        offsets = OpenLoop(rate=rate, duration=n / rate).schedule(self.seed + self._draws)
        watch = Watch(self.early_stop, n / rate, rate) if self.early_stop else None
        sent = self.source.open_loop(self.requests(int(offsets.size)), offsets, watch)
        return self._summarize(rate, sent, offsets.size / (n / rate))

    def users_point(self, users: float) -> Point:
        """At least the profile's request count and its window: enough requests for the
        window if throughput grew in proportion to users since the last point."""
        profile = self.settings.profile
        last = max(self.points.values(), key=lambda m: m.point.load, default=None)
        per_user = last.point.throughput / last.point.load if last else 0.0
        expected = per_user * users * profile.window_s * 1.5
        n = max(profile.gen_requests, 4 * int(users), math.ceil(expected))
        sent = self.source.closed_loop(
            self.requests(n), int(users), profile.window_s, profile.gen_requests
        )
        return self._summarize(users, sent, None)


def windows(run: Served, edges: Sequence[float]) -> list[dict[str, Any]]:
    """Latency and throughput per window of scheduled time: ``edges`` in seconds."""
    out = []
    for lo, hi in itertools.pairwise(edges):
        inside = (run.t_sched >= lo) & (run.t_sched < hi)
        lat = run.latency[inside]
        ok = lat[np.isfinite(lat)]
        summary = stats.summarize(ok, int(lat.size - ok.size))
        out.append(
            {
                "from_s": lo,
                "to_s": hi,
                "requests": int(lat.size),
                "failed": summary.failed,
                "scheduled_rate": float(lat.size) / (hi - lo),
                "e2e_p50": summary.percentiles.get("p50"),
                "e2e_p99": summary.percentiles.get("p99"),
                "e2e_p99_or_max": stats.conservative(list(ok), 99.0),
                "e2e_max": summary.max,
            }
        )
    return out


def _with(ev: Evidence, *, problems: Sequence[str] = (), notes: Sequence[str] = ()) -> Evidence:
    return replace(ev, problems=ev.problems + tuple(problems), notes=ev.notes + tuple(notes))


def _at(m: Measured, unit: str) -> dict[str, Any]:
    """The figures of the point a search settled on, for the cell's headline."""
    tput, e2e = m.metrics["throughput"], m.metrics["e2e"]
    return {
        "load": m.point.load,
        "unit": unit,
        "throughput": tput["requests_per_s"],
        "throughput_ci95": tput.get("requests_per_s_ci95"),
        "goodput": tput.get("goodput_requests_per_s"),
        "e2e_p50": e2e.get("p50"),
        "e2e_p99": e2e.get("p99"),
        "e2e_p99_ci95": e2e.get("ci95", {}).get("p99"),
        "time_account": m.metrics.get("time_account"),
    }


def _first(points: Mapping[float, Measured]) -> Measured:
    return next(iter(points.values()))


SWEEP_HEADLINE = (
    ("knee", "knee.load", None),
    ("tput", "knee.throughput", "knee.throughput_ci95"),
    ("p99", "knee.e2e_p99", "knee.e2e_p99_ci95"),
    ("blew up at", "knee.blown_at", None),
)


def finish_sweep(
    cell: Cell,
    result: SweepResult,
    points: Mapping[float, Measured],
    unit: str,
    seeds: dict[str, int],
) -> None:
    metrics: dict[str, Any] = {"sweep": result.to_json()}
    knee = result.knee
    if knee is None:
        evidence = _with(_first(points).evidence, problems=[f"no knee: {result.why}"])
        metrics["knee"] = None
        samples: dict[str, list[float]] = {}
        slow = None
    else:
        m = points[knee.load]
        after = [p.load for p in result.points if p.load > knee.load]
        metrics["knee"] = _at(m, unit) | {"blown_at": after[0] if after else None}
        notes = [] if result.stop is Stop.BLOWUP else [f"the knee is a lower bound: {result.why}"]
        evidence = _with(m.evidence, notes=notes)
        metrics["at_knee"] = m.metrics
        samples, slow = m.samples, m.slow
    cell.finish(
        metrics=metrics,
        evidence=evidence,
        headline=_headline(SWEEP_HEADLINE, unit),
        samples=samples,
        window={
            "points": len(result.points),
            "duration_s": sum(p.metrics["window_s"] for p in result.points),
        },
        seeds=seeds,
        slow=slow,
    )


CAPACITY_HEADLINE = (
    ("capacity", "capacity.load", None),
    ("tput", "capacity.throughput", "capacity.throughput_ci95"),
    ("p99", "capacity.e2e_p99", "capacity.e2e_p99_ci95"),
    ("fails at", "capacity.fails_at", None),
)


def _headline(spec: Sequence[tuple[str, str, str | None]], unit: str) -> list[Headline]:
    out = []
    for label, metric, ci in spec:
        latency = metric.endswith(("p99", "p50"))
        load_unit = unit if metric.endswith((".load", "_at")) else "req/s"
        out.append(
            Headline(
                label=label,
                metric=metric,
                unit="ms" if latency else load_unit,
                scale=1e3 if latency else 1.0,
                ci=ci,
            )
        )
    return out


def spread(reps: Sequence[Point]) -> tuple[dict[str, Any], list[str]]:
    """Run-to-run spread of repeated measurements of one load; high spread is a warning."""
    tput = np.array([p.throughput for p in reps])
    p99 = np.array([p.latency_p99_s if p.latency_p99_s is not None else np.nan for p in reps])
    doc: dict[str, Any] = {
        "repetitions": len(reps),
        "throughput": tput.tolist(),
        "e2e_p99_adjusted": [None if math.isnan(v) else v for v in p99],
        "passes": [p.passes for p in reps],
    }
    warnings = []
    if len(reps) > 1:
        doc["throughput_cv"] = float(tput.std(ddof=1) / tput.mean()) if tput.mean() > 0 else None
        finite = p99[np.isfinite(p99)]
        doc["e2e_p99_range_ratio"] = (
            float((finite.max() - finite.min()) / np.median(finite)) if finite.size > 1 else None
        )
        if (doc["throughput_cv"] or 0.0) > MAX_CV:
            warnings.append(
                f"run-to-run throughput spread CV {doc['throughput_cv']:.0%} > {MAX_CV:.0%}"
            )
        if (doc["e2e_p99_range_ratio"] or 0.0) > MAX_P99_RANGE:
            warnings.append(
                f"run-to-run p99 spread {doc['e2e_p99_range_ratio']:.0%} of its median"
                f" > {MAX_P99_RANGE:.0%}"
            )
    for i, p in enumerate(reps[1:], start=2):
        if not p.passes:
            why = "; ".join(p.reasons + p.slo_failures)
            warnings.append(f"the capacity point missed the objective on repetition {i}: {why}")
    return doc, warnings


MAX_CV = 0.10
MAX_P99_RANGE = 0.5


def finish_capacity(
    cell: Cell,
    result: CapacityResult,
    points: Mapping[float, Measured],
    reps: Sequence[Point],
    *,
    objective: str,
    seeds: dict[str, int],
    early_stop_off: str | None = None,
) -> None:
    """``early_stop_off``: why the search's points could not stop early (kept with it)."""
    metrics: dict[str, Any] = {"objective": objective, "search": result.to_json()}
    if early_stop_off:
        metrics["search"]["early_stop"]["not_applied"] = early_stop_off
    cap = result.capacity
    if cap is None:
        evidence = _with(_first(points).evidence, problems=[f"no capacity: {result.why}"])
        metrics["capacity"] = None
        samples: dict[str, list[float]] = {}
        slow = None
    else:
        m = points[cap.load]
        rep_doc, warnings = spread([cap, *reps])
        above = result.above.load if result.above else None
        metrics["capacity"] = _at(m, "req/s") | {"fails_at": above, "spread": rep_doc}
        metrics["at_capacity"] = m.metrics
        if not result.converged:
            warnings.append(f"the search did not converge: {result.why}")
        evidence = _with(m.evidence, notes=warnings)
        samples, slow = m.samples, m.slow
    cell.finish(
        metrics=metrics,
        evidence=evidence,
        headline=_headline(CAPACITY_HEADLINE, "req/s"),
        samples=samples,
        window={
            "points": len(result.points),
            "duration_s": sum(p.metrics["window_s"] for p in result.points),
        },
        seeds=seeds,
        slow=slow,
    )


MAX_RSS_GROWTH = 0.10
MAX_P99_DRIFT = 2.0


def memory_drift(sampler: Telemetry | None, start: float, duration: float) -> dict[str, Any]:
    """RSS over the run from the cell's telemetry: least-squares slope and growth."""
    if sampler is None:
        return {"absent": "no telemetry sampler for this cell"}
    t_all, rss_all = sampler.rss_series()
    t, rss = np.array(t_all), np.array(rss_all, dtype=np.float64)
    lo = start - sampler.origin
    inside = (t >= lo) & (t <= lo + duration)
    t, rss = t[inside], rss[inside]
    if t.size < 3:
        return {"absent": f"{t.size} telemetry samples in the run; a slope needs 3"}
    # RSS moves in pages: a slope under 0.1 byte/s is the fit's rounding, not drift
    slope = round(float(np.polyfit(t, rss, 1)[0]), 1) + 0.0
    return {
        "samples": int(t.size),
        "rss_start_bytes": float(rss[0]),
        "rss_end_bytes": float(rss[-1]),
        "rss_max_bytes": float(rss.max()),
        "rss_slope_bytes_per_s": slope,
        "rss_slope_mib_per_min": round(slope * 60 / 2**20, 4) + 0.0,
        "rss_growth_fraction": float(rss[-1] / rss[0] - 1.0) if rss[0] > 0 else None,
    }


def _drift_warnings(per_window: Sequence[dict[str, Any]], memory: Mapping[str, Any]) -> list[str]:
    out = []
    growth = memory.get("rss_growth_fraction")
    if growth is not None and growth > MAX_RSS_GROWTH:
        out.append(f"memory grew {growth:.0%} over the soak (> {MAX_RSS_GROWTH:.0%})")
    first, last = per_window[0]["e2e_p99_or_max"], per_window[-1]["e2e_p99_or_max"]
    if first and last and last > MAX_P99_DRIFT * first:
        out.append(
            f"{DRIFTED} last window p99 {last * 1e3:.4g} ms >"
            f" {MAX_P99_DRIFT:g} x the first's {first * 1e3:.4g} ms"
        )
    return out


SOAK_HEADLINE = (
    Headline(label="p99", metric="e2e.p99", unit="ms", scale=1e3, ci="e2e.ci95.p99"),
    Headline(label="first window p99", metric="drift.first_window_p99", unit="ms", scale=1e3),
    Headline(label="last window p99", metric="drift.last_window_p99", unit="ms", scale=1e3),
    Headline(label="RSS", metric="drift.memory.rss_slope_mib_per_min", unit="MiB/min"),
    Headline(
        label="tput",
        metric="throughput.requests_per_s",
        unit="req/s",
        ci="throughput.requests_per_s_ci95",
    ),
)


def finish_soak(
    cell: Cell, run: Served, duration: float, n_windows: int, seeds: dict[str, int]
) -> None:
    """Latency per time window and memory drift over a long fixed load."""
    edges = list(np.linspace(0.0, duration, n_windows + 1))
    per_window = windows(run, edges)
    memory = memory_drift(cell.sampler, run.start, duration)
    drift = {
        "first_window_p99": per_window[0]["e2e_p99_or_max"],
        "last_window_p99": per_window[-1]["e2e_p99_or_max"],
        "memory": memory,
    }
    cell.finish(
        metrics=run.metrics | {"windows": per_window, "drift": drift},
        evidence=_with(run.evidence, notes=_drift_warnings(per_window, memory)),
        headline=SOAK_HEADLINE,
        samples=run.samples,
        window={"duration_s": run.evidence.window_s, "windows": n_windows},
        seeds=seeds,
        slow=run.slow,
    )


SHAPE_HEADLINE = (
    Headline(label="p99", metric="e2e.p99", unit="ms", scale=1e3, ci="e2e.ci95.p99"),
    Headline(label="worst phase p99", metric="phases_worst_p99", unit="ms", scale=1e3),
    Headline(label="lag p99", metric="lag.p99", unit="ms", scale=1e3),
    Headline(label="tput", metric="throughput.requests_per_s", unit="req/s"),
)


def finish_shape(
    cell: Cell, run: Served, phases: Sequence[float], shape: dict[str, Any], seeds: dict[str, int]
) -> None:
    """A shaped load (burst, ramp, clumped arrivals), with latency per phase."""
    per_phase = windows(run, phases)
    worst = max((w["e2e_p99_or_max"] or 0.0 for w in per_phase), default=None)
    cell.finish(
        metrics=run.metrics | {"shape": shape, "phases": per_phase, "phases_worst_p99": worst},
        evidence=run.evidence,
        headline=SHAPE_HEADLINE,
        samples=run.samples,
        window={"duration_s": run.evidence.window_s, "phases": len(per_phase)},
        seeds=seeds,
        slow=run.slow,
    )
