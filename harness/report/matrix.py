"""The result matrix: a pure function of a run's manifest and records.

Rows are workload cells (in the order the run planned them), columns are engines,
each entry the cell's headline figures when it is ok and its status otherwise (never
numbers for a cell that is not ok). Building twice gives identical bytes. The run
directory is read through harness.results.reading: damaged or foreign records are refused, or
with ``skip_damaged`` left out and listed under "Skipped damaged files".
"""

from __future__ import annotations

import csv
import html
import io
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.exceptions import WriteError
from harness.results.reading import Damaged, RunContents, read_run_dir, vet
from harness.results.records import CellRecord, Manifest, ParamValue, Status, format_param
from harness.results.store import replace


@dataclass(frozen=True)
class Entry:
    """One matrix entry: a record, or a planned cell that never produced one."""

    engine: str
    record: CellRecord | None

    @property
    def status(self) -> str:
        return self.record.status.value if self.record else "missing"


@dataclass(frozen=True)
class Row:
    workload: str
    params: tuple[tuple[str, ParamValue], ...]
    entries: dict[str, Entry]


@dataclass(frozen=True)
class Matrix:
    run_id: str
    state: str
    engines: tuple[str, ...]
    rows: tuple[Row, ...]
    skipped: tuple[Damaged, ...] = ()
    """Damaged files left out (``--skip-damaged``), listed with the matrix."""
    repeats: int = 1
    """How many times the run measured each cell (``--repeats``)."""

    def workloads(self) -> list[str]:
        return list(dict.fromkeys(r.workload for r in self.rows))


def build(
    manifest: Manifest,
    records: Iterable[CellRecord],
    state: str | None = None,
    skipped: Sequence[Damaged] = (),
) -> Matrix:
    """The matrix of the planned cells; ``state`` is the state to show (default: the
    manifest's). A record of a cell that is not planned has no row: the reader refuses
    such records as planted (harness.results.reading)."""
    by_id = {r.cell_id: r for r in records}
    rows: dict[tuple[str, tuple[tuple[str, ParamValue], ...]], dict[str, Entry]] = {}
    for c in manifest.planned:
        key = (c.workload, tuple(c.params.items()))
        rows.setdefault(key, {})[c.engine] = Entry(c.engine, by_id.get(c.cell_id))
    engines = tuple(dict.fromkeys(e for entries in rows.values() for e in entries))
    return Matrix(
        run_id=manifest.run_id,
        state=manifest.state if state is None else state,
        engines=engines,
        rows=tuple(Row(w, p, e) for (w, p), e in rows.items()),
        skipped=tuple(skipped),
        repeats=_repeats(manifest),
    )


def _repeats(manifest: Manifest) -> int:
    value = manifest.settings.get("repeats", 1)
    return value if isinstance(value, int) and value >= 1 else 1


def fmt_number(value: float) -> str:
    """Three significant figures or so; whole numbers stay whole, large ones get k/M.
    NaN and infinities are shown as words: a figure can legitimately be either."""
    if not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    a = abs(value)
    for limit, unit, suffix in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if a >= limit:
            return f"{value / unit:.3g}{suffix}"
    if value == int(value):
        return str(int(value))
    decimals = next((d for limit, d in ((100, 0), (10, 1), (0.01, 2)) if a >= limit), None)
    return f"{value:.3g}" if decimals is None else f"{value:.{decimals}f}"


