"""The comparison for people (a table and one summary line) and for programs (JSON)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.report.compare.comparison import Comparison, MetricComparison, within_run_only
from harness.report.matrix import fmt_number
from harness.results import reading


def to_json(comparison: Comparison) -> bytes:
    """Stable bytes: the same comparison always serializes the same way."""
    return (comparison.model_dump_json(indent=1) + "\n").encode()


_STYLE = {"regression": "red", "improvement": "green", "not comparable": "yellow"}


def _pct(value: float) -> str:
    return f"{value * 100:+.1f}%"


def _value(value: float | None, unit: str) -> str:
    return "n/a" if value is None else f"{fmt_number(value)} {unit}".strip()


def _figure_row(m: MetricComparison) -> list[str]:
    verdict = escape(m.verdict)
    if m.outcome in _STYLE:
        verdict = f"[{_STYLE[m.outcome]}]{verdict}[/]"
    return [
        escape(m.label),
        escape(_value(m.base, m.unit)),
        escape(_value(m.new, m.unit)),
        "" if m.change is None else _pct(m.change),
        "" if m.ci95 is None else f"[{_pct(m.ci95[0])}, {_pct(m.ci95[1])}]",
        "" if m.p_adjusted is None else f"{m.p_adjusted:.2g}",
        verdict,
    ]


def _table(comparison: Comparison) -> Table:
    table = Table(title=f"{comparison.base_run} (BASE) -> {comparison.new_run} (NEW)")
    for col in ("cell", "metric", "base", "new", "change", "95% CI", "adj. p", "verdict"):
        table.add_column(col)
    for cell in comparison.cells:
        if not cell.metrics:
            style = "red" if cell.outcome == "status regression" else "yellow"
            note = f"{cell.outcome}: {cell.note}" if cell.note else cell.outcome
            table.add_row(
                escape(cell.cell_id), "", "", "", "", "", "", f"[{style}]{escape(note)}[/]"
            )
        for i, m in enumerate(cell.metrics):
            table.add_row(escape(cell.cell_id) if i == 0 else "", *_figure_row(m))
        table.add_section()
    return table


def _summary(c: Comparison) -> str:
    figures = [m for cell in c.cells for m in cell.metrics]
    outcomes = ("regression", "improvement", "no change", "not tested", "not comparable")
    count = {o: sum(m.outcome == o for m in figures) for o in outcomes}
    compared = sum(bool(cell.metrics) for cell in c.cells)
    status = sum(cell.outcome == "status regression" for cell in c.cells)
    unjudged = sum(cell.outcome == "not comparable" for cell in c.cells)
    bases = sorted({m.basis for m in figures if m.basis is not None})
    return (
        f"{compared} cell(s) compared, {status} status regression(s), {unjudged} cell(s)"
        f" not comparable; figures: {count['regression']} regression(s),"
        f" {count['improvement']} improvement(s), {count['no change']} no significant"
        f" change, {count['not comparable']} not comparable, {count['not tested']} not"
        f" tested (threshold {c.threshold * 100:g}%, alpha {c.alpha:g}, Holm-adjusted;"
        f" judged on: {', '.join(bases) or 'nothing'}). exit {c.exit_code}: {c.reason}"
    )


def _within_run_lines(c: Comparison) -> list[str]:
    found = within_run_only(c.cells)
    if not found:
        return []
    gate = (
        "they fail this comparison (--fail-within-run)"
        if c.fail_within_run
        else "they do not fail it (--fail-within-run would)"
    )
    head = (
        f"{len(found)} significant change(s) judged within one run only: the requests of one"
        " run share its machine state, so a test on them overstates significance between"
        f" runs; run both with --repeats N (N >= 3) to judge them between runs; {gate}:"
    )
    return [head, *(f"  {line}" for line in found)]


def render(comparison: Comparison, console: Console) -> None:
    """The comparison as a table and a summary line, for people."""
    for line in comparison.accepted_env_differences:
        console.print(f"accepted environment difference: {escape(line)}", highlight=False)
    for line in reading.skipped_lines(comparison.skipped):
        console.print(escape(line), highlight=False, soft_wrap=True)
    if comparison.problems:
        console.print("[red]cannot compare (fails closed):[/red]")
        for problem in comparison.problems:
            console.print(f"  - {escape(problem)}", highlight=False)
    if comparison.cells:
        console.print(_table(comparison))
    for line in _within_run_lines(comparison):
        console.print(escape(line), highlight=False, soft_wrap=True)
    for regression in comparison.regressions:
        console.print(f"[red]regression:[/red] {escape(regression)}", soft_wrap=True)
    # one line however long: scripts and CI logs grep it
    console.print(escape(_summary(comparison)), highlight=False, soft_wrap=True)
