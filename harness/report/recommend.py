"""``python -m harness recommend``: which engine and configuration to run, under an SLO.

A recommendation answers one question at a time: a workload, on one machine (cells
measured on different hardware are never mixed), for one scenario (the model, the
offered load or traffic shape: ``SCENARIO_PARAMS``, given rather than chosen). Its
answer is the valid configuration with the highest goodput that meets every SLO that
applies, or with ``--gpu-hour-cost`` the lowest cost per million output tokens
(generative) or per thousand requests / images / items (tensor), which on one machine
is the same order as throughput. It names the runner-up (the next configuration in that
ranking, any engine), the best configuration of every engine, and why each other engine
lost: the SLO it missed and by how much, or how much lower its goodput was.

Rules the numbers follow (DESIGN.md, "Metric definitions", "Validity"):

* Only cells with status ok (verdict valid) are candidates. Invalid, failed, timed-out,
  crashed, skipped and missing cells are listed with their reasons, never recommended.
* An SLO applies to a cell that measured its metric (tensor cells have ``e2e`` only,
  generative cells ``ttft``/``tpot``/``e2e``/``itl``; preprocessing, shapes and
  precision cells have none, so they are ranked by throughput, "no SLO applied").
* A cell meets an SLO when the error-adjusted percentile (a failed request counts as
  infinite latency) is within the threshold; a percentile the cell could not report
  (too few requests) does not meet it.
* Goodput is requests that met every SLO / window. It is recounted from the record's
  per-request samples where they are aligned per request (``e2e``, ``ttft``, and
  ``tpot`` when every request has one) and the record's window is the one its rates
  were computed over; otherwise a cell that meets the SLO is credited its throughput.
* Load sweeps and capacity searches hold several load points: the candidate is the
  point with the highest throughput that meets the SLO, and its load is part of the
  configuration. A saturated point or cell (completing clearly less than it was
  offered) is not an operating point: its latency grows with the window.
* A precision cell measures its reduced precision and the fp32 reference side by side:
  both are candidates, so a slower reduced precision is not recommended over fp32.
* What competes is the engine; in preprocessing cells, the library doing it
  (``engine/backend``).

Exit status: ``EXIT_OK`` (0) when every measured workload got a recommendation,
``EXIT_NO_RECOMMENDATION`` (3) when some question with cells that ran (not only skipped
ones) has no cell meeting the SLO, or nothing at all could be recommended, and
``EXIT_USAGE`` (2) for bad input: an unreadable run directory or a damaged or foreign
record in one (unless ``--skip-damaged`` leaves those out and lists them), a bad
``--slo`` or cost, an unwritable ``--json`` path.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rich.console import Console

from harness.load.capacity import KneeRule
from harness.metrics.stats import min_samples_for, percentile_key, rate_ci
from harness.metrics.streamtiming import SLO, parse_slos
from harness.report.matrix import fmt_number, publish
from harness.results import reading
from harness.results.environment import hardware, hardware_label
from harness.results.reading import Damaged, RunContents
from harness.results.records import CellRecord, ParamValue, RecordError, Status, format_param

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NO_RECOMMENDATION = 3

Method = Literal["samples", "percentiles", "load points", "no SLO"]

METHODS: dict[str, str] = {
    "samples": "goodput recounted from per-request samples: requests within every SLO / window",
    "percentiles": "SLO judged on error-adjusted percentiles; a cell that meets it is"
    " credited its throughput (no aligned per-request samples to recount goodput)",
    "load points": "the load point with the highest throughput among those meeting the SLO"
    " (error-adjusted percentiles per point)",
    "no SLO": "throughput (no SLO applies to this workload)",
}

# Below this share of the offered rate a point is saturated (the knee rule's own bound).
MIN_ACHIEVED = KneeRule().min_achieved

# (metric path, unit, what one unit counts): the first one a record has is its throughput.
RATE_FIELDS = (
    ("throughput.requests_per_s", "req/s", "requests"),
    ("throughput.images_per_s", "img/s", "images"),
)

# A precision cell measures two configurations side by side, the reduced precision and
# its fp32 reference: (reduced rate, reference rate, unit, what one unit counts).
PRECISION_RATES = (
    ("throughput.reduced_items_per_s", "throughput.reference_items_per_s", "items/s", "items"),
    (
        "reduced.throughput.requests_per_s",
        "reference.throughput.requests_per_s",
        "req/s",
        "requests",
    ),
)
REFERENCE = "its fp32 reference path"
TOKENS_PER_S = "throughput.output_tokens_per_s"

SCENARIO_PARAMS = ("model", "rate", "load", "level", "shape")
"""Cell parameters that pose the question rather than answer it: the model, the offered
load (a batching cell's request rate, a streaming cell's loop and its level) and the
traffic shape. A higher offered load always "wins" on goodput, so cells are compared
only with cells of the same values; everything else is configuration to choose."""

Params = tuple[tuple[str, ParamValue], ...]


def _param_text(params: Params) -> str:
    return " ".join(f"{k}={format_param(v, none='none')}" for k, v in params)


class RecommendError(ValueError):
    """Input that cannot be recommended from (the message says what to do)."""


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Check:
    """One SLO judged on one candidate: ``value_s`` None when the cell could not say."""

    slo: str
    metric: str
    percentile: float
    threshold_s: float
    value_s: float | None
    absent: str | None = None
    """Why there is no value (too few requests for the percentile, metric not recorded)."""

    def __post_init__(self) -> None:
        if not (self.threshold_s > 0 and math.isfinite(self.threshold_s)):
            raise ValueError("an SLO threshold is a positive duration")
        if (self.value_s is None) != (self.absent is not None):
            raise ValueError("a check has a value or says why it has none")
        if self.value_s is not None and (math.isnan(self.value_s) or self.value_s < 0):
            raise ValueError(f"{self.slo}: a latency is >= 0, got {self.value_s}")

    @property
    def met(self) -> bool:
        return self.value_s is not None and self.value_s <= self.threshold_s

    def text(self) -> str:
        """``e2e p99 61.2 ms > 50 ms (+22.4 %)``, or why there is no value."""
        name = f"{self.metric} {percentile_key(self.percentile)}"
        limit = _duration(self.threshold_s)
        if self.value_s is None:
            return f"{name} {self.absent} (SLO {limit})"
        if math.isinf(self.value_s):
            return f"{name} inf > {limit} (failed requests count as infinite latency)"
        value = _duration(self.value_s)
        if self.met:
            return f"{name} {value} <= {limit}"
        return f"{name} {value} > {limit} (+{_pct(self.value_s / self.threshold_s - 1)} %)"


@dataclass(frozen=True)
class Cost:
    """What serving ``per`` costs on this machine at the candidate's rate."""

    amount: float
    per: str

    def __post_init__(self) -> None:
        if not (self.amount >= 0 and math.isfinite(self.amount)):
            raise ValueError("a cost is a finite amount >= 0")


