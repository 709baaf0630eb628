"""Ranking: the questions (workload x machine x scenario), the figure each is ranked by
(goodput, or cost with ``--gpu-hour-cost`` and/or ``--energy-price``), the winner, the
runner-up and each engine's verdict; and ``recommend``, the whole of it from run
directories."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.exceptions import RecordError
from harness.metrics.energy import J_PER_KWH
from harness.metrics.slo import SLO
from harness.report import pareto
from harness.report.matrix import fmt_number
from harness.report.recommend.candidates import (
    RunCell,
    cells_of,
    check_slos,
    closeness,
    has_metric,
    judge,
    latencies,
    read_runs,
)
from harness.report.recommend.verdicts import (
    Candidate,
    Cost,
    EngineVerdict,
    NotConsidered,
    Params,
    Recommendation,
    RecommendError,
    RunInfo,
    WorkloadAdvice,
    duration,
    figure_name,
    lower,
    pct,
    positive,
)
from harness.results import reading
from harness.results.environment import hardware, hardware_label
from harness.results.reading import Damaged, RunContents
from harness.results.records import Status

# --------------------------------------------------------------------------- ranking

TIE = 1e-9
"""Relative difference below which two goodputs or costs are the same figure."""


@dataclass(frozen=True)
class Prices:
    """What a configuration's costs are reckoned at: machine time (``--gpu-hour-cost``,
    per hour) and GPU energy (``--energy-price``, per kWh); None: not priced."""

    gpu_hour: float | None = None
    energy_kwh: float | None = None

    def __post_init__(self) -> None:
        for option, value in (
            ("--gpu-hour-cost", self.gpu_hour),
            ("--energy-price", self.energy_kwh),
        ):
            if value is not None and not positive(value):
                raise RecommendError(f"{option} must be a positive number, got {value:g}")


@dataclass(frozen=True)
class _Figure:
    """What a workload is ranked by: goodput, or cost of ``per`` at rate ``source``;
    ``energy``: GPU energy is part of that cost, ``energy_note`` why it is not."""

    label: str
    cost_per: str | None
    scale: float
    tokens: bool
    energy: bool = False
    energy_note: str | None = None


def _energy_note(meeting: Sequence[Candidate], prices: Prices) -> str | None:
    """Why GPU energy cannot be priced for this question, or None when it can: every
    configuration that would be priced must have it, or their costs would not compare."""
    if prices.energy_kwh is None or not meeting:
        return None
    lacking = [c.energy_absent or "no mean power" for c in meeting if c.mean_power_w is None]
    if not lacking:
        return None
    whys = "; ".join(f"{why} ({n}x)" if n > 1 else why for why, n in Counter(lacking).items())
    return (
        f"energy cost not included: {len(lacking)} of the {len(meeting)} configurations"
        f" meeting the SLO have no GPU energy figure: {whys}"
    )


def _energy_if_priced(c: Candidate, prices: Prices) -> Candidate:
    """Energy figures only where energy is priced: without ``--energy-price`` the output
    is what it was before records held energy."""
    if prices.energy_kwh is not None:
        return c
    return dataclasses.replace(c, mean_power_w=None, energy_absent=None)


def _figure(candidates: Sequence[Candidate], prices: Prices, slo_applied: bool) -> _Figure:
    unit = candidates[0].unit if candidates else "req/s"
    counts = candidates[0].counts if candidates else "requests"
    meeting = [c for c in candidates if c.meets]
    note = _energy_note(meeting, prices)
    energy = prices.energy_kwh is not None and note is None
    if prices.gpu_hour is None and not energy:
        what = "goodput under the SLO" if slo_applied else "throughput (no SLO applied)"
        return _Figure(f"highest {what} ({unit})", None, 1.0, tokens=False, energy_note=note)
    if meeting and all(c.output_tokens_per_s for c in meeting):
        per, tokens, scale = "1M output tokens", True, 1e6
    else:
        per, tokens, scale = f"1k {counts}", False, 1e3
    rate = "output tokens/s" if tokens else unit
    if not energy:
        label = (
            f"lowest cost per {per} at {prices.gpu_hour:g} per machine-hour (on one machine"
            f" the same order as highest {rate})"
        )
        return _Figure(label, per, scale, tokens, energy_note=note)
    machine = f"machine time at {prices.gpu_hour:g} per hour plus " if prices.gpu_hour else ""
    label = f"lowest cost per {per} ({machine}GPU energy at {prices.energy_kwh:g} per kWh)"
    return _Figure(label, per, scale, tokens, energy=True)


def _priced(c: Candidate, figure: _Figure, prices: Prices) -> Candidate:
    if figure.cost_per is None or not c.meets:
        return c
    rate = c.output_tokens_per_s if figure.tokens else c.goodput
    if not rate:
        return c
    machine = prices.gpu_hour / 3600 / rate * figure.scale if prices.gpu_hour else 0.0
    energy = None
    if figure.energy and prices.energy_kwh is not None and c.mean_power_w is not None:
        # joules per unit are the mean power over the rate's window divided by that rate
        energy = c.mean_power_w / rate * figure.scale / J_PER_KWH * prices.energy_kwh
    return dataclasses.replace(
        c, cost=Cost(machine + (energy or 0.0), figure.cost_per, energy=energy)
    )


def _quicker(c: Candidate) -> tuple[float, ...]:
    """Its p99 latencies, TTFT then E2E (a missing one: infinite), to order by."""
    return tuple(math.inf if (v := c.latency(m)) is None else v for m in pareto.METRICS)


def _rank_key(c: Candidate, figure: _Figure) -> tuple[Any, ...]:
    # equal figures are common (an open loop offers every configuration the same requests,
    # and each that keeps up completes them all): the lower p99 latency then leads, so the
    # recommendation is not one another configuration beats on both (a Pareto point)
    tie = (*_quicker(c), c.engine, c.configuration(), c.run_id, c.cell_id)
    if c.meets and figure.energy:
        # energy is not proportional to time: the cheapest, not the fastest, leads
        return (0, c.cost.amount if c.cost is not None else math.inf, *tie)
    if c.meets:
        rate = (c.output_tokens_per_s if figure.tokens else c.goodput) or 0.0
        return (0, -rate, *tie)
    return (1, closeness(c.checks) if c.blocker is None else math.inf, -c.throughput, *tie)


def overlap(u: Candidate, r: Candidate) -> bool | None:
    """Whether the 95 % goodput intervals of ``u`` and ``r`` meet (the difference between
    them may be noise); None where a bound that decides it is missing."""
    below, above = sorted((u, r), key=lambda c: c.goodput or 0.0)
    high, low = (below.goodput_ci95 or (None, None))[1], (above.goodput_ci95 or (None, None))[0]
    if low is None or high is None:
        return None
    return high >= low


def goodput_tie(c: Candidate, best: Candidate) -> bool | None:
    """Whether ``c``'s goodput is within one request over the window of ``best``'s: the
    two differ by less than the count can tell, only in the windows' lengths. None where
    a window is not known."""
    if c.goodput_step is None or best.goodput_step is None:
        return None
    step = max(c.goodput_step, best.goodput_step)
    return abs((c.goodput or 0.0) - (best.goodput or 0.0)) < step * (1 - TIE)


def _settle_goodput_ties(ranked: Sequence[Candidate], figure: _Figure) -> list[Candidate]:
    """Among the configurations meeting the SLO whose goodput is within one request of
    the highest, the lower p99 latency leads: a lead smaller than one request is the
    windows' lengths, not the configurations. Each meeting one is marked ``goodput_tie``
    or not. Energy-priced costs keep their order (energy is not proportional to time)."""
    meeting = [c for c in ranked if c.meets]
    if figure.energy or not meeting:
        return list(ranked)
    best = meeting[0]
    judged = [dataclasses.replace(c, goodput_tie=goodput_tie(c, best)) for c in meeting]
    if judged[0].goodput_tie is None:  # no window to count the best's goodput in
        return list(ranked)
    tied = sorted((c for c in judged if c.goodput_tie), key=_quicker)  # stable: keeps rank
    rest = [c for c in judged if not c.goodput_tie]
    return [*tied, *rest, *ranked[len(meeting) :]]


def beaten(c: Candidate, best: Candidate) -> str:
    """Why ``c``, which meets the SLO, lost to the winner ``best``: how much more it
    costs, or how much lower its goodput is, or on a tie, its higher latency."""
    if c.cost is not None and best.cost is not None:
        if math.isclose(c.cost.amount, best.cost.amount, rel_tol=TIE):
            return f"{_lead(c)} costs what the winner does; {slower(c, best)}"
        said = f"{_lead(c)} costs {fmt_number(c.cost.amount)} per {c.cost.per}"
        difference = cost_difference(c.cost.amount, best.cost.amount)
        return f"{said}, {difference} than the winner{decided_by(c, best)}"
    value, top = c.goodput or 0.0, best.goodput or 0.0
    if math.isclose(value, top, rel_tol=TIE):
        return f"{_lead(c)} {figure_name(c)} {fmt_number(value)} {c.unit} ties; {slower(c, best)}"
    said = f"{_lead(c)} {figure_name(c)} {fmt_number(value)} {c.unit}"
    return f"{said} is {rate_difference(value, top)} than the winner's{decided_by(c, best)}"


def rate_difference(value: float, top: float) -> str:
    """``value`` against ``top``: "x % higher" or "x % lower" (a tie can put a higher
    goodput behind the winner)."""
    if value > top:
        return f"{pct(value / top - 1) if top > 0 else 'inf'} % higher"
    return f"{lower(value, top)} % lower"


def cost_difference(mine: float, theirs: float) -> str:
    """Cost ``mine`` against ``theirs``: "x % more" or "x % less"."""
    if mine < theirs:
        return f"{lower(mine, theirs)} % less"
    return f"{pct(mine / theirs - 1) if theirs > 0 else 'inf'} % more"


def decided_by(c: Candidate, best: Candidate) -> str:
    """What decided between ``c`` and the winner ``best`` beyond their figures: goodputs
    within one request, decided on p99 latency; or ``c`` ahead of the winner on goodput
    yet more than a request behind the highest (whose tie the winner won)."""
    if c.goodput_tie and best.goodput_tie:
        return f", a tie within one request over the window; {slower(c, best)}"
    if c.goodput_tie is False and (c.goodput or 0.0) > (best.goodput or 0.0):
        return (
            ", but more than one request behind the highest goodput, which the winner's"
            " ties (within one request) with a lower p99 latency"
        )
    return ""


def slower(c: Candidate, best: Candidate) -> str:
    """What decided a tie between ``c`` and the winner ``best``: the first p99 latency
    (TTFT, then E2E) that tells them apart, else their names."""
    for metric in pareto.METRICS:
        mine, theirs = c.latency(metric), best.latency(metric)
        if mine is not None and theirs is not None and mine != theirs:
            name = f"{pareto.NAMES[metric]} p99"
            return f"its {name} {duration(mine)} is higher than the winner's {duration(theirs)}"
    return "the tie went to the winner by name and run"


def _lead(c: Candidate) -> str:
    return "no SLO applied;" if c.method == "no SLO" else "meets the SLO but"


def why_missed(c: Candidate) -> str:
    """The blocker (saturated) first, then every SLO missed with its numbers."""
    return "; ".join([*([c.blocker] if c.blocker else []), *(x.text() for x in c.missed)])


def _rank_configurations(ranked: Sequence[Candidate]) -> list[Candidate]:
    """Each measurement marked with its configuration's place: the same configuration
    from several runs is one candidate, placed where its best measurement is, and never
    ranked against itself."""
    places: dict[tuple[object, ...], int] = {}
    for c in ranked:
        places.setdefault(c.identity, len(places) + 1)
    return [dataclasses.replace(c, configuration_rank=places[c.identity]) for c in ranked]


def _runner_up(meeting: Sequence[Candidate]) -> Candidate | None:
    """The best configuration meeting the SLO after the winner's own (its measurements
    in other runs are the winner again, not a runner-up)."""
    if not meeting:
        return None
    return next((c for c in meeting if c.identity != meeting[0].identity), None)


def configurations(candidates: Sequence[Candidate]) -> list[list[Candidate]]:
    """The measurements of each configuration, in rank order (the first one of each is
    its best, and the one it is ranked by)."""
    groups: dict[tuple[object, ...], list[Candidate]] = {}
    for c in candidates:
        groups.setdefault(c.identity, []).append(c)
    return list(groups.values())


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
        return EngineVerdict(engine, best, beaten(best, winner))
    n = len(configurations(own))
    tried = "its only configuration" if n == 1 else f"all {n} configurations"
    what = "the SLO" if any(c.checks for c in own) else "what a recommendation needs"
    return EngineVerdict(engine, best, f"misses {what} in {tried}; closest: {why_missed(best)}")


def _holds(cell: RunCell, metric: str) -> bool:
    """An SLO on ``metric`` applies to the cell's question: the cell is ok, declares the
    latency and measured it."""
    record = cell.record
    if record is None or record.status is not Status.OK:
        return False
    return any(x.name == metric for x in latencies(cell)) and has_metric(record, metric)


def _advise(
    key: tuple[str, str, Params],
    cells: Sequence[RunCell],
    slos: Sequence[SLO],
    prices: Prices,
) -> WorkloadAdvice:
    applied = [s for s in slos if any(_holds(c, s.metric) for c in cells)]
    judged = [j for c in cells for j in judge(c, applied)]
    found = [_energy_if_priced(j, prices) for j in judged if isinstance(j, Candidate)]
    left = tuple(j for j in judged if isinstance(j, NotConsidered))
    figure = _figure(found, prices, bool(applied))
    ranked = sorted((_priced(c, figure, prices) for c in found), key=lambda c: _rank_key(c, figure))
    ranked = _settle_goodput_ties(ranked, figure)
    ranked, fronts = _mark_fronts(ranked)
    ranked = _rank_configurations(ranked)
    meeting = [c for c in ranked if c.meets]
    winner = meeting[0] if meeting else None
    engines = list(dict.fromkeys([*(c.engine for c in ranked), *(n.engine for n in left)]))
    workload, label, scenario = key
    return WorkloadAdvice(
        workload=workload,
        hardware=label,
        scenario=scenario,
        slos_applied=tuple(slo_text(s) for s in applied),
        slos_not_applicable=tuple(slo_text(s) for s in slos if s not in applied),
        ranked_by=figure.label,
        recommended=winner,
        runner_up=_runner_up(meeting),
        engines=tuple(_engine_verdict(e, ranked, left, winner) for e in engines),
        candidates=tuple(ranked),
        not_considered=left,
        energy_note=figure.energy_note,
        fronts=fronts,
    )


def _off_plane(c: Candidate) -> str | None:
    """Why ``c`` is a point of no front: a blocked configuration is no operating point
    whatever its figures, and a rate that is unknown cannot be placed."""
    if c.blocker is not None:
        return f"not an operating point: {c.blocker}"
    if c.pareto_rate is None:
        return (
            "no goodput figure (it misses the SLO; its record cannot recount the requests"
            " that met it)"
        )
    return None


def _point(c: Candidate, metric: str) -> pareto.Point | None:
    rate, latency = c.pareto_rate, c.latency(metric)
    if _off_plane(c) is not None or rate is None or latency is None:
        return None
    return pareto.Point(rate, latency)


def _pareto_absent(c: Candidate, fronts: Sequence[str]) -> str | None:
    off = _off_plane(c)
    if off is not None:
        return off
    if not fronts:
        return "no p99 latency figure"
    missing = [f"no {pareto.NAMES[m]} p99" for m in fronts if c.latency(m) is None]
    return "; ".join(missing) or None


def _mark_fronts(ranked: Sequence[Candidate]) -> tuple[list[Candidate], tuple[str, ...]]:
    """The candidates with the fronts each is Pareto-optimal on (and why it is not a
    point of some), and the fronts: the latencies some placeable configuration has a
    p99 of (both for generative cells, E2E for tensor ones, none for cells that serve
    no requests)."""
    fronts = tuple(m for m in pareto.METRICS if any(_point(c, m) is not None for c in ranked))
    on: list[list[str]] = [[] for _ in ranked]
    for metric in fronts:
        placed = [(i, p) for i, c in enumerate(ranked) if (p := _point(c, metric)) is not None]
        flags = pareto.optimal([p for _, p in placed])
        for (i, _), best in zip(placed, flags, strict=True):
            if best:
                on[i].append(metric)
    marked = [
        dataclasses.replace(c, pareto=tuple(on[i]), pareto_absent=_pareto_absent(c, fronts))
        for i, c in enumerate(ranked)
    ]
    return marked, fronts


def _scenario(cell: RunCell) -> Params:
    """The values of the parameters the workload declares as posing the question, and
    the run's ``--model`` (always part of the question)."""
    found = tuple((k, v) for k, v in cell.params if k in cell.spec.scenario)
    if cell.model is not None and "model" not in dict(cell.params):
        found = (("model", cell.model), *found)
    return found


