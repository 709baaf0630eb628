"""The recommendation for people (text) and for programs (JSON); the same input gives
the same bytes."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.report import pareto
from harness.report.matrix import fmt_number
from harness.report.recommend.ranking import (
    TIE,
    beaten,
    configurations,
    cost_difference,
    decided_by,
    overlap,
    rate_difference,
    slower,
    why_missed,
)
from harness.report.recommend.verdicts import (
    EXIT_OK,
    METHODS,
    Candidate,
    NotConsidered,
    Recommendation,
    WorkloadAdvice,
    figure_name,
    param_text,
)
from harness.results import reading

SCHEMA_VERSION = 2
"""Of ``recommend --json``. 2: each candidate's ``configuration_rank`` (the measurements
of one configuration from several runs share it), ``runner_up`` the best other
configuration (before, the winner's own measurement in another run could be it), a
second path's ``configuration`` named by what it measured; 1 (no field): before."""

# --------------------------------------------------------------------------- output


def describe(c: Candidate) -> str:
    """The candidate's figures: goodput (or throughput), tokens/s, cost, SLOs met."""
    rate = c.goodput if c.goodput is not None else c.throughput
    parts = [f"{figure_name(c)} {fmt_number(rate)} {c.unit}{ci_text(c.goodput_ci95)}"]
    if c.output_tokens_per_s is not None:
        parts.append(f"{fmt_number(c.output_tokens_per_s)} output tokens/s")
    if c.cost is not None:
        energy = c.cost.energy
        share = f" ({fmt_number(energy)} of it GPU energy)" if energy is not None else ""
        parts.append(f"{fmt_number(c.cost.amount)} per {c.cost.per}{share}")
    met = [x.text() for x in c.checks if x.met]
    if met:
        parts.append("; ".join(met))
    return ", ".join(parts)


def ci_text(ci: tuple[float | None, float | None] | None) -> str:
    if ci is None:
        return ""
    lo, hi = ("?" if v is None else fmt_number(v) for v in ci)
    return f" [95% {lo}, {hi}]"


def named(c: Candidate, several_runs: bool, among: Sequence[Candidate] = ()) -> str:
    """Engine, configuration and (when several runs are read) which run; its run's
    engine options too where another configuration ``among`` its question's would
    read the same without them (runs made with other ``--engine-opt``)."""
    run = f" [run {c.run_id}]" if several_runs else ""
    name = f"{c.engine} {c.configuration()}"
    alike = any(
        (x.engine, x.configuration()) == (c.engine, c.configuration()) and x.identity != c.identity
        for x in among
    )
    options = f" ({c.options_text() or 'no --engine-opt'})" if alike else ""
    return f"{name}{options}{run}"


def brief(c: Candidate) -> str:
    """One measurement in short: its rate, what blocks it, each SLO with its value."""
    rate = c.goodput if c.goodput is not None else c.throughput
    blocker = [c.blocker] if c.blocker else []
    return ", ".join(
        [f"{figure_name(c)} {fmt_number(rate)} {c.unit}", *blocker, *(x.text() for x in c.checks)]
    )


def repeats(w: WorkloadAdvice, c: Candidate) -> list[Candidate]:
    """The other measurements of ``c``'s configuration (other runs, or repeats)."""
    return [x for x in w.candidates if x.identity == c.identity and x is not c]


def _times(n: int) -> str:
    return "twice" if n == 2 else f"{n} times"


def also(others: Sequence[Candidate]) -> str:
    """What other runs measured of a configuration, to follow its best measurement."""
    return "".join(f"; also measured in run {x.run_id}: {brief(x)}" for x in others)


def why_none(w: WorkloadAdvice) -> str:
    if not w.candidates:
        return "no valid cell to recommend from"
    return "no valid cell meets the SLO" if w.slos_applied else "no valid cell can be recommended"


# --------------------------------------------------------------------------- the lead


def _decision(w: WorkloadAdvice, where: str) -> str:
    """A question's answer in one line: what to run, or that nothing can be."""
    r = w.recommended
    if r is None:
        return f"  {w.title}{where}: NO RECOMMENDATION: {why_none(w)}"
    figures = [f"{figure_name(r)} {fmt_number(r.goodput or 0.0)} {r.unit}"]
    if r.cost is not None:
        figures.append(f"{fmt_number(r.cost.amount)} per {r.cost.per}")
    n = 1 + len(repeats(w, r))
    if n > 1:
        figures.append(f"measured {_times(n)}")
    return f"  {w.title}{where}: {named(r, False, w.candidates)} ({', '.join(figures)})"


def _decisions(rec: Recommendation, several_machines: bool) -> list[str]:
    answered = [w for w in rec.workloads if w.candidates]
    if not answered:
        return []
    lines = ["decisions (each explained below):"]
    lines += [_decision(w, _where(w, several_machines)) for w in answered]
    return lines


def _where(w: WorkloadAdvice, several_machines: bool) -> str:
    return f" on {w.hardware}" if several_machines else ""


def _no_answer(rec: Recommendation, several_machines: bool) -> list[str]:
    """Questions with no valid cell at all, one line per workload (and machine): what
    happened to its cells and why, each cause once however many cells and runs share it."""
    groups: dict[tuple[str, str], list[WorkloadAdvice]] = {}
    for w in rec.workloads:
        if not w.candidates:
            groups.setdefault((w.workload, w.hardware), []).append(w)
    if not groups:
        return []
    answered = {(w.workload, w.hardware) for w in rec.workloads if w.candidates}
    lines = ["no answer (no valid cell was measured):"]
    for (workload, hardware), questions in groups.items():
        # the workload's name says it all unless some of its questions have an answer
        some = (workload, hardware) in answered
        label = ", ".join(w.title for w in questions) if some else workload
        where = f" on {hardware}" if several_machines else ""
        left = [n for w in questions for n in w.not_considered]
        lines.append(f"  {label}{where}: {_left_out_summary(left)}")
    return lines


def _left_out_summary(left: Sequence[NotConsidered]) -> str:
    """What happened to cells left out: each status and cause once, with the engines,
    how many cells and how many runs share it."""
    groups: dict[tuple[str, tuple[str, ...]], tuple[dict[str, None], set[str], set[str]]] = {}
    for n in left:
        engines, cells, runs = groups.setdefault((n.status, n.reasons), ({}, set(), set()))
        engines[n.engine] = None
        cells.add(f"{n.engine} {param_text(n.params)}")
        runs.add(n.run_id)
    parts = []
    for (status, reasons), (engines, cells, runs) in groups.items():
        count = f"{len(cells)} cell{'' if len(cells) == 1 else 's'}"
        count += f" in {len(runs)} runs" if len(runs) > 1 else ""
        parts.append(f"{', '.join(engines)} {status} ({count}): {'; '.join(reasons)}")
    return " | ".join(parts)


# --------------------------------------------------------------------------- the details


def _render_workload(w: WorkloadAdvice, several_machines: bool, several_runs: bool) -> list[str]:
    lines = [f"== {w.title}{_where(w, several_machines)} =="]
    lines += _render_slos(w)
    lines.append(f"ranked by: {w.ranked_by}")
    if w.energy_note is not None:
        lines.append(w.energy_note)
    lines += _render_pick(w, several_runs)
    if len(w.engines) > 1:  # with one engine its best is the pick (or the closest) above
        lines += _render_engines(w, several_runs)
    lines += _render_all(w, several_runs)
    lines += _render_left_out(w)
    return [*lines, ""]


def _render_left_out(w: WorkloadAdvice) -> list[str]:
    """Cells left out, those of one engine with the same status and reasons together,
    named by their configuration (the question's scenario is in its title), each once
    however many runs have it."""
    asked = {k for k, _ in w.scenario}
    groups: dict[tuple[str, str, tuple[str, ...]], tuple[dict[str, None], set[str]]] = {}
    for n in w.not_considered:
        configs, runs = groups.setdefault((n.engine, n.status, n.reasons), ({}, set()))
        configs[param_text(tuple((k, v) for k, v in n.params if k not in asked))] = None
        runs.add(n.run_id)
    lines = ["not considered:"] if groups else []
    for (engine, status, reasons), (configs, runs) in groups.items():
        listed = list(configs)
        named = f"{engine} {listed[0]}".strip()
        if len(listed) > 1:
            named = f"{engine} ({len(listed)} cells: {', '.join(listed)})"
        in_runs = f" (in {len(runs)} runs)" if len(runs) > 1 else ""
        lines.append(f"  {named}: {status}{in_runs}: {'; '.join(reasons)}")
    return lines


def _render_slos(w: WorkloadAdvice) -> list[str]:
    if not w.slos_applied and not w.slos_not_applicable:
        return ["no SLO given: ranked by throughput"]
    if not w.slos_applied:
        return ["no SLO applied: none of the given SLOs is measured by this workload"]
    line = f"SLOs applied: {', '.join(w.slos_applied)}"
    if w.slos_not_applicable:
        line += f" (not measured here: {', '.join(w.slos_not_applicable)})"
    return [line]


def _render_pick(w: WorkloadAdvice, several_runs: bool) -> list[str]:
    r = w.recommended
    if r is None:
        lines = [f"NO RECOMMENDATION: {why_none(w)}"]
        if len(configurations(w.candidates)) == 1:  # else the list below has them all
            closest = w.candidates[0]
            name = named(closest, several_runs, w.candidates)
            lines.append(f"closest: {name}: {brief(closest)}")
            lines += [f"  also measured in run {x.run_id}: {brief(x)}" for x in repeats(w, closest)]
        return lines
    lines = [f"RECOMMENDED: {named(r, several_runs, w.candidates)}: {describe(r)}"]
    lines += [f"  also measured in run {x.run_id}: {brief(x)}" for x in repeats(w, r)]
    lines.append(f"  method: {METHODS[r.method]}")
    if r.warnings:
        lines.append(f"  (!) warnings: {'; '.join(r.warnings)}")
    u = w.runner_up
    if u is None:
        other = "meets the SLO" if w.slos_applied else "is valid"
        return [*lines, f"runner-up: none (no other configuration {other})"]
    who = named(u, several_runs, w.candidates)
    return [*lines, f"runner-up: {who}: {describe(u)} ({gap(u, r)})"]


def gap(u: Candidate, r: Candidate) -> str:
    """How far behind the runner-up is, and whether the two are told apart at all."""
    said = margin(u, r)
    if overlap(u, r):
        said += "; their 95% intervals overlap: the difference may be noise"
    return said


def margin(u: Candidate, r: Candidate) -> str:
    """How far ``u`` is behind ``r``: how much more it costs, or how much lower its
    goodput (throughput) is; on a tie, or goodputs within noise, what decided it."""
    if u.cost is not None and r.cost is not None and r.cost.amount > 0:
        if math.isclose(u.cost.amount, r.cost.amount, rel_tol=TIE):
            return f"the same cost; {slower(u, r)}"
        return f"costs {cost_difference(u.cost.amount, r.cost.amount)}{decided_by(u, r)}"
    if math.isclose(u.goodput or 0.0, r.goodput or 0.0, rel_tol=TIE):
        return f"the same {figure_name(u)}; {slower(u, r)}"
    value, top = u.goodput or 0.0, r.goodput or 0.0
    return f"{rate_difference(value, top)} {figure_name(u)}{decided_by(u, r)}"


def _render_engines(w: WorkloadAdvice, several_runs: bool) -> list[str]:
    lines = ["by engine (best configuration of each):"]
    for v in w.engines:
        who = named(v.best, several_runs, w.candidates) if v.best else v.engine
        lines.append(f"  {who}: {v.verdict}")
    return lines


def verdict(c: Candidate, winner: Candidate | None) -> str:
    """Why ``c`` is or is not the recommendation: the winner is recommended, one that
    meets the SLO lost on goodput or cost, any other misses what a recommendation needs."""
    if c is winner:
        return "recommended"
    if c.meets and winner is not None:
        return f"lost: {beaten(c, winner)}"
    return f"not recommended: {why_missed(c)}"


def pareto_mark(c: Candidate, fronts: Sequence[str]) -> str:
    """``[Pareto: TTFT, E2E]``: the fronts it is optimal on; and why it is no point of a
    front where it is not (no p99 of that latency, no goodput figure, a blocker). Empty
    for a question without fronts (said once, below its list)."""
    if not fronts:
        return ""
    placed = c.blocker is None and c.pareto_rate is not None
    if not placed or all(c.latency(m) is None for m in fronts):
        return f" [no Pareto point: {c.pareto_absent}]"
    absent = f"; {c.pareto_absent}" if c.pareto_absent else ""
    if c.pareto:
        return f" [Pareto: {', '.join(pareto.NAMES[m] for m in c.pareto)}{absent}]"
    return f" [not Pareto-optimal{absent}]" if absent else ""


def _render_all(w: WorkloadAdvice, several_runs: bool) -> list[str]:
    """Every configuration, best first, each once: its best measurement (the one it is
    ranked by), then what its other runs measured."""
    groups = configurations(w.candidates)
    if len(groups) < 2:  # one configuration is already shown above
        return []
    lines = ["all configurations (best first):"]
    for i, (c, *others) in enumerate(groups, start=1):
        said = verdict(c, w.recommended)
        if c.meets:
            said = describe(c) + ("" if c is w.recommended else f"; {said}")
        mark = pareto_mark(c, w.fronts)
        who = named(c, several_runs, w.candidates)
        lines.append(f"  {i}. {who}: {said}{mark}{also(others)}")
    return [*lines, *_fronts_line(w)]


def _fronts_line(w: WorkloadAdvice) -> list[str]:
    """The Pareto planes of the question (none where no configuration has both a rate
    and a p99 latency: its list then has no marks)."""
    if not w.fronts:
        return []
    rate = "goodput" if w.slos_applied else "throughput"
    return [f"Pareto fronts: {' and '.join(f'{rate} vs {pareto.NAMES[m]} p99' for m in w.fronts)}"]


PARETO_LEGEND = (
    "[Pareto: ...] marks a configuration no other of its question beats on both its rate"
    " and that p99 latency (at least its rate and at most its p99, one of them strictly)"
)


def render(rec: Recommendation) -> str:
    """The recommendation as text, the decisions first; the same input gives the same
    bytes."""
    cost = f"; machine cost {rec.gpu_hour_cost:g} per hour" if rec.gpu_hour_cost else ""
    if rec.energy_price:
        cost += f"; GPU energy {rec.energy_price:g} per kWh"
    lines = [f"Recommendation for SLO {', '.join(rec.slos) or '(none)'}{cost}"]
    lines += reading.skipped_lines(rec.skipped)
    several = len(rec.hardware) > 1
    if several:
        lines.append(
            f"cells come from {len(rec.hardware)} different machines; each machine is"
            f" recommended separately, never mixed: {' | '.join(rec.hardware)}"
        )
    else:
        lines.append(f"machine: {rec.hardware[0] if rec.hardware else 'unknown hardware'}")
    if len(rec.runs) > 1:
        lines.append(
            f"{len(rec.runs)} runs (listed at the end): a configuration several of them"
            " measured is one candidate, ranked on its best measurement, the others beside it"
        )
    lines += ["", *_decisions(rec, several), *_no_answer(rec, several), ""]
    if any(w.fronts for w in rec.workloads if w.candidates):
        lines += [PARETO_LEGEND, ""]
    for w in rec.workloads:
        if w.candidates:
            lines += _render_workload(w, several, len(rec.runs) > 1)
    for run in rec.runs:
        state = "" if run.state == "complete" else f" (run is {run.state}: cells may be missing)"
        lines.append(f"run {run.run_id}: {run.path}{state}")
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
            if f.metadata.get("json") is False or (
                f.metadata.get("json") == "if set" and item is None
            ):
                continue
            pairs = f.name in ("params", "scenario", "engine_options")
            out[f.name] = _plain(dict(item) if pairs and item is not None else item)
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
    data = {"schema_version": SCHEMA_VERSION, **_plain(rec)}
    data |= {"exit_code": rec.exit_code, "methods": METHODS}
    return (json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode()
