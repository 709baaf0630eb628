"""One matrix cell as a workload sees it: identity, parameters, and the result it reports.

Workloads call ``Cell.finish`` once with their metrics and validity evidence; the
plugin turns the cell into a record whatever happened (ok, invalid, failed, skipped).
What the workload declared for the reports (``@pytest.mark.report_spec``, a
harness.results.reportspec.ReportSpec) goes into every record of the cell, and
``finish`` refuses a headline or declared path that its metrics do not have.
"""

from __future__ import annotations

import numbers
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.metrics import energy, stats
from harness.metrics.slowlog import SlowLog, with_telemetry
from harness.metrics.telemetry import Telemetry
from harness.metrics.validity import Evidence, Policy, Validity, judge
from harness.results.records import (
    CellRecord,
    Headline,
    ParamValue,
    Status,
    ValidityInfo,
    format_param,
)
from harness.results.reportspec import ReportSpec, check_path
from harness.results.store import utcnow
from harness.session import neighbours

_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]+")

REPORT_SPEC_MARK = "report_spec"
"""``@pytest.mark.report_spec(ReportSpec(...))`` on a workload's test function."""
ENGINE_SETTING_MARK = "engine_setting"
"""``@pytest.mark.engine_setting("prefix_cache")``: the named parameters of a workload set
its engine (an engine option, a server flag), so the cells that set it alike run together
(harness.session.state.setting_places): an engine or server starts once per setting."""


def make_cell_id(workload: str, engine: str, params: Mapping[str, ParamValue]) -> str:
    parts = [workload, engine, *(f"{k}={format_param(v, none='none')}" for k, v in params.items())]
    return _UNSAFE.sub("-", ".".join(parts)).strip(".-")


def check_declared(
    metrics: Mapping[str, Any], headline: Sequence[Headline], spec: ReportSpec | None
) -> None:
    """Every metrics path the cell's headline and declaration name resolves in
    ``metrics``; else ValueError naming the path and the keys there are (a typo would
    otherwise be an empty matrix entry, or a cell ``recommend`` cannot rank)."""
    for h in headline:
        check_path(metrics, h.metric, f"headline {h.label!r}")
        if h.ci is not None:
            check_path(metrics, h.ci, f"headline {h.label!r} (its ci)")
    for what, path in spec.paths() if spec is not None else ():
        check_path(metrics, path, f"report_spec {what}")


def check_reproduced(
    metrics: Mapping[str, Any], headline: Sequence[Headline], samples: Mapping[str, Sequence[float]]
) -> None:
    """Every headline statistic whose samples the cell stores (``e2e.p99`` and
    ``samples["e2e"]``, harness.metrics.stats.statistic) is what those samples give;
    else ValueError naming the headline, the path and both values. ``compare`` recomputes
    these figures from the samples and refuses ones they do not reproduce, so a figure
    computed from other values is a workload bug, caught here while it is measured.

    A figure recorded as not measured (a ``None``, an ``absent`` dict, a percentile
    withheld for too few samples: what ``check_declared`` lets through) has nothing to
    reproduce; a NaN one is reproduced only by no samples or a NaN statistic
    (harness.metrics.stats.reproduces).
    """
    for h in headline:
        stat = stats.statistic(h.metric)
        if stat is None or stat.key not in samples:
            continue
        recorded = _number_at(metrics, h.metric)
        if recorded is None:
            continue
        values = samples[stat.key]
        if stats.reproduces(stat, values, recorded):
            continue
        again = stat.of(np.asarray(values, dtype=np.float64)) if len(values) else None
        gives = f"give {again!r}" if again is not None else "are empty"
        raise ValueError(
            f"headline {h.label!r} (metrics path {h.metric!r}) records {recorded!r}, but the"
            f" {len(values)} values in samples[{stat.key!r}] {gives}: compute the figure from"
            " the samples the cell stores, or store the samples it was computed from"
        )


def _number_at(metrics: Mapping[str, Any], path: str) -> float | None:
    """The number at ``path`` in ``metrics``; None where there is none."""
    node: Any = metrics
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, numbers.Real):
        return None
    return float(node)


@dataclass(frozen=True)
class CellResult:
    metrics: dict[str, Any]
    samples: dict[str, list[float]]
    histograms: dict[str, dict[str, int]]
    headline: tuple[Headline, ...]
    window: dict[str, float | int]
    seeds: dict[str, int]
    validity: Validity
    slow: SlowLog | None = None
    single_stream: str | None = None
    span: tuple[float, float] | None = None
    """The measured window on perf_counter (``Evidence.span``), for its energy."""