def slo_text(slo: SLO) -> str:
    return f"{slo.key}<={fmt_number(slo.threshold_s * 1e3)}ms"


def _hardware_groups(cells: Sequence[RunCell]) -> dict[str, tuple[str, list[RunCell]]]:
    """Cells by machine (hardware fingerprint), each with a label; two machines with
    the same short label get a number so they still read apart."""
    groups: dict[str, tuple[str, list[RunCell]]] = {}
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
    cells: Sequence[RunCell],
    slos: Sequence[SLO],
    prices: Prices,
    skipped: Sequence[Damaged] = (),
) -> Recommendation:
    groups = _hardware_groups(cells)
    questions: dict[tuple[str, str, Params], list[RunCell]] = {}
    for label, members in groups.values():
        for cell in members:
            questions.setdefault((cell.workload, label, _scenario(cell)), []).append(cell)
    # a workload's scenarios stay together, in the order the runs planned them
    order = list(dict.fromkeys(c.workload for c in cells))
    keys = sorted(questions, key=lambda k: order.index(k[0]))
    advice = [_advise(k, questions[k], slos, prices) for k in keys]
    return Recommendation(
        slos=tuple(slo_text(s) for s in slos),
        gpu_hour_cost=prices.gpu_hour,
        runs=tuple(runs),
        hardware=tuple(label for label, _ in groups.values()),
        workloads=tuple(advice),
        skipped=tuple(skipped),
        energy_price=prices.energy_kwh,
    )