@dataclass(frozen=True)
class Candidate:
    """A valid cell (for sweeps: its best load point) judged against the SLO.

    ``goodput`` is the ranking figure in ``unit`` (None when it is unknown because the
    cell misses the SLO and has no samples to recount it); ``throughput`` counts every
    completed request. ``blocker``: why the cell cannot be recommended whatever its
    numbers say (saturated, no valid load point).
    """

    run_id: str
    cell_id: str
    engine: str
    params: Params
    load: float | None
    load_unit: str | None
    checks: tuple[Check, ...]
    method: Method
    goodput: float | None
    throughput: float
    unit: str
    counts: str
    output_tokens_per_s: float | None = None
    goodput_ci95: tuple[float | None, float | None] | None = None
    """95 % interval of ``goodput`` where the record allows one (a bound None: unbounded)."""
    blocker: str | None = None
    warnings: tuple[str, ...] = ()
    cost: Cost | None = None
    variant: str | None = None
    """A second configuration measured inside the cell (a precision cell's reference)."""

    def __post_init__(self) -> None:
        if self.throughput < 0 or (self.goodput is not None and self.goodput < 0):
            raise ValueError("rates are >= 0")
        if self.goodput is not None and self.goodput > self.throughput * (1 + 1e-9):
            raise ValueError("goodput counts a subset of the completed requests")
        if (self.load is None) != (self.load_unit is None):
            raise ValueError("a load comes with its unit")
        if self.method == "no SLO" and self.checks:
            raise ValueError("a candidate ranked without SLO has no checks")

    @property
    def meets(self) -> bool:
        checks_ok = all(c.met for c in self.checks)
        return self.blocker is None and checks_ok and self.goodput is not None

    @property
    def missed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.met)

    def configuration(self) -> str:
        chosen = tuple((k, v) for k, v in self.params if k not in SCENARIO_PARAMS)
        parts = [_param_text(chosen)] if chosen else []
        if self.load is not None and self.load_unit is not None:
            parts.append(f"at load {fmt_number(self.load)} {self.load_unit}")
        if self.variant is not None:
            parts.append(f"[{self.variant}]")
        return " ".join(parts) or "(no parameters)"


@dataclass(frozen=True)
class NotConsidered:
    """A planned cell that cannot be a candidate, with its status and why."""

    run_id: str
    cell_id: str
    engine: str
    params: Params
    status: str
    reasons: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.reasons:
            raise ValueError("a cell left out says why")


@dataclass(frozen=True)
class EngineVerdict:
    """One engine's best configuration and how it fared against the recommendation."""

    engine: str
    best: Candidate | None
    verdict: str


@dataclass(frozen=True)
class WorkloadAdvice:
    """The verdict for one question: a workload, on one machine, for one scenario (the
    model and the offered load or traffic shape, which are given, not chosen)."""

    workload: str
    hardware: str
    scenario: Params
    slos_applied: tuple[str, ...]
    slos_not_applicable: tuple[str, ...]
    ranked_by: str
    recommended: Candidate | None
    runner_up: Candidate | None
    engines: tuple[EngineVerdict, ...]
    candidates: tuple[Candidate, ...]
    """Those meeting the SLO, best first, then the others, closest to meeting it first."""
    not_considered: tuple[NotConsidered, ...]

    def __post_init__(self) -> None:
        if self.recommended is not None and (
            not self.recommended.meets or self.recommended != self.candidates[0]
        ):
            raise ValueError("the recommendation is the best candidate meeting the SLO")
        if self.runner_up is not None and (self.recommended is None or not self.runner_up.meets):
            raise ValueError("a runner-up meets the SLO and comes after a recommendation")

    @property
    def title(self) -> str:
        return " ".join([self.workload, _param_text(self.scenario)]).strip()

    @property
    def measured(self) -> bool:
        """Some cell ran (not every one was skipped): a recommendation is expected."""
        return bool(self.candidates) or any(
            n.status != Status.SKIPPED.value for n in self.not_considered
        )


@dataclass(frozen=True)
class RunInfo:
    path: str
    run_id: str
    state: str
    """As readers show it: "interrupted: ..." for a running manifest nobody writes."""