def _as_float(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if value in ("Infinity", "inf"):
        return math.inf
    return None


def headline_values(record: CellRecord) -> list[tuple[str, str, float | None]]:
    out: list[tuple[str, str, float | None]] = []
    for h in record.headline:
        raw = _as_float(record.metric(h.metric))
        out.append((h.label, h.unit, None if raw is None else raw * h.scale))
    return out


Bounds = tuple[float | None, float | None]


def headline_cis(record: CellRecord) -> list[Bounds | None]:
    """Each headline figure's scaled 95% interval (None: it has none; a None bound: the
    data could not bound that side)."""
    out: list[Bounds | None] = []
    for h in record.headline:
        pair = record.metric(h.ci) if h.ci else None
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            out.append(None)
            continue
        lo, hi = (_as_float(v) for v in pair)
        out.append((None if lo is None else lo * h.scale, None if hi is None else hi * h.scale))
    return out


def ci_text(bounds: Bounds | None) -> str:
    if bounds is None:
        return ""
    lo, hi = ("?" if v is None else fmt_number(v) for v in bounds)
    return f" [{lo}, {hi}]"


def _escape_md(text: str) -> str:
    """Engine-provided text (error messages, names) rendered inert: no HTML, no table
    breaks, no Markdown links or emphasis."""
    text = html.escape(text, quote=False).replace("\n", " ")
    return re.sub(r"([\\|`*_\[\]])", r"\\\1", text)


def _csv_text(text: str) -> str:
    """A spreadsheet runs a cell starting with = + - @ as a formula; numbers stay numbers."""
    if text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        try:
            float(text)
        except ValueError:
            return "'" + text
    return text


def entry_text(entry: Entry | None) -> str:
    if entry is None:
        return ""
    rec = entry.record
    if rec is None:
        return "MISSING (no record: interrupted?)"
    if rec.status is not Status.OK:
        why = "; ".join(rec.reasons)
        return f"{rec.status.value.upper()}: {why}" if why else rec.status.value.upper()
    parts = []
    for (label, unit, value), ci in zip(headline_values(rec), headline_cis(rec), strict=True):
        shown = "n/a" if value is None else f"{fmt_number(value)}{ci_text(ci)} {unit}"
        parts.append(f"{label} {shown}".strip())
    warn = " (!)" if rec.validity and rec.validity.warnings else ""
    return " · ".join(parts) + warn


def param_names(rows: Iterable[Row]) -> list[str]:
    return list(dict.fromkeys(k for r in rows for k, _ in r.params))


def _plain(text: str) -> str:
    return text


def notes(
    matrix: Matrix, strong: Callable[[str], str] = _plain, code: Callable[[str], str] = _plain
) -> list[str]:
    """What the matrix says before its tables (a run not complete, files left out,
    repeats), worded once for every medium: ``strong`` and ``code`` mark its emphasis
    and its command in that medium's syntax."""
    out = []
    if matrix.state != "complete":
        out.append(strong(f"Run is {matrix.state}: some planned cells have no record."))
    if matrix.skipped:
        n = len(matrix.skipped)
        out.append(strong(f"{n} damaged file(s) left out: see Skipped damaged files."))
    if matrix.repeats > 1:
        out.append(
            f"Each cell was measured {matrix.repeats} times (--repeats), each time in a fresh"
            " worker process; an entry shows one repeat: the first, or the first that went"
            f" worst. {code('python -m harness compare')} judges changes on all of them."
        )
    return out


SKIPPED_HEADING = "Skipped damaged files"
SKIPPED_NOTE = "Left out with --skip-damaged; nothing in them is in the matrix above."


def table_rows(rows: Sequence[Row], engines: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """One workload's table as plain text: its header (parameters, then the engines that
    have a cell in it) and a row of cells per parameter combination."""
    names = param_names(rows)
    used = [e for e in engines if any(e in r.entries for r in rows)]
    body = []
    for row in rows:
        params = dict(row.params)
        cells = [format_param(params.get(n)) for n in names]
        body.append(cells + [entry_text(row.entries.get(e)) for e in used])
    return [*names, *used], body


def warnings(matrix: Matrix) -> list[tuple[str, str]]:
    """(cell id, its warnings) of each ok cell that has some, as plain text."""
    found = []
    for row in matrix.rows:
        for engine in matrix.engines:
            entry = row.entries.get(engine)
            rec = entry.record if entry else None
            if rec and rec.status is Status.OK and rec.validity and rec.validity.warnings:
                found.append((rec.cell_id, "; ".join(rec.validity.warnings)))
    return found


def to_markdown(matrix: Matrix) -> str:
    lines = [f"# Result matrix: run {matrix.run_id}", ""]
    for note in notes(matrix, strong=lambda s: f"**{s}**", code=lambda s: f"`{s}`"):
        lines += [note, ""]
    for workload in matrix.workloads():
        rows = [r for r in matrix.rows if r.workload == workload]
        lines += _workload_table(workload, rows, matrix.engines)
    lines += _warnings(matrix)
    lines += _skipped(matrix.skipped)
    return "\n".join(lines).rstrip() + "\n"


def _skipped(skipped: Sequence[Damaged]) -> list[str]:
    if not skipped:
        return []
    listed = [f"- {_escape_md(str(d.path))}: {_escape_md(d.why)}" for d in skipped]
    return [f"## {SKIPPED_HEADING}", "", SKIPPED_NOTE, "", *listed, ""]


def _workload_table(workload: str, rows: list[Row], engines: tuple[str, ...]) -> list[str]:
    header, body = table_rows(rows, engines)
    out = [f"## {workload}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_escape_md(c) for c in cells) + " |" for cells in body]
    return [*out, ""]


def _warnings(matrix: Matrix) -> list[str]:
    found = [f"- (!) `{cell}`: {_escape_md(why)}" for cell, why in warnings(matrix)]
    return ["## Warnings", "", *found, ""] if found else []


def to_csv(matrix: Matrix) -> str:
    names = param_names(matrix.rows)
    labels: dict[str, None] = {}
    for row in matrix.rows:
        for entry in row.entries.values():
            if entry.record:
                for h in entry.record.headline:
                    labels[f"{h.label} [{h.unit}]"] = None
                    if h.ci:
                        labels[f"{h.label} ci95 low [{h.unit}]"] = None
                        labels[f"{h.label} ci95 high [{h.unit}]"] = None
    header = ["workload", *names]
    for engine in matrix.engines:
        header += [f"{engine}:status", f"{engine}:reasons", *(f"{engine}:{lbl}" for lbl in labels)]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in matrix.rows:
        params = dict(row.params)
        line = [row.workload, *(format_param(params.get(n)) if n in params else "" for n in names)]
        for engine in matrix.engines:
            line += _csv_entry(row.entries.get(engine), list(labels))
        writer.writerow([_csv_text(v) for v in line])
    return buf.getvalue()


def _csv_entry(entry: Entry | None, labels: list[str]) -> list[str]:
    if entry is None:
        return ["", "", *([""] * len(labels))]
    rec = entry.record
    values = {lbl: "" for lbl in labels}
    if rec is not None and rec.status is Status.OK:
        for (label, unit, value), ci in zip(headline_values(rec), headline_cis(rec), strict=True):
            values[f"{label} [{unit}]"] = _csv_number(value)
            if ci is not None:
                values[f"{label} ci95 low [{unit}]"] = _csv_number(ci[0])
                values[f"{label} ci95 high [{unit}]"] = _csv_number(ci[1])
    reasons = "; ".join(rec.reasons) if rec else "no record"
    return [entry.status, reasons, *values.values()]


def _csv_number(value: float | None) -> str:
    return "" if value is None else repr(round(value, 9))


def publish(path: Path, data: bytes) -> None:
    """Write ``path`` atomically, a failure (read-only directory, a directory in the
    way, a full disk) as a WriteError naming the file."""
    with writing(path):
        replace(path, data)


def write_error(path: Path, exc: OSError) -> WriteError:
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    return WriteError(exc.errno or 0, f"cannot write {path}: {why}")


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Any OSError inside as a WriteError naming ``path``."""
    try:
        yield
    except WriteError:
        raise
    except OSError as exc:  # a StorageError too: this one names the file, not its folder
        raise write_error(path, exc) from exc


@dataclass(frozen=True)
class Written:
    markdown: Path
    csv: Path
    skipped: tuple[Damaged, ...]


def _texts(runs: Sequence[RunContents]) -> tuple[str, str]:
    [run] = runs
    matrix = build(run.manifest, run.records, run.state, run.skipped)
    return to_markdown(matrix), to_csv(matrix)


def publish_run(run_dir: Path, *, skip_damaged: bool = False) -> Written:
    """Build the matrix of ``run_dir`` and write matrix.md and matrix.csv into it.

    Raises RecordError (DamagedRunError: damaged or foreign records, each file named)
    when the run cannot be reported, WriteError when the files cannot be written.
    """
    runs, (md_text, csv_text) = vet(
        [read_run_dir(run_dir, skip_damaged=skip_damaged)], _texts, skip_damaged=skip_damaged
    )
    md, csv_path = run_dir / "matrix.md", run_dir / "matrix.csv"
    publish(md, md_text.encode())
    publish(csv_path, csv_text.encode())
    return Written(md, csv_path, runs[0].skipped)


def write(run_dir: Path, *, skip_damaged: bool = False) -> tuple[Path, Path]:
    """``publish_run``'s two files (matrix.md, matrix.csv)."""
    written = publish_run(run_dir, skip_damaged=skip_damaged)
    return written.markdown, written.csv
