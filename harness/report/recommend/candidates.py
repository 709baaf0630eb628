"""Evidence from the records: the runs' planned cells read, and each recorded cell judged
against the SLO as one or more candidates (its best load point, both paths of a cell
measured side by side) or left out with its status and why."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from harness.exceptions import RecordError
from harness.load.capacity import KneeRule, LoadPoint
from harness.metrics.slo import BUILT_IN, SLO, adjusted_percentile, check_named, within
from harness.metrics.stats import min_samples_for, percentile_key, rate_ci
from harness.report import pareto
from harness.report.matrix import fmt_number
from harness.report.recommend.verdicts import (
    Candidate,
    Check,
    Method,
    NotConsidered,
    Params,
    RecommendError,
)
from harness.results import reading
from harness.results.environment import hardware
from harness.results.reading import RunContents
from harness.results.records import CellRecord, Status, format_param
from harness.results.redact import MASK, is_secret_name
from harness.results.reportspec import Latency, Rate, ReportSpec

# Below this share of the offered rate a point is saturated (the knee rule's own bound).
MIN_ACHIEVED = KneeRule().min_achieved


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class RunCell:
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
    spec: ReportSpec
    """What the workload declared for reports (the record's, else the planned cell's)."""
    options: tuple[tuple[str, str], ...] = ()
    """The run's ``--engine-opt`` values for its engine: part of its configuration."""


def cells_of(run: RunContents) -> list[RunCell]:
    """The run's planned cells (the reader refused records of any other)."""
    manifest = run.manifest
    by_id = {r.cell_id: r for r in run.records}
    model = manifest.settings.get("model")
    model = None if model is None else str(model)
    options = _engine_options(manifest.settings.get("engine_options"))
    cells = []
    for planned in manifest.planned:
        rec = by_id.get(planned.cell_id)
        env = _environment(manifest.environment, rec)
        params = tuple(planned.params.items())
        spec = rec.reporting() if rec is not None else planned.reporting()
        cells.append(
            RunCell(
                manifest.run_id,
                planned.cell_id,
                planned.workload,
                planned.engine,
                params,
                rec,
                env,
                model,
                spec,
                options.get(planned.engine, ()),
            )
        )
    return cells


def _engine_options(found: object) -> dict[str, tuple[tuple[str, str], ...]]:
    """Each engine's ``--engine-opt`` values as the manifest has them (masked where the
    option's name says it holds a secret: the text is published)."""
    if not isinstance(found, dict):
        return {}
    return {
        str(engine): tuple(
            (str(k), MASK if is_secret_name(str(k)) else str(v)) for k, v in sorted(opts.items())
        )
        for engine, opts in found.items()
        if isinstance(opts, dict)
    }


def _environment(manifest_env: Mapping[str, Any], rec: CellRecord | None) -> Mapping[str, Any]:
    """The run's machine; a manifest that does not say falls back to the record's."""
    if hardware(manifest_env) or rec is None:
        return manifest_env
    return rec.environment


def read_runs(run_dirs: Sequence[Path], skip_damaged: bool) -> list[RunContents]:
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


# --------------------------------------------------------------------------- judging


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _contender(cell: RunCell) -> str:
    """What competes: the engine, and the values of the parameters the workload declares
    as contenders beside it (``engine/value``)."""
    given = dict(cell.params)
    values = [given.get(k) for k in cell.spec.contender]
    return "/".join([cell.engine, *(format_param(v) for v in values if v is not None)])


def _rate(record: CellRecord, rate: Rate | None) -> float | None:
    return None if rate is None else _num(record.metric(rate.metric))


def _summary_value(metrics: Mapping[str, Any], slo: SLO) -> tuple[float | None, str | None]:
    """The error-adjusted percentile of ``slo``'s metric, or why there is none."""
    summary = metrics.get(slo.metric)
    if not isinstance(summary, dict):
        return None, "not recorded"
    value = adjusted_percentile(summary, slo.percentile)
    if value is None:
        key = percentile_key(slo.percentile)
        return (
            None,
            f"not measured (too few requests: {key} needs {min_samples_for(slo.percentile)})",
        )
    return value, None


def _point_value(point: LoadPoint, slo: SLO) -> tuple[float | None, str | None]:
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