@dataclass(frozen=True)
class Recommendation:
    slos: tuple[str, ...]
    gpu_hour_cost: float | None
    runs: tuple[RunInfo, ...]
    hardware: tuple[str, ...]
    workloads: tuple[WorkloadAdvice, ...]
    skipped: tuple[Damaged, ...] = ()
    """Damaged files left out (``--skip-damaged``)."""

    def __post_init__(self) -> None:
        if self.gpu_hour_cost is not None and not (
            self.gpu_hour_cost > 0 and math.isfinite(self.gpu_hour_cost)
        ):
            raise ValueError("the machine's hourly cost is a positive number")

    @property
    def exit_code(self) -> int:
        missing = [w for w in self.workloads if w.measured and w.recommended is None]
        if missing or not any(w.recommended for w in self.workloads):
            return EXIT_NO_RECOMMENDATION
        return EXIT_OK


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _Cell:
    """A planned (or recorded) cell of one run, with the machine it ran on."""

    run_id: str
    cell_id: str
    workload: str
    engine: str
    params: Params
    record: CellRecord | None
    environment: Mapping[str, Any]
    model: str | None
    """The run's ``--model`` (None: the embedded default)."""


def _cells_of(run: RunContents) -> list[_Cell]:
    """The run's planned cells (the reader refused records of any other)."""
    manifest = run.manifest
    by_id = {r.cell_id: r for r in run.records}
    model = manifest.settings.get("model")
    model = None if model is None else str(model)
    cells = []
    for planned in manifest.planned:
        rec = by_id.get(planned.cell_id)
        env = _environment(manifest.environment, rec)
        params = tuple(planned.params.items())
        cells.append(
            _Cell(
                manifest.run_id,
                planned.cell_id,
                planned.workload,
                planned.engine,
                params,
                rec,
                env,
                model,
            )
        )
    return cells


def _environment(manifest_env: Mapping[str, Any], rec: CellRecord | None) -> Mapping[str, Any]:
    """The run's machine; a manifest that does not say falls back to the record's."""
    if hardware(manifest_env) or rec is None:
        return manifest_env
    return rec.environment


def _read_runs(run_dirs: Sequence[Path], skip_damaged: bool) -> list[RunContents]:
    if not run_dirs:
        raise RecommendError("give at least one run directory")
    try:
        runs = reading.read_run_dirs([Path(p) for p in run_dirs], skip_damaged=skip_damaged)
    except (OSError, RecordError) as exc:
        raise RecommendError(f"cannot read run directory: {exc}") from exc
    seen: set[str] = set()
    for run in runs:
        if run.manifest.run_id in seen:
            raise RecommendError(
                f"run {run.manifest.run_id} is given twice ({run.path}); give it once"
            )
        seen.add(run.manifest.run_id)
    return runs


def _recommend_runs(
    runs: Sequence[RunContents], slos: Sequence[SLO], gpu_hour_cost: float | None
) -> Recommendation:
    infos = [RunInfo(str(r.path), r.manifest.run_id, r.state) for r in runs]
    cells = [cell for run in runs for cell in _cells_of(run)]
    skipped = tuple(d for r in runs for d in r.skipped)
    return recommend_cells(infos, cells, slos, gpu_hour_cost, skipped)


# --------------------------------------------------------------------------- judging


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _contender(engine: str, params: Params) -> str:
    """What competes: the engine, and for preprocessing cells the library doing it."""
    backend = dict(params).get("backend")
    return engine if backend is None else f"{engine}/{format_param(backend)}"


def _rate(record: CellRecord) -> tuple[float, str, str] | None:
    for path, unit, counts in RATE_FIELDS:
        value = _num(record.metric(path))
        if value is not None:
            return value, unit, counts
    return None


def _summary_value(metrics: Mapping[str, Any], slo: SLO) -> tuple[float | None, str | None]:
    """The error-adjusted percentile of ``slo``'s metric, or why there is none."""
    summary = metrics.get(slo.metric)
    if not isinstance(summary, dict):
        return None, "not recorded"
    key = percentile_key(slo.percentile)
    adjusted = summary.get("adjusted")
    value = _num(adjusted.get(key)) if isinstance(adjusted, dict) else None
    if value is None:
        return (
            None,
            f"not measured (too few requests: {key} needs {min_samples_for(slo.percentile)})",
        )
    return value, None


def _point_value(point: Mapping[str, Any], slo: SLO) -> tuple[float | None, str | None]:
    """A load point keeps a compact summary: the adjusted p99, and plain percentiles
    that equal the adjusted ones only when no request failed."""
    compact = point.get(slo.metric)
    if not isinstance(compact, dict):
        return None, "not recorded for this load point"
    key = percentile_key(slo.percentile)
    adjusted = _num(compact.get(f"{key}_adjusted"))
    if adjusted is not None:
        return adjusted, None
    plain = _num(compact.get(key))
    if plain is not None and point.get("failed") == 0:
        return plain, None
    return None, f"not recorded for this load point ({key})"


def _check(slo: SLO, found: tuple[float | None, str | None]) -> Check:
    value, absent = found
    return Check(slo.key, slo.metric, slo.percentile, slo.threshold_s, value, absent)


def _has_metric(record: CellRecord, metric: str) -> bool:
    sweep = _sweep(record)
    if sweep is not None:
        full = sweep.full or {}
        return metric in full or any(metric in p for p in sweep.points)
    return isinstance(record.metrics.get(metric), dict)


