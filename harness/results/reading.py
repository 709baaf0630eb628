"""Reading run directories for reports: the one door report, compare and recommend use.

A run directory is trusted only as far as it is consistent. Each record must parse, sit
under its own name, belong to this run (its ``run_id`` is the manifest's) and to its
plan (its cell is planned), and hold numbers where the matrix shows numbers. A file that
fails any of this is *damaged*: planted, copied from another run, truncated, or
unreadable. By default reading fails closed, naming every damaged file: a report that
silently double-counts or drops cells is worse than none. With ``skip_damaged`` the rest
is read and each damaged file is listed with why, for the report to show.

A manifest still saying "running" is shown as running only while a live process holds
the run's lock (harness.results.lock); otherwise its controller was killed and the run is
interrupted, and resumable.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from harness.exceptions import RecordError
from harness.results import lock
from harness.results.records import CellRecord, Manifest, Status
from harness.results.store import CELLS, read_cell_file, read_manifest, record_path

SKIP_HINT = "--skip-damaged reports the rest and lists what it leaves out"
NUMBER_WORDS = frozenset({"Infinity", "-Infinity", "NaN", "inf"})
"""Non-finite figures as older records wrote them (as strings); still numbers."""
CONTENT_ERRORS: tuple[type[Exception], ...] = (
    ArithmeticError,
    AttributeError,
    LookupError,
    TypeError,
    ValueError,
)
"""What formatting a record whose content is not what its schema promises raises."""

T = TypeVar("T")


@dataclass(frozen=True)
class Damaged:
    """A results file that was refused, and why."""

    path: Path
    why: str

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


class DamagedRunError(RecordError):
    """Damaged results files were found and not skipped; the message names each one."""

    def __init__(self, damaged: Sequence[Damaged]) -> None:
        self.damaged = tuple(dict.fromkeys(damaged))  # a run given twice names its files once
        if len(self.damaged) == 1:  # one line: what scripts and logs grep
            text = f"damaged results file refused: {self.damaged[0]}; {SKIP_HINT}"
        else:
            listed = "".join(f"\n  {d}" for d in self.damaged)
            text = f"{len(self.damaged)} damaged results files refused:{listed}\n{SKIP_HINT}"
        super().__init__(text)


@dataclass(frozen=True)
class RunContents:
    """What a run directory holds that can be trusted."""

    path: Path
    manifest: Manifest
    attempts: tuple[CellRecord, ...]
    """Every readable attempt of every cell, by cell id, repeat, then attempt."""
    skipped: tuple[Damaged, ...] = ()
    owner: lock.Owner | None = None
    """The live process writing the run, when one is."""

    @functools.cached_property
    def repeats(self) -> dict[str, tuple[CellRecord, ...]]:
        """The latest attempt of each repeat of each cell (``--repeats``), by cell id then
        repeat; a run without repeats holds one per cell."""
        latest = {r.slot: r for r in self.attempts}  # attempts come in ascending order
        out: dict[str, list[CellRecord]] = {}
        for record in latest.values():
            out.setdefault(record.cell_id, []).append(record)
        return {cell_id: tuple(found) for cell_id, found in out.items()}

    @functools.cached_property
    def records(self) -> tuple[CellRecord, ...]:
        """One record per cell, by cell id: the latest attempt, and of a repeated cell the
        first repeat that went worst, so that a repeat that failed is never hidden behind
        one that passed."""
        return tuple(min(found, key=_rank) for found in self.repeats.values())

    @property
    def state(self) -> str:
        return run_state(self.manifest, self.owner, self.path)

    def path_of(self, record: CellRecord) -> Path:
        # file names are checked against their content when read, so this is its file
        return record_path(self.path, record)

    def without(self, damaged: Iterable[Damaged]) -> RunContents:
        """These contents less the records in ``damaged``, which join ``skipped``."""
        gone = list(damaged)
        paths = {d.path for d in gone}
        kept = tuple(r for r in self.attempts if self.path_of(r) not in paths)
        return replace(self, attempts=kept, skipped=(*self.skipped, *gone))


_WORST_FIRST = (Status.CRASHED, Status.TIMEOUT, Status.FAILED, Status.INVALID, Status.SKIPPED)


def _rank(record: CellRecord) -> tuple[int, int]:
    """Worse status first (crashed before failed before invalid before ok), then the
    lower repeat."""
    order = _WORST_FIRST.index(record.status) if record.status in _WORST_FIRST else 99
    return order, record.repeat


def run_state(manifest: Manifest, owner: lock.Owner | None, run_dir: Path) -> str:
    """The state a reader shows: a "running" manifest whose controller is gone (killed,
    so it could not say so) is interrupted."""
    if manifest.state != "running":
        return manifest.state
    if owner is None:
        return f"interrupted: its controller is gone (resume it with pytest ... --resume {run_dir})"
    return f"running (pid {owner.pid})" if owner.pid is not None else "running"


def read_run_dir(run_dir: Path, *, skip_damaged: bool = False) -> RunContents:
    """Read ``run_dir``, refusing damaged records (``DamagedRunError`` naming each file)
    unless ``skip_damaged``, which leaves them out and lists them in ``skipped``.

    A run directory without a manifest raises FileNotFoundError; a damaged manifest a
    RecordError (without the plan nothing can be checked, so it is never skipped).
    """
    manifest = read_manifest(run_dir)
    planned = frozenset(c.cell_id for c in manifest.planned)
    found: list[CellRecord] = []
    damaged: list[Damaged] = []
    for path in _cell_files(run_dir):
        try:
            found.append(_checked(read_cell_file(path), manifest.run_id, planned))
        except RecordError as exc:
            damaged.append(Damaged(path, _why(exc, path)))
    if damaged and not skip_damaged:
        raise DamagedRunError(damaged)
    attempts = tuple(sorted(found, key=lambda r: (r.cell_id, r.repeat, r.attempt)))
    return RunContents(run_dir, manifest, attempts, tuple(damaged), lock.owner(run_dir))


def read_run_dirs(run_dirs: Sequence[Path], *, skip_damaged: bool = False) -> list[RunContents]:
    """Several run directories; refused damaged files of all of them are named at once."""
    out: list[RunContents] = []
    damaged: list[Damaged] = []
    for run_dir in run_dirs:
        try:
            out.append(read_run_dir(run_dir, skip_damaged=skip_damaged))
        except DamagedRunError as exc:
            damaged += exc.damaged
    if damaged:
        raise DamagedRunError(damaged)
    return out


def add_skip_damaged(p: argparse.ArgumentParser) -> None:
    """The escape from failing closed on damaged results files, the same on every reader."""
    p.add_argument(
        "--skip-damaged",
        action="store_true",
        help="leave out results files that are damaged (unreadable, corrupt, from another"
        " run, not planned, or unreportable figures), report the rest and list them",
    )


def skipped_lines(skipped: Sequence[object]) -> list[str]:
    """The damaged files a reader left out (each shown as `path: why`), as it prints them."""
    if not skipped:
        return []
    head = f"skipped {len(skipped)} damaged file(s) (--skip-damaged); not in this report:"
    return [head, *(f"  {d}" for d in skipped)]


def _cell_files(run_dir: Path) -> list[Path]:
    cells = run_dir / CELLS
    if not cells.is_dir():
        raise FileNotFoundError(f"{run_dir} has no {CELLS}/ directory")
    try:
        names = sorted(os.listdir(cells))
    except OSError as exc:
        raise RecordError(f"{cells}: cannot list it: {os.strerror(exc.errno or 0)}") from exc
    # dot files are a writer's temporary files, never records
    return [cells / n for n in names if n.endswith(".json") and not n.startswith(".")]


def _why(exc: RecordError, path: Path) -> str:
    return str(exc).removeprefix(f"{path}: ")


def _checked(record: CellRecord, run_id: str, planned: frozenset[str]) -> CellRecord:
    """The record, if it belongs here: to this run, to its plan, with figures to show."""
    if record.run_id != run_id:
        raise RecordError(
            f"holds a record of run {record.run_id!r}, not of this run {run_id!r}"
            " (copied from another run?)"
        )
    if record.cell_id not in planned:
        raise RecordError(
            f"cell {record.cell_id!r} is not in this run's plan (manifest.json): planted,"
            " or left from another run?"
        )
    problem = figure_problem(record)
    if problem:
        raise RecordError(problem)
    return record


def is_figure(value: object) -> bool:
    """Whether ``value`` can stand where the matrix shows a number (None: not measured)."""
    if value is None or (isinstance(value, str) and value in NUMBER_WORDS):
        return True
    return isinstance(value, int | float) and not isinstance(value, bool)


def figure_problem(record: CellRecord) -> str | None:
    """Why a headline figure of ``record`` cannot be shown, or None when all can."""
    for h in record.headline:
        value = record.metric(h.metric)
        if not is_figure(value):
            return f"headline {h.label!r} (metrics.{h.metric}) is {_kind(value)}, not a number"
        pair = record.metric(h.ci) if h.ci else None
        ok_pair = isinstance(pair, list) and len(pair) == 2 and all(map(is_figure, pair))
        if pair is not None and not ok_pair:
            return (
                f"headline {h.label!r} interval (metrics.{h.ci}) is {_kind(pair)}, not [low, high]"
            )
    return None


def _kind(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def culprits(items: Sequence[T], check: Callable[[Sequence[T]], object]) -> list[tuple[T, str]]:
    """The items that make ``check`` raise a content error on their own, with the error.

    Halving: damaged records are few, so this costs a few checks of shrinking sets
    rather than one per item (a check may render plots).
    """
    if not items:
        return []
    try:
        check(items)
    except CONTENT_ERRORS as exc:
        if len(items) == 1:
            return [(items[0], f"cannot be reported: {type(exc).__name__}: {exc}")]
        half = len(items) // 2
        return culprits(items[:half], check) + culprits(items[half:], check)
    return []


R = TypeVar("R")
Work = Callable[[Sequence[RunContents]], R]


def vet(
    runs: Sequence[RunContents],
    work: Work[R],
    *,
    skip_damaged: bool = False,
    probe: Work[object] | None = None,
) -> tuple[list[RunContents], R]:
    """``work(runs)``, where a record whose content ``work`` cannot handle (a NaN where
    an int is needed, a string where a list is) is damaged like an unreadable one:
    refused naming its file, or with ``skip_damaged`` left out, listed, and ``work``
    done on the rest. ``probe`` (default: ``work``) is what the culprits are sought with,
    for work that would not reach a record in a subset of the runs.
    """
    try:
        return list(runs), work(runs)
    except CONTENT_ERRORS as exc:
        failure: Exception = exc
    items = [(i, r) for i, run in enumerate(runs) for r in run.records]
    check = probe or work
    bad = culprits(items, lambda subset: check(_restrict(runs, subset)))
    if not bad:  # only records together fail: none can be named
        raise _unreportable(runs, failure)
    damaged = [(i, Damaged(runs[i].path_of(rec), why)) for (i, rec), why in bad]
    if not skip_damaged:
        raise DamagedRunError([d for _, d in damaged])
    rest = [run.without(d for j, d in damaged if j == i) for i, run in enumerate(runs)]
    try:
        return rest, work(rest)
    except CONTENT_ERRORS as exc:
        raise _unreportable(rest, exc) from exc


def _restrict(
    runs: Sequence[RunContents], items: Sequence[tuple[int, CellRecord]]
) -> list[RunContents]:
    return [
        replace(run, attempts=tuple(r for j, r in items if j == i)) for i, run in enumerate(runs)
    ]


def _unreportable(runs: Sequence[RunContents], exc: Exception) -> RecordError:
    where = ", ".join(str(r.path) for r in runs)
    return RecordError(f"{where}: cannot be reported: {type(exc).__name__}: {exc}")
