"""The result matrix for a terminal: plain text laid out in rich tables.

matrix.md escapes what it shows for Markdown (``&lt;``, ``\\[``) and the HTML page for
HTML; a terminal shows text as it is, so this renders the same matrix
(harness.report.matrix: the same entries, notes and warnings, worded once) without any
escaping, and without colour or terminal codes, so a CI log reads the same. rich is
given ``Text`` objects only: nothing an engine wrote (an error message with ``[...]`` or
``:name:``) is read as markup or an emoji code.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from harness.report import matrix as mx
from harness.results.reading import RunContents, read_run_dir, vet

DEFAULT_WIDTH = 100
MIN_WIDTH = 40
"""Narrower than this a table is no longer readable: the text is laid out this wide."""
UNBOUNDED = 1_000_000


def render(matrix: mx.Matrix, width: int = DEFAULT_WIDTH) -> str:
    """The matrix as plain text ``width`` columns wide (long entries wrap inside their
    column); the same matrix gives the same text."""
    console = Console(
        file=io.StringIO(),
        width=max(MIN_WIDTH, width),
        color_system=None,
        force_terminal=False,
        force_jupyter=False,
        highlight=False,
        markup=False,
        emoji=False,
        legacy_windows=False,
        soft_wrap=False,
    )
    console.print(Text(f"Result matrix: run {matrix.run_id}"))
    for note in mx.notes(matrix):
        console.print(Text(note))
    console.print()
    for workload in matrix.workloads():
        rows = [r for r in matrix.rows if r.workload == workload]
        console.print(_table(console, workload, rows, matrix.engines))
    _listing(console, "Warnings", "(!)", [f"{c}: {why}" for c, why in mx.warnings(matrix)])
    if matrix.skipped:
        console.print(Text(f"{mx.SKIPPED_HEADING}: {mx.SKIPPED_NOTE}"))
        _listing(console, "", "-", [f"{d.path}: {d.why}" for d in matrix.skipped])
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return "\n".join(line.rstrip() for line in out.splitlines()) + "\n"


def _table(
    console: Console, workload: str, rows: Sequence[mx.Row], engines: tuple[str, ...]
) -> Table:
    header, body = mx.table_rows(rows, engines)
    table = Table(title=Text(workload), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    params = len(header) - len({e for r in rows for e in r.entries})
    for i, name in enumerate(header):
        # parameters stay whole; the engines' entries wrap
        table.add_column(Text(name), no_wrap=i < params, overflow="fold")
    for cells in body:
        table.add_row(*(Text(c) for c in cells))
    # where entries wrap, a blank line between rows keeps the lines of one apart
    unbounded = console.options.update(max_width=UNBOUNDED)
    table.show_lines = Measurement.get(console, unbounded, table).maximum > console.width
    return table


def _listing(console: Console, heading: str, mark: str, lines: Sequence[str]) -> None:
    """``lines`` under ``heading``, each after ``mark``, wrapped lines indented below it."""
    if not lines:
        return
    if heading:
        console.print(Text(heading))
    grid = Table.grid(padding=(0, 1), pad_edge=False)
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for line in lines:
        grid.add_row(Text(f"  {mark}"), Text(line))
    console.print(grid)


def terminal_table(run_dir: Path, width: int = DEFAULT_WIDTH, *, skip_damaged: bool = False) -> str:
    """The matrix of ``run_dir`` for a terminal ``width`` columns wide: what matrix.md
    says, as plain text. Raises as ``matrix.publish_run`` does (RecordError for a run
    that cannot be reported, OSError for one that cannot be read)."""

    def text(runs: Sequence[RunContents]) -> str:
        [run] = runs
        return render(mx.build(run.manifest, run.records, run.state, run.skipped), width)

    run = read_run_dir(run_dir, skip_damaged=skip_damaged)
    return vet([run], text, skip_damaged=skip_damaged)[1]