def _sample_goodput(record: CellRecord, slos: Sequence[SLO]) -> tuple[int, float] | None:
    """Requests within every SLO and the window, from per-request samples, or None when
    the record's samples cannot say it exactly.

    Workloads store ``e2e`` and ``ttft`` once per successful request, in request
    order; ``tpot`` skips single-token requests (then it is not aligned); ``itl`` is
    per token. Failed requests have no samples and never meet an SLO.
    """
    if any(s.metric == "itl" for s in slos):
        return None
    ok = _num(record.metric("requests.ok"))
    rps = _num(record.metric("throughput.requests_per_s"))
    window = _num(record.window.get("duration_s"))
    if ok is None or rps is None or window is None or window <= 0:
        return None
    if abs(ok / window - rps) > 1e-6 * max(rps, 1.0):
        return None  # the window is not the one the cell's rates were measured over
    columns = [record.samples.get(s.metric) for s in slos]
    if any(col is None or len(col) != ok for col in columns):
        return None
    good = sum(
        all(v <= s.threshold_s for v, s in zip(row, slos, strict=True))
        for row in zip(*[c for c in columns if c is not None], strict=True)
    )
    return good, window


def _saturation(record: CellRecord) -> str | None:
    """A cell the validity check found saturated is not a sustainable operating point."""
    found = [w for w in (record.validity.warnings if record.validity else ()) if "saturated" in w]
    return found[0] if found else None


ANSWER_CHECKS = ("parity vs ", "precision ")
"""Prefixes of the warnings a workload gives when a faster path changed the model's
answers beyond its stated tolerance (preprocessing parity, precision agreement)."""


def _answers_changed(record: CellRecord) -> str | None:
    """A faster path that changes the answers is not a win: never recommended."""
    found = [
        w
        for w in (record.validity.warnings if record.validity else ())
        if w.startswith(ANSWER_CHECKS)
    ]
    return f"changes the model's answers beyond tolerance: {found[0]}" if found else None


def _base(cell: _Cell, record: CellRecord) -> dict[str, Any]:
    warnings = record.validity.warnings if record.validity else ()
    return {
        "run_id": cell.run_id,
        "cell_id": cell.cell_id,
        "engine": _contender(cell.engine, cell.params),
        "params": cell.params,
        "warnings": tuple(warnings),
    }


def _simple(cell: _Cell, record: CellRecord, slos: Sequence[SLO]) -> Candidate | NotConsidered:
    rate = _rate(record)
    if rate is None:
        return _left_out(cell, "ok", ("the record has no throughput figure to rank by",))
    throughput, unit, counts = rate
    checks = tuple(_check(s, _summary_value(record.metrics, s)) for s in slos)
    method: Method
    goodput: float | None
    ci = _interval(record.metric("throughput.requests_per_s_ci95"))
    if not slos:
        method, goodput = "no SLO", throughput
    elif (recount := _sample_goodput(record, slos)) is not None:
        good, window = recount
        method, goodput, ci = "samples", good / window, rate_ci(good, window)
    else:
        method = "percentiles"
        goodput = throughput if all(c.met for c in checks) else None
    return Candidate(
        **_base(cell, record),
        load=None,
        load_unit=None,
        checks=checks,
        method=method,
        goodput=goodput,
        throughput=throughput,
        unit=unit,
        counts=counts,
        output_tokens_per_s=_num(record.metric(TOKENS_PER_S)),
        goodput_ci95=ci if goodput is not None else None,
        blocker=_saturation(record) or _answers_changed(record),
    )


def _interval(value: object) -> tuple[float | None, float | None] | None:
    if not isinstance(value, list | tuple) or len(value) != 2:
        return None
    return _num(value[0]), _num(value[1])


@dataclass(frozen=True)
class _Sweep:
    """The load points of a sweep or capacity search, and the one the search settled
    on (``settled`` load, ``full`` its complete metrics)."""

    points: tuple[Mapping[str, Any], ...]
    settled: float | None
    full: Mapping[str, Any] | None
    unit: str


def _sweep(record: CellRecord) -> _Sweep | None:
    for search, settled, full in (
        ("sweep", "knee", "at_knee"),
        ("search", "capacity", "at_capacity"),
    ):
        node = record.metrics.get(search)
        if isinstance(node, dict) and isinstance(node.get("points"), list):
            point = record.metrics.get(settled)
            load = _num(point.get("load")) if isinstance(point, dict) else None
            unit = point.get("unit") if isinstance(point, dict) else None
            if not isinstance(unit, str):  # no settled point: its headline still says
                unit = next((h.unit for h in record.headline if h.metric.endswith(".load")), "")
            at = record.metrics.get(full)
            points = tuple(p for p in node["points"] if isinstance(p, dict))
            return _Sweep(points, load, at if isinstance(at, dict) else None, unit or "req/s")
    return None


def _judge_point(point: Mapping[str, Any], sweep: _Sweep, slos: Sequence[SLO]) -> tuple[Check, ...]:
    """The settled point is judged on its full metrics, the others on what they keep."""
    settled = sweep.full is not None and point.get("load") == sweep.settled
    full = sweep.full if settled and sweep.full is not None else {}
    return tuple(
        _check(s, _summary_value(full, s) if s.metric in full else _point_value(point, s))
        for s in slos
    )


def _point_blocker(point: Mapping[str, Any]) -> str | None:
    if not point.get("valid"):
        return "invalid: " + "; ".join(str(r) for r in point.get("reasons", ()))
    offered, done = _num(point.get("offered")), _num(point.get("throughput"))
    if offered and done is not None and done < MIN_ACHIEVED * offered:
        return (
            f"saturated: completed {fmt_number(done)} of {fmt_number(offered)} req/s offered"
            f" (< {MIN_ACHIEVED:.0%})"
        )
    return None


