"""Several run directories read as one body of evidence.

Each engine family runs in its own tox environment, so a full comparison is several runs.
They merge into one matrix: a column per engine, and per engine *and machine* as soon as
the runs were measured on more than one machine, so cells from different hardware are
never silently mixed. Where two runs measured the same cell of the same engine on the
same machine, the later run's record is shown and the report says which one it replaced.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.report.matrix import Entry, Matrix, Row, build
from harness.results import environment
from harness.results.reading import Damaged, RunContents, read_run_dirs
from harness.results.records import CellRecord, Manifest


def environment_of(manifest: Manifest, records: Iterable[CellRecord]) -> dict[str, Any]:
    """A run's fingerprint: the manifest's, or a record's where the manifest has none
    (older runs kept it in the records only)."""
    if manifest.environment:
        return manifest.environment
    return next((r.environment for r in records if r.environment), {})


@dataclass(frozen=True)
class Run:
    """One run directory as read (harness.results.reading): its manifest, its records, the
    damaged files left out, and the machine that measured it."""

    contents: RunContents

    @property
    def path(self) -> Path:
        return self.contents.path

    @property
    def manifest(self) -> Manifest:
        return self.contents.manifest

    @property
    def records(self) -> tuple[CellRecord, ...]:
        return self.contents.records

    @property
    def skipped(self) -> tuple[Damaged, ...]:
        """Damaged files of this run left out (``--skip-damaged``)."""
        return self.contents.skipped

    @property
    def state(self) -> str:
        """The state to show: "interrupted" for a running manifest nobody writes."""
        return self.contents.state

    @property
    def environment(self) -> dict[str, Any]:
        return environment_of(self.manifest, self.records)

    @property
    def hardware(self) -> str:
        return environment.hardware_label(self.environment)


@dataclass(frozen=True)
class RunSet:
    """Runs in the order given; ``mixed`` when they span more than one machine."""

    runs: tuple[Run, ...]

    def __post_init__(self) -> None:
        if not self.runs:
            raise ValueError("a run set needs at least one run directory")
        ids = [r.manifest.run_id for r in self.runs]
        if len(ids) != len(set(ids)):
            raise ValueError(f"the same run was given twice: {sorted(ids)}")

    @property
    def hardware(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.hardware for r in self.runs))

    @property
    def skipped(self) -> tuple[Damaged, ...]:
        return tuple(d for r in self.runs for d in r.skipped)

    @property
    def mixed(self) -> bool:
        return len(self.hardware) > 1

    def column(self, run: Run, engine: str) -> str:
        """The matrix column of ``engine``'s cells from ``run``."""
        return f"{engine} @ {run.hardware}" if self.mixed else engine


def load(paths: Sequence[Path], *, skip_damaged: bool = False) -> RunSet:
    """Read each run directory (errors name the directory or file and what is wrong;
    damaged files of every run at once, unless ``skip_damaged`` leaves them out)."""
    return of(read_run_dirs(paths, skip_damaged=skip_damaged))


def of(contents: Iterable[RunContents]) -> RunSet:
    return RunSet(tuple(Run(c) for c in contents))


@dataclass(frozen=True)
class Merged:
    """The merged matrix, and what the merge had to decide: records a later run
    replaced (``column``, ``cell_id``, kept run, replaced run)."""

    matrix: Matrix
    replaced: tuple[tuple[str, str, str, str], ...]


def merge(runs: RunSet) -> Merged:
    """One matrix over every run: rows in first-planned order, columns per engine (and
    machine when mixed); a later run (by creation time) wins a cell both measured."""
    ordered = sorted(runs.runs, key=lambda r: (r.manifest.created_at, r.manifest.run_id))
    rows: dict[tuple[str, Any], dict[str, Entry]] = {}
    origin: dict[tuple[str, Any, str], str] = {}
    replaced: list[tuple[str, str, str, str]] = []
    for run in ordered:
        for row in build(run.manifest, run.records).rows:
            key = (row.workload, row.params)
            target = rows.setdefault(key, {})
            for engine, entry in row.entries.items():
                column = runs.column(run, engine)
                cell = entry.record.cell_id if entry.record else "-"
                previous = origin.get((*key, column))
                if previous is not None:
                    replaced.append((column, cell, run.manifest.run_id, previous))
                target[column] = Entry(column, entry.record)
                origin[(*key, column)] = run.manifest.run_id
    columns = tuple(dict.fromkeys(c for entries in rows.values() for c in entries))
    matrix = Matrix(
        run_id=", ".join(r.manifest.run_id for r in runs.runs),
        state=_state(runs),
        engines=columns,
        rows=tuple(Row(w, p, e) for (w, p), e in rows.items()),
        skipped=runs.skipped,
    )
    return Merged(matrix, tuple(replaced))


def _state(runs: RunSet) -> str:
    unfinished = [f"{r.manifest.run_id} is {r.state}" for r in runs.runs if r.state != "complete"]
    return "incomplete: " + ", ".join(unfinished) if unfinished else "complete"
