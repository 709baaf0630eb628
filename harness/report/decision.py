"""The Decision that opens the HTML report: per question ``recommend`` answers (a
workload, on one machine, for one scenario), which engine and configuration to run, by
how much it beat the runner-up, why every other configuration lost, and the Pareto
fronts of rate against p99 latency.

It is ``recommend``'s answer (harness.report.recommend), laid out for a page: the SLO is
the one given (``report --slo``), else the one the runs were measured with (their
manifests' ``settings.slos``), else none (ranked by throughput), and the decision says
which. GPU energy per output token or per request is the record's ``metrics.energy``
(measured through NVML) or, where there is none, the reason it was not measured: it is
never estimated. A pure function of the records: the same runs give the same decision.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from harness.metrics.slo import SLO
from harness.report import pareto
from harness.report.matrix import fmt_number
from harness.report.plots import slug
from harness.report.recommend import candidates, ranking
from harness.report.recommend.ranking import overlap
from harness.report.recommend.recommendtext import also, describe, margin, pareto_mark, verdict
from harness.report.recommend.verdicts import (
    Candidate,
    NotConsidered,
    Recommendation,
    RecommendError,
    RunInfo,
    WorkloadAdvice,
    figure_name,
    param_text,
)
from harness.results.reading import RunContents
from harness.results.records import CellRecord

Source = Literal["option", "runs", "none"]


@dataclass(frozen=True)
class Options:
    """What the decision is reckoned with: ``slos`` given (None: the runs' own), the
    machine's hourly cost and the price of a kWh (None: not priced)."""

    slos: tuple[SLO, ...] | None = None
    gpu_hour_cost: float | None = None
    energy_price: float | None = None

    def __post_init__(self) -> None:
        keys = [s.key for s in self.slos or ()]
        if len(keys) != len(set(keys)):
            raise RecommendError(f"an SLO is given twice: {', '.join(keys)}")
        self.prices()  # refuses a price that is not a positive number

    def prices(self) -> ranking.Prices:
        return ranking.Prices(self.gpu_hour_cost, self.energy_price)


@dataclass(frozen=True)
class Pick:
    """A configuration as the decision shows it: the recommendation or the runner-up."""

    name: str
    """Engine and configuration (and run, where two runs measured the same one)."""
    engine: str
    configuration: str
    figure: str
    """What it is ranked on: "goodput" (under the SLO) or "throughput" (no SLO)."""
    rate: float
    unit: str
    ci95: tuple[float | None, float | None] | None
    details: str
    """Its figures as ``recommend`` prints them (interval, tokens/s, cost, SLOs met)."""
    energy: str
    """GPU energy per output token or request, or why it was not measured."""
    pareto: str
    """The fronts it is optimal on (``TTFT, E2E``), or empty."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate >= 0):
            raise ValueError("a pick's rate is a finite number >= 0")
        if self.figure not in ("goodput", "throughput"):
            raise ValueError("a pick is ranked on goodput or throughput")


@dataclass(frozen=True)
class Lost:
    """A configuration that was not recommended, and why."""

    name: str
    why: str
    pareto: str = ""


@dataclass(frozen=True)
class PlanePoint:
    """One configuration on a Pareto plane."""

    label: str
    rate: float
    latency_s: float
    optimal: bool
    recommended: bool


@dataclass(frozen=True)
class Plane:
    """Rate against the p99 of ``metric``: every configuration with both figures."""

    metric: str
    rate: str
    """The rate's axis label: "goodput (req/s)" or "throughput (req/s)"."""
    points: tuple[PlanePoint, ...]
    threshold_s: float | None
    """The p99 SLO on ``metric`` that applies to the question (drawn as a line)."""

    def __post_init__(self) -> None:
        if self.metric not in pareto.METRICS or not self.points:
            raise ValueError("a plane is one of the Pareto metrics, with points")
        flags = pareto.optimal([self.point(p) for p in self.points])
        if flags != tuple(p.optimal for p in self.points):
            raise ValueError("a plane's optimal points are its Pareto front")
        if sum(p.recommended for p in self.points) > 1:
            raise ValueError("one configuration at most is recommended")

    @staticmethod
    def point(p: PlanePoint) -> pareto.Point:
        return pareto.Point(p.rate, p.latency_s)

    @property
    def title(self) -> str:
        return f"{pareto.NAMES[self.metric]} p99"


@dataclass(frozen=True)
class Question:
    """The decision for one question (``recommend``'s WorkloadAdvice)."""

    id: str
    """Unique on the page: its anchor, and its Pareto plot's file name."""
    title: str
    machine: str
    slos: str
    slo_applied: bool
    """Some SLO applies to the question (else it is ranked by throughput)."""
    ranked_by: str
    pick: Pick | None
    no_pick: str | None
    runner_up: Pick | None
    margin: str | None
    overlap: bool | None
    """Whether the runner-up's 95 % interval reaches the pick's (None: no intervals)."""
    lost: tuple[Lost, ...]
    planes: tuple[Plane, ...]
    off_plot: tuple[str, ...]
    """Configurations that are no point of some plane, and why (no p99, no goodput)."""
    energy_note: str | None = None

    def __post_init__(self) -> None:
        if (self.pick is None) == (self.no_pick is None):
            raise ValueError("a question has a pick or says why it has none")
        if self.runner_up is not None and self.pick is None:
            raise ValueError("a runner-up comes after a pick")
        if (self.runner_up is None) != (self.margin is None):
            raise ValueError("a runner-up comes with its margin")
        if self.runner_up is None and self.overlap is not None:
            raise ValueError("intervals overlap only between a pick and a runner-up")

    @property
    def plot(self) -> str | None:
        """The name of its Pareto plot, None when no configuration has a p99 figure."""
        return f"pareto-{self.id}" if self.planes else None


@dataclass(frozen=True)
class Decision:
    slo: str
    """Which SLO the decision used, and where it came from."""
    source: Source
    questions: tuple[Question, ...]
    notes: tuple[str, ...] = ()
    """What the SLO of the runs could not settle (thresholds that differ, unreadable)."""

    def __post_init__(self) -> None:
        ids = [q.id for q in self.questions]
        if len(ids) != len(set(ids)):
            raise ValueError("each question has an id of its own")


# --------------------------------------------------------------------------- the SLO


def _slo(key: object, threshold: object) -> SLO | None:
    """An SLO from a manifest's ``settings.slos`` item, None where it is not one."""
    value = _number(threshold)
    if not isinstance(key, str) or value is None:
        return None
    metric, _, percentile = key.rpartition("_p")
    try:
        return SLO(metric, float(percentile), value)
    except ValueError:
        return None


def runs_slos(runs: Sequence[RunContents]) -> tuple[tuple[SLO, ...], tuple[str, ...]]:
    """The SLOs the runs were measured with, and notes on what did not fit: where runs
    were measured with different thresholds for one SLO, the tightest holds (a
    configuration meeting it meets the others)."""
    found: dict[str, list[SLO]] = {}
    notes: list[str] = []
    for run in runs:
        given = run.manifest.settings.get("slos")
        for key, threshold in given.items() if isinstance(given, dict) else ():
            slo = _slo(key, threshold)
            if slo is None:
                notes.append(f"run {run.manifest.run_id}: SLO setting {key!r} ignored: not an SLO")
                continue
            found.setdefault(slo.key, []).append(slo)
    chosen = []
    for key, slos in found.items():
        tightest = min(slos, key=lambda s: s.threshold_s)
        chosen.append(tightest)
        thresholds = sorted({ranking.slo_text(s) for s in slos})
        if len(thresholds) > 1:
            notes.append(
                f"the runs were measured with different {key} thresholds"
                f" ({', '.join(thresholds)}): the tightest, {ranking.slo_text(tightest)}, is used"
            )
    return tuple(chosen), tuple(notes)


def _slo_line(slos: Sequence[SLO], source: Source) -> str:
    if source == "none":
        return "no SLO: ranked by throughput"
    where = (
        "given with --slo"
        if source == "option"
        else "the SLO the runs were measured with: their manifests' settings.slos"
    )
    return f"SLO {', '.join(ranking.slo_text(s) for s in slos)} ({where})"


# --------------------------------------------------------------------------- energy


def energy_text(record: CellRecord | None, c: Candidate, shared: bool) -> str:
    """Joules per output token or per request from the record's ``metrics.energy``, or
    why there is no such figure; never an estimate."""
    if c.load is not None:
        return f"energy not measured for this load point: {candidates.SEARCH_ENERGY}"
    if shared:
        return f"energy not measured per configuration: {candidates.PAIRED_ENERGY}"
    found = record.metrics.get("energy") if record is not None else None
    if not isinstance(found, dict):
        return "energy not measured: the record has no metrics.energy (no NVML reading kept)"
    if "absent" in found:
        return f"energy not measured: {found['absent']}"
    return _joules(found)


def _joules(energy: Mapping[str, Any]) -> str:
    power = _number(energy.get("mean_power_w"))
    watts = f", mean GPU power {fmt_number(power)} W" if power is not None else ""
    for key, per in (("per_output_token_j", "output token"), ("per_request_j", "request")):
        value = _number(energy.get(key))
        if value is not None:
            return f"{fmt_number(value)} J per {per} (GPU energy from NVML{watts})"
    joules = _number(energy.get("joules"))
    if joules is None:
        return "energy not measured: metrics.energy holds no joules"
    return f"{fmt_number(joules)} J over the window, with nothing counted to divide it by{watts}"


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


# --------------------------------------------------------------------------- questions


def _labels(candidates: Sequence[Candidate]) -> dict[int, str]:
    """Engine and configuration of each candidate; the run too where two runs measured
    the same one (the same label twice would read as one point)."""
    plain = [f"{c.engine} {c.configuration()}" for c in candidates]
    twice = {name for name, n in Counter(plain).items() if n > 1}
    return {
        id(c): f"{name} [run {c.run_id}]" if name in twice else name
        for c, name in zip(candidates, plain, strict=True)
    }


@dataclass(frozen=True)
class _Context:
    """What turning one WorkloadAdvice into a Question needs beside it."""

    records: Mapping[tuple[str, str], CellRecord]
    slos: tuple[SLO, ...]


def _pick(c: Candidate, name: str, ctx: _Context, shared: bool) -> Pick:
    return Pick(
        name=name,
        engine=c.engine,
        configuration=c.configuration(),
        figure=figure_name(c),
        rate=c.goodput if c.goodput is not None else c.throughput,
        unit=c.unit,
        ci95=c.goodput_ci95,
        details=describe(c),
        energy=energy_text(ctx.records.get((c.run_id, c.cell_id)), c, shared),
        pareto=", ".join(pareto.NAMES[m] for m in c.pareto),
    )


def _lost(w: WorkloadAdvice, labels: Mapping[int, str]) -> tuple[Lost, ...]:
    """Each other configuration once, at its best measurement (what other runs measured
    of it beside); the pick's own measurements in other runs are the pick again."""
    pick = w.recommended.identity if w.recommended is not None else None
    others = [
        Lost(labels[id(c)], verdict(c, w.recommended) + also(rest), pareto_mark(c, w.fronts))
        for c, *rest in ranking.configurations(w.candidates)
        if c.identity != pick
    ]
    return (*others, *(_left_out(n) for n in w.not_considered))


def _left_out(n: NotConsidered) -> Lost:
    name = f"{n.engine} {param_text(n.params)}".strip()
    return Lost(name, f"not considered: {n.status}: {'; '.join(n.reasons)}")


def _planes(w: WorkloadAdvice, labels: Mapping[int, str], slos: Sequence[SLO]) -> list[Plane]:
    rate = f"{'goodput' if w.slos_applied else 'throughput'} ({_unit(w)})"
    planes = []
    for metric in w.fronts:
        points = tuple(
            PlanePoint(
                labels[id(c)],
                c.pareto_rate or 0.0,
                c.latency(metric) or 0.0,
                metric in c.pareto,
                c is w.recommended,
            )
            for c in w.candidates
            if c.blocker is None and c.pareto_rate is not None and c.latency(metric) is not None
        )
        limits = [
            s.threshold_s
            for s in slos
            if s.metric == metric and s.percentile == 99 and ranking.slo_text(s) in w.slos_applied
        ]
        planes.append(Plane(metric, rate, points, min(limits) if limits else None))
    return planes


def _unit(w: WorkloadAdvice) -> str:
    return w.candidates[0].unit if w.candidates else "req/s"


def _why_none(w: WorkloadAdvice) -> str:
    if not w.candidates:
        return "no valid cell to recommend from"
    return "no valid cell meets the SLO" if w.slos_applied else "no valid cell can be recommended"


def _question(w: WorkloadAdvice, qid: str, ctx: _Context) -> Question:
    labels = _labels(w.candidates)
    cells = Counter((c.run_id, c.cell_id) for c in w.candidates)

    def pick(c: Candidate | None) -> Pick | None:
        if c is None:
            return None
        return _pick(c, labels[id(c)], ctx, cells[(c.run_id, c.cell_id)] > 1)

    r, u = w.recommended, w.runner_up
    return Question(
        id=qid,
        title=w.title,
        machine=w.hardware,
        slos=_question_slos(w),
        slo_applied=bool(w.slos_applied),
        ranked_by=w.ranked_by,
        pick=pick(r),
        no_pick=None if r is not None else _why_none(w),
        runner_up=pick(u),
        margin=margin(u, r) if u is not None and r is not None else None,
        overlap=overlap(u, r) if u is not None and r is not None else None,
        lost=_lost(w, labels),
        planes=tuple(_planes(w, labels, ctx.slos)),
        off_plot=tuple(
            f"{labels[id(c)]}: {c.pareto_absent}" for c in w.candidates if c.pareto_absent
        ),
        energy_note=w.energy_note,
    )


def _question_slos(w: WorkloadAdvice) -> str:
    if not w.slos_applied:
        if w.slos_not_applicable:
            return "no SLO applied (this workload measures none of them): ranked by throughput"
        return "no SLO: ranked by throughput"
    line = f"SLO applied: {', '.join(w.slos_applied)}"
    if w.slos_not_applicable:
        line += f" (not measured here: {', '.join(w.slos_not_applicable)})"
    return line


def _ids(rec: Recommendation) -> list[str]:
    """An anchor per question: its title, and its machine where there are several."""
    several = len(rec.hardware) > 1
    seen: Counter[str] = Counter()
    ids = []
    for w in rec.workloads:
        base = slug(f"{w.title} {w.hardware}" if several else w.title)[:100] or "question"
        seen[base] += 1
        ids.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return ids


# --------------------------------------------------------------------------- the whole


def decide(runs: Sequence[RunContents], options: Options) -> Decision:
    """The decision over ``runs`` (a pure function of their records). A record the
    recommendation cannot be built from raises, as the rest of the page does, so the
    reader's vetting names it."""
    notes: tuple[str, ...] = ()
    source: Source
    if options.slos is not None:
        slos, source = options.slos, "option"
    else:
        slos, notes = runs_slos(runs)
        source = "runs" if slos else "none"
    rec = _recommendation(runs, slos, options)
    records = {(r.run_id, r.cell_id): r for run in runs for r in run.records}
    ctx = _Context(records, slos)
    questions = tuple(
        _question(w, qid, ctx) for w, qid in zip(rec.workloads, _ids(rec), strict=True)
    )
    return Decision(_slo_line(slos, source), source, questions, notes)


def check_given_slos(runs: Sequence[RunContents], options: Options) -> None:
    """RecommendError unless each SLO given names a latency some cell of ``runs``
    declares (the runs' own SLOs apply where they can: a run may hold SLOs for
    workloads another run measured)."""
    if options.slos is not None:
        candidates.check_slos(options.slos, [c for run in runs for c in candidates.cells_of(run)])


def _recommendation(
    runs: Sequence[RunContents], slos: Sequence[SLO], options: Options
) -> Recommendation:
    infos = [RunInfo(r.manifest.run_id, r.manifest.run_id, r.state) for r in runs]
    cells = [cell for run in runs for cell in candidates.cells_of(run)]
    return ranking.recommend_cells(infos, cells, slos, options.prices())