def _from_sweep(
    cell: _Cell, record: CellRecord, sweep: _Sweep, slos: Sequence[SLO]
) -> Candidate | NotConsidered:
    usable = [p for p in sweep.points if _point_blocker(p) is None and _num(p.get("throughput"))]
    if not slos:
        # none of the user's SLOs applies: the point the run itself settled on
        usable = [p for p in usable if p.get("load") == sweep.settled]
    if not usable:
        why = "no valid, unsaturated load point" if slos else "the run settled on no load point"
        return _left_out(cell, "ok", (why,))
    judged = [(p, _judge_point(p, sweep, slos)) for p in usable]
    passing = [(p, c) for p, c in judged if all(x.met for x in c)]
    if passing:
        point, checks = max(passing, key=lambda pc: (pc[0]["throughput"], -pc[0]["load"]))
    else:
        point, checks = min(judged, key=lambda pc: (_closeness(pc[1]), pc[0]["load"]))
    throughput = float(point["throughput"])
    base = _base(cell, record)
    base["warnings"] = tuple(dict.fromkeys([*base["warnings"], *point.get("warnings", ())]))
    return Candidate(
        **base,
        load=float(point["load"]),
        load_unit=sweep.unit,
        checks=checks,
        method="load points" if slos else "no SLO",
        goodput=throughput if passing else None,
        throughput=throughput,
        unit="req/s",
        counts="requests",
        output_tokens_per_s=_settled_tokens(sweep, point),
        goodput_ci95=_interval(point.get("throughput_ci95")) if passing else None,
    )


def _settled_tokens(sweep: _Sweep, point: Mapping[str, Any]) -> float | None:
    """Output tokens/s: only the point the search settled on keeps its full metrics."""
    if sweep.full is None or point.get("load") != sweep.settled:
        return None
    tput = sweep.full.get("throughput")
    return _num(tput.get("output_tokens_per_s")) if isinstance(tput, dict) else None


def _closeness(checks: Iterable[Check]) -> float:
    """How far the worst SLO is from its threshold (<= 1 meets); unknown is infinite."""
    worst = 0.0
    for c in checks:
        worst = max(worst, math.inf if c.value_s is None else c.value_s / c.threshold_s)
    return worst


def _left_out(cell: _Cell, status: str, reasons: tuple[str, ...]) -> NotConsidered:
    return NotConsidered(
        cell.run_id,
        cell.cell_id,
        _contender(cell.engine, cell.params),
        cell.params,
        status,
        reasons,
    )


def _judge(cell: _Cell, slos: Sequence[SLO]) -> list[Candidate | NotConsidered]:
    record = cell.record
    if record is None:
        return [_left_out(cell, "missing", ("no record (interrupted run?)",))]
    if record.status is not Status.OK or record.validity is None:
        why = record.reasons or (record.validity.reasons if record.validity else ())
        return [_left_out(cell, record.status.value, tuple(why) or ("no reason given",))]
    sweep = _sweep(record)
    if sweep is not None:
        return [_from_sweep(cell, record, sweep, slos)]
    pair = _precision_pair(cell, record)
    if pair:
        return list(pair)
    return [_simple(cell, record, slos)]


def _precision_pair(cell: _Cell, record: CellRecord) -> tuple[Candidate, ...]:
    """Both paths of a precision cell, ranked without SLO: their rates come from p50
    latency or one request at a time, not from serving a load."""
    if not all(isinstance(record.metrics.get(k), dict) for k in ("reference", "reduced")):
        return ()
    for reduced, reference, unit, counts in PRECISION_RATES:
        low, ref = _num(record.metric(reduced)), _num(record.metric(reference))
        if low is None or ref is None:
            continue
        base = _base(cell, record) | {"load": None, "load_unit": None, "checks": ()}
        figures: dict[str, Any] = {"method": "no SLO", "unit": unit, "counts": counts}
        return (
            Candidate(
                **base, **figures, goodput=low, throughput=low, blocker=_answers_changed(record)
            ),
            Candidate(**base, **figures, goodput=ref, throughput=ref, variant=REFERENCE),
        )
    return ()


# --------------------------------------------------------------------------- ranking


@dataclass(frozen=True)
class _Figure:
    """What a workload is ranked by: goodput, or cost of ``per`` at rate ``source``."""

    label: str
    cost_per: str | None
    scale: float
    tokens: bool


def _figure(
    candidates: Sequence[Candidate], gpu_hour_cost: float | None, slo_applied: bool
) -> _Figure:
    unit = candidates[0].unit if candidates else "req/s"
    counts = candidates[0].counts if candidates else "requests"
    if gpu_hour_cost is None:
        what = "goodput under the SLO" if slo_applied else "throughput (no SLO applied)"
        return _Figure(f"highest {what} ({unit})", None, 1.0, tokens=False)
    meeting = [c for c in candidates if c.meets]
    if meeting and all(c.output_tokens_per_s for c in meeting):
        per, tokens, scale = "1M output tokens", True, 1e6
    else:
        per, tokens, scale = f"1k {counts}", False, 1e3
    rate = "output tokens/s" if tokens else unit
    label = (
        f"lowest cost per {per} at {gpu_hour_cost:g} per machine-hour (on one machine the"
        f" same order as highest {rate})"
    )
    return _Figure(label, per, scale, tokens)


def _priced(c: Candidate, figure: _Figure, gpu_hour_cost: float | None) -> Candidate:
    if gpu_hour_cost is None or figure.cost_per is None or not c.meets:
        return c
    rate = c.output_tokens_per_s if figure.tokens else c.goodput
    if not rate:
        return c
    return dataclasses.replace(
        c, cost=Cost(gpu_hour_cost / 3600 / rate * figure.scale, figure.cost_per)
    )