def recommend(
    run_dirs: Sequence[Path],
    slos: Sequence[SLO],
    gpu_hour_cost: float | None = None,
    *,
    energy_price: float | None = None,
    skip_damaged: bool = False,
) -> Recommendation:
    """The recommendation for ``slos`` from the runs in ``run_dirs`` (a pure function of
    their contents); raises ``RecommendError`` for input it cannot use, damaged or
    foreign records included unless ``skip_damaged`` leaves them out (and lists them).
    ``energy_price`` (per kWh) adds the GPU energy a record measured to its cost."""
    keys = [s.key for s in slos]
    if len(keys) != len(set(keys)):
        raise RecommendError(f"an SLO is given twice: {', '.join(keys)}")
    prices = Prices(gpu_hour_cost, energy_price)  # refused before any run is read
    runs = read_runs(run_dirs, skip_damaged)
    check_slos(slos, [cell for run in runs for cell in cells_of(run)])
    try:
        _, rec = reading.vet(
            runs, lambda rs: _recommend_runs(rs, slos, prices), skip_damaged=skip_damaged
        )
    except RecordError as exc:
        raise RecommendError(f"cannot recommend from these runs: {exc}") from exc
    return rec


def _recommend_runs(
    runs: Sequence[RunContents], slos: Sequence[SLO], prices: Prices
) -> Recommendation:
    infos = [RunInfo(str(r.path), r.manifest.run_id, r.state) for r in runs]
    cells = [cell for run in runs for cell in cells_of(run)]
    skipped = tuple(d for r in runs for d in r.skipped)
    return recommend_cells(infos, cells, slos, prices, skipped)