def _latency(summary: object) -> float | None:
    """The p99 of a latency summary; None where it has none to show (too few requests,
    a figure that is not a finite number)."""
    value = _num(summary.get("p99")) if isinstance(summary, dict) else None
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def _latencies(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """``ttft_p99_s`` and ``e2e_p99_s`` of the completed requests, for the Pareto fronts:
    the p99 the record reports, not the error-adjusted one (failed requests already
    count against the goodput the fronts plot them at)."""
    return {f"{m}_p99_s": _latency(metrics.get(m)) for m in pareto.METRICS}


def _check(slo: SLO, found: tuple[float | None, str | None]) -> Check:
    value, absent = found
    return Check(slo.key, slo.metric, slo.percentile, slo.threshold_s, value, absent)


def has_metric(record: CellRecord, metric: str) -> bool:
    sweep = _sweep(record, record.reporting())
    if sweep is not None:
        full = sweep.full or {}
        return metric in full or any(metric in p for p in sweep.points)
    return isinstance(record.metrics.get(metric), dict)


UNDECLARED = tuple(Latency(name=n, samples=None if n == "itl" else n) for n in BUILT_IN)
"""What a record that declares no latencies is held to (as every record was before
workloads declared them): the harness's own latencies, each with its samples where they
are one per request (``itl`` has one per token)."""


def latencies(cell: RunCell) -> tuple[Latency, ...]:
    """The latencies an SLO may hold ``cell`` to: those its workload declares; for a cell
    that declares none, those of the harness's own its record measured (all of them where
    it has no measurement to tell)."""
    if cell.spec.latencies is not None:
        return cell.spec.latencies
    record = cell.record
    if record is None or not record.metrics:
        return UNDECLARED
    return tuple(x for x in UNDECLARED if has_metric(record, x.name))


def check_slos(slos: Sequence[SLO], cells: Sequence[RunCell]) -> None:
    """RecommendError, saying what the runs have, unless each SLO names a latency some
    cell of the runs declares: an SLO that could apply nowhere is a mistake to point out,
    not a ranking by throughput."""
    declared = {x.name for cell in cells for x in latencies(cell)}
    try:
        check_named(
            slos,
            declared,
            where="these runs",
            fix="name one of those, or leave --slo out to rank by throughput",
        )
    except ValueError as exc:
        raise RecommendError(str(exc)) from None


def _counted(record: CellRecord, rate: Rate) -> tuple[int, float] | None:
    """The completed count and the window the cell's rate is that count over, or None
    when the record does not say both, or its rate was measured over another window."""
    if rate.completed is None:
        return None
    ok = _num(record.metric(rate.completed))
    rps = _num(record.metric(rate.metric))
    window = _num(record.window.get("duration_s"))
    if ok is None or rps is None or window is None or window <= 0:
        return None
    if abs(ok / window - rps) > 1e-6 * max(rps, 1.0):
        return None
    return int(ok), window


def _sample_goodput(
    record: CellRecord,
    slos: Sequence[SLO],
    counted: tuple[int, float] | None,
    held: Sequence[Latency],
) -> tuple[int, float] | None:
    """Requests within every SLO and the window, from per-request samples, or None when
    the record's samples cannot say it exactly. ``counted``: the record's completed
    count and window (``_counted``); ``held``: the cell's latencies, which say where
    each one's per-request samples are (``itl`` has one per token: none).

    Workloads store ``e2e`` and ``ttft`` once per successful request, in request
    order; ``tpot`` skips single-token requests (then it is not aligned). Failed
    requests have no samples and never meet an SLO.
    """
    if counted is None:
        return None
    ok, window = counted
    where = {x.name: x.samples for x in held}
    columns: dict[str, list[float]] = {}
    for s in slos:
        key = where.get(s.metric)
        column = record.samples.get(key) if key is not None else None
        if column is None or len(column) != ok:
            return None
        columns[s.metric] = column
    return int(within(columns, slos).sum()), window


def _energy(record: CellRecord) -> dict[str, Any]:
    """``mean_power_w`` from the record's ``metrics.energy``, or ``energy_absent`` saying
    why there is none. The power is read against the record's rates only when it was
    measured over the window those rates were."""
    found = record.metrics.get("energy")
    if not isinstance(found, dict):
        return {"energy_absent": "the record has no metrics.energy (written before it was kept)"}
    if "absent" in found:
        return {"energy_absent": str(found["absent"])}
    power, span = _num(found.get("mean_power_w")), _num(found.get("window_s"))
    window = _num(record.window.get("duration_s"))
    if power is None or span is None:
        return {"energy_absent": "metrics.energy has no mean power over a window"}
    if window is None or abs(span - window) > 1e-3 * window:
        return {
            "energy_absent": f"its energy covers {fmt_number(span)} s, not the"
            f" {fmt_number(window or 0.0)} s window its rates were measured over"
        }
    return {"mean_power_w": power}


SEARCH_ENERGY = "a load search records the energy of one load point, not of each"
PAIRED_ENERGY = "the energy of a cell measuring two configurations is not split between them"


def _saturation(record: CellRecord) -> str | None:
    """A cell the validity check found saturated is not a sustainable operating point."""
    found = [w for w in (record.validity.warnings if record.validity else ()) if "saturated" in w]
    return found[0] if found else None


def _answers_changed(record: CellRecord, spec: ReportSpec) -> str | None:
    """A faster path that changes the answers is not a win: never recommended (the
    workload declares which of its warnings say so)."""
    warnings = record.validity.warnings if record.validity else ()
    found = [w for w in warnings if spec.answer_checks and w.startswith(spec.answer_checks)]
    return f"changes the model's answers beyond tolerance: {found[0]}" if found else None


def _base(cell: RunCell, record: CellRecord) -> dict[str, Any]:
    warnings = record.validity.warnings if record.validity else ()
    return {
        "run_id": cell.run_id,
        "cell_id": cell.cell_id,
        "engine": _contender(cell),
        "params": cell.params,
        "warnings": tuple(warnings),
        "scenario_keys": cell.spec.scenario,
        "engine_options": cell.options or None,
    }


def _simple(cell: RunCell, record: CellRecord, slos: Sequence[SLO]) -> Candidate | NotConsidered:
    rate, spec = cell.spec.throughput, cell.spec
    throughput = _rate(record, rate)
    if rate is None or throughput is None:
        return _left_out(cell, "ok", ("the record has no throughput figure to rank by",))
    checks = tuple(_check(s, _summary_value(record.metrics, s)) for s in slos)
    counted = _counted(record, rate)
    method: Method
    goodput: float | None
    ci = _interval(record.metric(rate.ci)) if rate.ci is not None else None
    if not slos:
        method, goodput = "no SLO", throughput
    elif (recount := _sample_goodput(record, slos, counted, latencies(cell))) is not None:
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
        unit=rate.unit,
        counts=rate.counts,
        output_tokens_per_s=_num(record.metric(spec.tokens)) if spec.tokens else None,
        goodput_ci95=ci if goodput is not None else None,
        goodput_step=1 / counted[1] if counted is not None else None,
        blocker=_saturation(record) or _answers_changed(record, spec),
        **_energy(record),
        **_latencies(record.metrics),
    )