def _rank_key(c: Candidate, figure: _Figure) -> tuple[Any, ...]:
    tie = (c.engine, c.configuration(), c.run_id, c.cell_id)
    if c.meets:
        rate = (c.output_tokens_per_s if figure.tokens else c.goodput) or 0.0
        return (0, -rate, *tie)
    return (1, _closeness(c.checks) if c.blocker is None else math.inf, -c.throughput, *tie)


def _lower(a: float, b: float) -> str:
    return _pct(1 - a / b) if b > 0 else "0"


def _pct(x: float) -> str:
    """A fraction as a percentage: three significant figures, no exponent."""
    value = x * 100
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _duration(seconds: float) -> str:
    return f"{fmt_number(seconds)} s" if seconds >= 10 else f"{fmt_number(seconds * 1e3)} ms"


def _beaten(c: Candidate, best: Candidate) -> str:
    if c.cost is not None and best.cost is not None:
        more = _pct(c.cost.amount / best.cost.amount - 1) if best.cost.amount > 0 else "inf"
        return (
            f"{_lead(c)} costs {fmt_number(c.cost.amount)} per {c.cost.per},"
            f" {more} % more than the winner"
        )
    value, top = c.goodput or 0.0, best.goodput or 0.0
    return (
        f"{_lead(c)} {_figure_name(c)} {fmt_number(value)} {c.unit} is {_lower(value, top)} %"
        " lower than the winner's"
    )


def _lead(c: Candidate) -> str:
    return "no SLO applied;" if c.method == "no SLO" else "meets the SLO but"


def _why_missed(c: Candidate) -> str:
    """The blocker (saturated) first, then every SLO missed with its numbers."""
    return "; ".join([*([c.blocker] if c.blocker else []), *(x.text() for x in c.missed)])


def _engine_verdict(
    engine: str,
    ranked: Sequence[Candidate],
    left: Sequence[NotConsidered],
    winner: Candidate | None,
) -> EngineVerdict:
    own = [c for c in ranked if c.engine == engine]
    if not own:
        statuses = sorted({n.status for n in left if n.engine == engine})
        return EngineVerdict(engine, None, f"no valid cell ({', '.join(statuses)}; see below)")
    best = own[0]
    if winner is not None and best is winner:
        return EngineVerdict(engine, best, "recommended")
    if best.meets and winner is not None:
        return EngineVerdict(engine, best, _beaten(best, winner))
    tried = "its only configuration" if len(own) == 1 else f"all {len(own)} configurations"
    what = "the SLO" if any(c.checks for c in own) else "what a recommendation needs"
    return EngineVerdict(engine, best, f"misses {what} in {tried}; closest: {_why_missed(best)}")


def _advise(
    key: tuple[str, str, Params],
    cells: Sequence[_Cell],
    slos: Sequence[SLO],
    gpu_hour_cost: float | None,
) -> WorkloadAdvice:
    recorded = [c.record for c in cells if c.record is not None and c.record.status is Status.OK]
    applied = [s for s in slos if any(_has_metric(r, s.metric) for r in recorded)]
    judged = [j for c in cells for j in _judge(c, applied)]
    found = [j for j in judged if isinstance(j, Candidate)]
    left = tuple(j for j in judged if isinstance(j, NotConsidered))
    figure = _figure(found, gpu_hour_cost, bool(applied))
    ranked = sorted(
        (_priced(c, figure, gpu_hour_cost) for c in found), key=lambda c: _rank_key(c, figure)
    )
    meeting = [c for c in ranked if c.meets]
    winner = meeting[0] if meeting else None
    engines = list(dict.fromkeys([*(c.engine for c in ranked), *(n.engine for n in left)]))
    workload, label, scenario = key
    return WorkloadAdvice(
        workload=workload,
        hardware=label,
        scenario=scenario,
        slos_applied=tuple(_slo_text(s) for s in applied),
        slos_not_applicable=tuple(_slo_text(s) for s in slos if s not in applied),
        ranked_by=figure.label,
        recommended=winner,
        runner_up=meeting[1] if len(meeting) > 1 else None,
        engines=tuple(_engine_verdict(e, ranked, left, winner) for e in engines),
        candidates=tuple(ranked),
        not_considered=left,
    )


def _scenario(cell: _Cell) -> Params:
    found = tuple((k, v) for k, v in cell.params if k in SCENARIO_PARAMS)
    if cell.model is not None and "model" not in dict(cell.params):
        found = (("model", cell.model), *found)
    return found


def _slo_text(slo: SLO) -> str:
    return f"{slo.key}<={fmt_number(slo.threshold_s * 1e3)}ms"


def _hardware_groups(cells: Sequence[_Cell]) -> dict[str, tuple[str, list[_Cell]]]:
    """Cells by machine (hardware fingerprint), each with a label; two machines with
    the same short label get a number so they still read apart."""
    groups: dict[str, tuple[str, list[_Cell]]] = {}
    for cell in cells:
        key = json.dumps(hardware(cell.environment), sort_keys=True, default=str)
        if key not in groups:
            label = hardware_label(cell.environment)
            same = sum(1 for lbl, _ in groups.values() if lbl.split(" [machine")[0] == label)
            groups[key] = (f"{label} [machine {same + 1}]" if same else label, [])
        groups[key][1].append(cell)
    return groups