@dataclass
class Cell:
    run_id: str
    cell_id: str
    workload: str
    engine: str
    params: dict[str, ParamValue]
    policy: Policy
    environment: dict[str, Any]
    started_at: str = field(default_factory=utcnow)
    _t0: float = field(default_factory=time.monotonic)
    engine_info: dict[str, Any] = field(default_factory=dict)
    result: CellResult | None = None
    attempt: int = 1
    repeat: int = 1
    telemetry: dict[str, Any] = field(default_factory=dict)
    sampler: Telemetry | None = None
    report_spec: ReportSpec | None = None
    """What the workload declared for the reports; None: it declared nothing."""

    def finish(
        self,
        *,
        metrics: dict[str, Any],
        evidence: Evidence,
        headline: Sequence[Headline],
        samples: dict[str, list[float]] | None = None,
        histograms: dict[str, dict[str, int]] | None = None,
        window: dict[str, float | int] | None = None,
        seeds: dict[str, int] | None = None,
        slow: SlowLog | None = None,
        single_stream: str | None = None,
    ) -> Validity:
        """Store the measured result; the validity verdict is decided here, once.

        ``single_stream`` names the ``samples`` key holding one latency per request, for a
        workload that kept exactly one request in flight (pytest-benchmark is fed those).
        """
        if self.result is not None:
            raise RuntimeError(f"cell {self.cell_id} already finished")
        if single_stream is not None and single_stream not in (samples or {}):
            raise ValueError(f"single_stream={single_stream!r} names no samples of this cell")
        check_declared(metrics, headline, self.report_spec)
        check_reproduced(metrics, headline, samples or {})
        validity = judge(evidence, self.policy)
        if slow is not None:
            metrics = metrics | {
                "slow_requests": {
                    "threshold_s": slow.threshold_s,
                    "count": slow.total,
                    "kept": len(slow.requests),
                }
            }
        self.result = CellResult(
            metrics=metrics,
            samples=samples or {},
            histograms=histograms or {},
            headline=tuple(headline),
            window=window or {},
            seeds=seeds or {},
            validity=validity,
            slow=slow,
            single_stream=single_stream,
            span=evidence.span,
        )
        return validity

    def record(
        self,
        status: Status | None = None,
        reasons: Sequence[str] = (),
        *,
        stderr_tail: Sequence[str] = (),
        duration_s: float | None = None,
    ) -> CellRecord:
        """The record for this cell; ``status`` None means: as the result says."""
        res = self.result
        if status is None:
            if res is None:
                status, reasons = Status.FAILED, ["the workload ended without reporting a result"]
            else:
                valid = res.validity.reasons == ()
                status = Status.OK if valid else Status.INVALID
                reasons = list(res.validity.reasons)
        keep = res is not None and status in (Status.OK, Status.INVALID)
        return CellRecord(
            run_id=self.run_id,
            cell_id=self.cell_id,
            workload=self.workload,
            engine=self.engine,
            params=self.params,
            status=status,
            reasons=tuple(reasons),
            started_at=self.started_at,
            finished_at=utcnow(),
            duration_s=round(time.monotonic() - self._t0 if duration_s is None else duration_s, 6),
            engine_info=self.engine_info,
            environment=self.environment,
            seeds=res.seeds if res else {},
            window=res.window if res and keep else {},
            metrics=self._metrics(res) if res and keep else {},
            samples=res.samples if res and keep else {},
            histograms=res.histograms if res and keep else {},
            headline=res.headline if res else (),
            validity=self._validity(res.validity) if res and keep else None,
            attempt=self.attempt,
            repeat=self.repeat,
            stderr_tail=tuple(stderr_tail),
            telemetry=self.telemetry,
            slow_requests=self._slow() if keep else (),
            single_stream=res.single_stream if res and keep else None,
            report_spec=self.report_spec,
        )

    def _metrics(self, res: CellResult) -> dict[str, Any]:
        """The workload's metrics and, where telemetry ran, the energy of its window: here,
        where the telemetry (stopped before the record is written) meets the window."""
        if not self.telemetry:
            return res.metrics
        origin = self.sampler.origin if self.sampler is not None else None
        return res.metrics | {
            "energy": energy.of_cell(self.telemetry, res.metrics, res.span, origin)
        }

    def _slow(self) -> tuple[dict[str, Any], ...]:
        if self.result is None or self.result.slow is None:
            return ()
        origin = self.sampler.origin if self.sampler is not None else None
        return with_telemetry(self.result.slow, self.telemetry, origin)

    def _validity(self, v: Validity) -> ValidityInfo:
        """The verdict, with what telemetry saw (a throttled GPU) and a tracer slowing this
        process (coverage) among its warnings."""
        seen = tuple(self.telemetry.get("warnings", ()))
        traced = neighbours.tracing_warning()
        warnings = v.warnings + seen + ((traced,) if traced else ())
        return ValidityInfo(verdict=v.verdict.value, reasons=v.reasons, warnings=warnings)