def _interval(value: object) -> tuple[float | None, float | None] | None:
    if not isinstance(value, list | tuple) or len(value) != 2:
        return None
    return _num(value[0]), _num(value[1])


@dataclass(frozen=True)
class _Sweep:
    """The load points of a sweep or capacity search, and the one the search settled
    on (``settled`` load, ``full`` its complete metrics)."""

    points: tuple[LoadPoint, ...]
    settled: float | None
    full: Mapping[str, Any] | None
    unit: str
    tokens: str | None
    """Where output tokens/s are in ``full``."""


def _sweep(record: CellRecord, spec: ReportSpec) -> _Sweep | None:
    search = spec.search
    found = record.metric(search.points) if search is not None else None
    if search is None or not isinstance(found, list):
        return None
    point = record.metric(search.settled)
    load = _num(point.get("load")) if isinstance(point, dict) else None
    unit = point.get("unit") if isinstance(point, dict) else None
    if not isinstance(unit, str):  # no settled point: its headline still says
        unit = next((h.unit for h in record.headline if h.metric.endswith(".load")), "")
    at = record.metric(search.full)
    points = tuple(cast(LoadPoint, p) for p in found if isinstance(p, dict))
    full = at if isinstance(at, dict) else None
    return _Sweep(points, load, full, unit or "req/s", spec.tokens)