def recommend_cells(
    runs: Sequence[RunInfo],
    cells: Sequence[_Cell],
    slos: Sequence[SLO],
    gpu_hour_cost: float | None,
    skipped: Sequence[Damaged] = (),
) -> Recommendation:
    groups = _hardware_groups(cells)
    questions: dict[tuple[str, str, Params], list[_Cell]] = {}
    for label, members in groups.values():
        for cell in members:
            questions.setdefault((cell.workload, label, _scenario(cell)), []).append(cell)
    # a workload's scenarios stay together, in the order the runs planned them
    order = list(dict.fromkeys(c.workload for c in cells))
    keys = sorted(questions, key=lambda k: order.index(k[0]))
    advice = [_advise(k, questions[k], slos, gpu_hour_cost) for k in keys]
    return Recommendation(
        slos=tuple(_slo_text(s) for s in slos),
        gpu_hour_cost=gpu_hour_cost,
        runs=tuple(runs),
        hardware=tuple(label for label, _ in groups.values()),
        workloads=tuple(advice),
        skipped=tuple(skipped),
    )


def recommend(
    run_dirs: Sequence[Path],
    slos: Sequence[SLO],
    gpu_hour_cost: float | None = None,
    *,
    skip_damaged: bool = False,
) -> Recommendation:
    """The recommendation for ``slos`` from the runs in ``run_dirs`` (a pure function of
    their contents); raises ``RecommendError`` for input it cannot use, damaged or
    foreign records included unless ``skip_damaged`` leaves them out (and lists them)."""
    keys = [s.key for s in slos]
    if len(keys) != len(set(keys)):
        raise RecommendError(f"an SLO is given twice: {', '.join(keys)}")
    if gpu_hour_cost is not None and not (gpu_hour_cost > 0 and math.isfinite(gpu_hour_cost)):
        raise RecommendError(f"--gpu-hour-cost must be a positive number, got {gpu_hour_cost:g}")
    runs = _read_runs(run_dirs, skip_damaged)
    try:
        _, rec = reading.vet(
            runs, lambda rs: _recommend_runs(rs, slos, gpu_hour_cost), skip_damaged=skip_damaged
        )
    except RecordError as exc:
        raise RecommendError(f"cannot recommend from these runs: {exc}") from exc
    return rec


# --------------------------------------------------------------------------- output


def _figure_name(c: Candidate) -> str:
    return "throughput" if c.method == "no SLO" else "goodput"


def _describe(c: Candidate) -> str:
    """The candidate's figures: goodput (or throughput), tokens/s, cost, SLOs met."""
    rate = c.goodput if c.goodput is not None else c.throughput
    parts = [f"{_figure_name(c)} {fmt_number(rate)} {c.unit}{_ci_text(c.goodput_ci95)}"]
    if c.output_tokens_per_s is not None:
        parts.append(f"{fmt_number(c.output_tokens_per_s)} output tokens/s")
    if c.cost is not None:
        parts.append(f"{fmt_number(c.cost.amount)} per {c.cost.per}")
    met = [x.text() for x in c.checks if x.met]
    if met:
        parts.append("; ".join(met))
    return ", ".join(parts)


def _ci_text(ci: tuple[float | None, float | None] | None) -> str:
    if ci is None:
        return ""
    lo, hi = ("?" if v is None else fmt_number(v) for v in ci)
    return f" [95% {lo}, {hi}]"


def _named(c: Candidate, several_runs: bool) -> str:
    """Engine, configuration and (when several runs are read) which run."""
    run = f" [run {c.run_id}]" if several_runs else ""
    return f"{c.engine} {c.configuration()}{run}"


def _render_workload(w: WorkloadAdvice, several_machines: bool, several_runs: bool) -> list[str]:
    where = f" on {w.hardware}" if several_machines else ""
    lines = [f"== {w.title}{where} =="]
    if w.candidates:
        lines += _render_slos(w)
        lines.append(f"ranked by: {w.ranked_by}")
    lines += _render_pick(w, several_runs)
    lines += _render_engines(w, several_runs)
    lines += _render_all(w, several_runs)
    lines += _render_left_out(w.not_considered)
    return [*lines, ""]


def _render_left_out(left: Sequence[NotConsidered]) -> list[str]:
    """Cells left out, those of one engine with the same status and reasons together."""
    groups: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    for n in left:
        groups.setdefault((n.engine, n.status, n.reasons), []).append(_param_text(n.params))
    lines = ["not considered:"] if groups else []
    for (engine, status, reasons), configs in groups.items():
        named = f"{engine} {configs[0]}".strip()
        if len(configs) > 1:
            named = f"{engine} ({len(configs)} cells: {', '.join(configs)})"
        lines.append(f"  {named}: {status}: {'; '.join(reasons)}")
    return lines


def _render_slos(w: WorkloadAdvice) -> list[str]:
    if not w.slos_applied:
        return ["no SLO applied: none of the given SLOs is measured by this workload"]
    line = f"SLOs applied: {', '.join(w.slos_applied)}"
    if w.slos_not_applicable:
        line += f" (not measured here: {', '.join(w.slos_not_applicable)})"
    return [line]


def _render_pick(w: WorkloadAdvice, several_runs: bool) -> list[str]:
    r = w.recommended
    if r is None:
        why = "no valid cell meets the SLO" if w.candidates else "no valid cell to recommend from"
        return [f"NO RECOMMENDATION: {why}"]
    lines = [f"RECOMMENDED: {_named(r, several_runs)}: {_describe(r)}"]
    lines.append(f"  method: {METHODS[r.method]}")
    if r.warnings:
        lines.append(f"  (!) warnings: {'; '.join(r.warnings)}")
    u = w.runner_up
    if u is None:
        other = "meets the SLO" if w.slos_applied else "is valid"
        return [*lines, f"runner-up: none (no other configuration {other})"]
    return [*lines, f"runner-up: {_named(u, several_runs)}: {_describe(u)} ({_gap(u, r)})"]


