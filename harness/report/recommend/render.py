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
from harness.report.recommend.model import (
    EXIT_OK,
    METHODS,
    Candidate,
    NotConsidered,
    Recommendation,
    WorkloadAdvice,
    figure_name,
    param_text,
)
from harness.report.recommend.ranking import (
    TIE,
    beaten,
    cost_difference,
    decided_by,
    overlap,
    rate_difference,
    slower,
    why_missed,
)
from harness.results import reading

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


def named(c: Candidate, several_runs: bool) -> str:
    """Engine, configuration and (when several runs are read) which run."""
    run = f" [run {c.run_id}]" if several_runs else ""
    return f"{c.engine} {c.configuration()}{run}"


def _render_workload(w: WorkloadAdvice, several_machines: bool, several_runs: bool) -> list[str]:
    where = f" on {w.hardware}" if several_machines else ""
    lines = [f"== {w.title}{where} =="]
    if w.candidates:
        lines += _render_slos(w)
        lines.append(f"ranked by: {w.ranked_by}")
    if w.energy_note is not None:
        lines.append(w.energy_note)
    lines += _render_pick(w, several_runs)
    lines += _render_engines(w, several_runs)
    lines += _render_all(w, several_runs)
    lines += _render_left_out(w.not_considered)
    return [*lines, ""]


def _render_left_out(left: Sequence[NotConsidered]) -> list[str]:
    """Cells left out, those of one engine with the same status and reasons together."""
    groups: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    for n in left:
        groups.setdefault((n.engine, n.status, n.reasons), []).append(param_text(n.params))
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
    lines = [f"RECOMMENDED: {named(r, several_runs)}: {describe(r)}"]
    lines.append(f"  method: {METHODS[r.method]}")
    if r.warnings:
        lines.append(f"  (!) warnings: {'; '.join(r.warnings)}")
    u = w.runner_up
    if u is None:
        other = "meets the SLO" if w.slos_applied else "is valid"
        return [*lines, f"runner-up: none (no other configuration {other})"]
    return [*lines, f"runner-up: {named(u, several_runs)}: {describe(u)} ({gap(u, r)})"]


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
        who = named(v.best, several_runs) if v.best else v.engine
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
    if len(w.candidates) < 2:  # one candidate is already shown above
        return []
    lines = ["all configurations (best first):"]
    for i, c in enumerate(w.candidates, start=1):
        said = verdict(c, w.recommended)
        if c.meets:
            said = describe(c) + ("" if c is w.recommended else f"; {said}")
        lines.append(f"  {i}. {named(c, several_runs)}: {said}{pareto_mark(c, w.fronts)}")
    return [*lines, _fronts_line(w)]


def _fronts_line(w: WorkloadAdvice) -> str:
    if not w.fronts:
        return "Pareto fronts: none (no configuration has both a rate and a p99 latency figure)"
    rate = "goodput" if w.slos_applied else "throughput"
    planes = " and ".join(f"{rate} vs {pareto.NAMES[m]} p99" for m in w.fronts)
    return (
        f"Pareto fronts: {planes}; [Pareto: ...] marks a configuration no other beats on"
        " both (at least its rate and at most its p99, one of them strictly)"
    )


def render(rec: Recommendation) -> str:
    """The recommendation as text; the same input gives the same bytes."""
    cost = f"; machine cost {rec.gpu_hour_cost:g} per hour" if rec.gpu_hour_cost else ""
    if rec.energy_price:
        cost += f"; GPU energy {rec.energy_price:g} per kWh"
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
            if f.metadata.get("json") is False or (
                f.metadata.get("json") == "if set" and item is None
            ):
                continue
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