def _judge_point(point: LoadPoint, sweep: _Sweep, slos: Sequence[SLO]) -> tuple[Check, ...]:
    """The settled point is judged on its full metrics, the others on what they keep."""
    settled = sweep.full is not None and point.get("load") == sweep.settled
    full = sweep.full if settled and sweep.full is not None else {}
    return tuple(
        _check(s, _summary_value(full, s) if s.metric in full else _point_value(point, s))
        for s in slos
    )


def _point_blocker(point: LoadPoint) -> str | None:
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
    cell: RunCell, record: CellRecord, sweep: _Sweep, slos: Sequence[SLO]
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
        point, checks = min(judged, key=lambda pc: (closeness(pc[1]), pc[0]["load"]))
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
        energy_absent=SEARCH_ENERGY,
        **_point_latencies(sweep, point),
    )


def _point_latencies(sweep: _Sweep, point: LoadPoint) -> dict[str, Any]:
    """The point's own p99s (it keeps a compact summary of each latency); the settled
    point's complete metrics where the compact one lacks a figure."""
    own = _latencies(cast(Mapping[str, Any], point))
    if sweep.full is None or point.get("load") != sweep.settled:
        return own
    full = _latencies(sweep.full)
    return {k: v if v is not None else full[k] for k, v in own.items()}


def _settled_tokens(sweep: _Sweep, point: LoadPoint) -> float | None:
    """Output tokens/s: only the point the search settled on keeps its full metrics."""
    if sweep.full is None or sweep.tokens is None or point.get("load") != sweep.settled:
        return None
    node: Any = sweep.full
    for part in sweep.tokens.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return _num(node)


def closeness(checks: Iterable[Check]) -> float:
    """How far the worst SLO is from its threshold (<= 1 meets); unknown is infinite."""
    worst = 0.0
    for c in checks:
        worst = max(worst, math.inf if c.value_s is None else c.value_s / c.threshold_s)
    return worst


def _left_out(cell: RunCell, status: str, reasons: tuple[str, ...]) -> NotConsidered:
    return NotConsidered(
        cell.run_id,
        cell.cell_id,
        _contender(cell),
        cell.params,
        status,
        reasons,
    )


def judge(cell: RunCell, slos: Sequence[SLO]) -> list[Candidate | NotConsidered]:
    record = cell.record
    if record is None:
        return [_left_out(cell, "missing", ("no record (interrupted run?)",))]
    if record.status is not Status.OK or record.validity is None:
        why = record.reasons or (record.validity.reasons if record.validity else ())
        return [_left_out(cell, record.status.value, tuple(why) or ("no reason given",))]
    sweep = _sweep(record, cell.spec)
    if sweep is not None:
        return [_from_sweep(cell, record, sweep, slos)]
    pair = _paired(cell, record)
    if pair:
        return list(pair)
    return [_simple(cell, record, slos)]


def _paired(cell: RunCell, record: CellRecord) -> tuple[Candidate, ...]:
    """Both configurations of a cell that measured two side by side (a reduced precision
    and its reference), ranked without SLO: their rates come from p50 latency or one
    request at a time, not from serving a load."""
    paired = cell.spec.paired
    if paired is None:
        return ()
    own, ref = _rate(record, paired.own), _rate(record, paired.reference)
    if own is None or ref is None:
        return ()
    base = _base(cell, record) | {
        "load": None,
        "load_unit": None,
        "checks": (),
        "energy_absent": PAIRED_ENERGY,
    }
    blocker = _answers_changed(record, cell.spec)
    return (
        Candidate(**base, **_figures(paired.own), goodput=own, throughput=own, blocker=blocker),
        Candidate(
            **base,
            **_figures(paired.reference),
            goodput=ref,
            throughput=ref,
            variant=paired.reference_label,
        ),
    )


def _figures(rate: Rate) -> dict[str, Any]:
    return {"method": "no SLO", "unit": rate.unit, "counts": rate.counts}