def _gap(u: Candidate, r: Candidate) -> str:
    """How far behind the runner-up is, and whether the two are told apart at all."""
    if u.cost is not None and r.cost is not None and r.cost.amount > 0:
        gap = f"costs {_pct(u.cost.amount / r.cost.amount - 1)} % more"
    else:
        gap = f"{_lower(u.goodput or 0.0, r.goodput or 0.0)} % lower {_figure_name(u)}"
    low, high = (r.goodput_ci95 or (None, None))[0], (u.goodput_ci95 or (None, None))[1]
    if low is not None and high is not None and high >= low:
        gap += "; their 95% intervals overlap: the difference may be noise"
    return gap


def _render_engines(w: WorkloadAdvice, several_runs: bool) -> list[str]:
    lines = ["by engine (best configuration of each):"]
    for v in w.engines:
        named = _named(v.best, several_runs) if v.best else v.engine
        lines.append(f"  {named}: {v.verdict}")
    return lines


def _render_all(w: WorkloadAdvice, several_runs: bool) -> list[str]:
    if len(w.candidates) < 2:  # one candidate is already shown above
        return []
    lines = ["all configurations (best first):"]
    for i, c in enumerate(w.candidates, start=1):
        verdict = _describe(c) if c.meets else f"not recommended: {_why_missed(c)}"
        lines.append(f"  {i}. {_named(c, several_runs)}: {verdict}")
    return lines


def render(rec: Recommendation) -> str:
    """The recommendation as text; the same input gives the same bytes."""
    cost = f"; machine cost {rec.gpu_hour_cost:g} per hour" if rec.gpu_hour_cost else ""
    lines = [f"Recommendation for SLO {', '.join(rec.slos) or '(none)'}{cost}"]
    for run in rec.runs:
        state = "" if run.state == "complete" else f" (run is {run.state}: cells may be missing)"
        lines.append(f"run {run.run_id}: {run.path}{state}")
    lines += reading.skipped_lines(rec.skipped)
    several = len(rec.hardware) > 1
    if several:
        lines.append(
            f"cells come from {len(rec.hardware)} different machines; each machine is"
            f" recommended separately, never mixed: {' | '.join(rec.hardware)}"
        )
    else:
        lines.append(f"machine: {rec.hardware[0] if rec.hardware else 'unknown hardware'}")
    lines.append("")
    for w in rec.workloads:
        lines += _render_workload(w, several, len(rec.runs) > 1)
    lines.append(_summary(rec))
    return "\n".join(lines).rstrip() + "\n"


def _summary(rec: Recommendation) -> str:
    missing = [w.title for w in rec.workloads if w.measured and w.recommended is None]
    if missing:
        return f"no recommendation for: {', '.join(missing)} (exit {rec.exit_code})"
    if rec.exit_code != EXIT_OK:
        return f"nothing to recommend: no workload has a valid cell (exit {rec.exit_code})"
    return f"every measured workload has a recommendation (exit {rec.exit_code})"


def _plain(value: Any) -> Any:
    """JSON-ready data: parameters as objects (in their declared order), each
    candidate's verdict and configuration text beside its figures, and infinity as the
    string "Infinity", as records write it."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            out[f.name] = _plain(dict(item) if f.name in ("params", "scenario") else item)
        if isinstance(value, Candidate):
            out |= {"meets": value.meets, "configuration": value.configuration()}
        return out
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "Infinity" if value > 0 else ("-Infinity" if value < 0 else "NaN")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def to_json(rec: Recommendation) -> bytes:
    """Stable bytes: field order is the types', list order the ranking's."""
    data = _plain(rec) | {"exit_code": rec.exit_code, "methods": METHODS}
    return (json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode()


# --------------------------------------------------------------------------- CLI


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "recommend",
        help="the engine and configuration to run per workload under an SLO",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument(
        "--slo",
        required=True,
        help="comma-separated METRIC_pNN=DURATION (metrics ttft, tpot, e2e, itl; units s, ms,"
        " us), e.g. ttft_p99=200ms,tpot_p99=50ms,e2e_p99=2s",
    )
    p.add_argument(
        "--gpu-hour-cost",
        type=float,
        metavar="X",
        help="cost of one hour of the machine (any currency): rank by cost per 1M output"
        " tokens / 1k requests or images",
    )
    p.add_argument("--json", metavar="PATH", help="also write the recommendation as JSON")
    reading.add_skip_damaged(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace, console: Console) -> int:
    try:
        slos = parse_slos(args.slo)
        if not slos:
            raise ValueError("no SLO given")
    except ValueError as exc:
        return _usage(
            console, f"bad --slo {args.slo!r}: {exc}; give e.g. --slo e2e_p99=50ms,ttft_p99=200ms"
        )
    try:
        rec = recommend(
            [Path(p) for p in args.run_dirs],
            slos,
            args.gpu_hour_cost,
            skip_damaged=args.skip_damaged,
        )
    except RecommendError as exc:
        return _usage(console, str(exc))
    console.print(render(rec), markup=False, highlight=False, soft_wrap=True, end="")
    if args.json:
        try:
            publish(Path(args.json), to_json(rec))
        except OSError as exc:
            return _usage(console, str(exc))
        console.print(f"wrote {args.json}", markup=False, highlight=False, soft_wrap=True)
    return rec.exit_code


def _usage(console: Console, message: str) -> int:
    console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    return EXIT_USAGE
