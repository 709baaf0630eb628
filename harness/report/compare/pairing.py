"""What the records say, side by side: the two runs read, their cells paired by id (and
what keeps a cell from being compared), the environments checked, and each headline
figure measured from both records' raw samples (before the p-values of the whole
comparison are adjusted, in ``verdict``)."""

from __future__ import annotations

import fnmatch
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.exceptions import RecordError
from harness.metrics import stats, validity
from harness.report import runset
from harness.report.compare.comparison import (
    MISSING,
    TIME_UNITS,
    Basis,
    CellComparison,
    CellOutcome,
    CompareError,
    Direction,
    direction,
)
from harness.results import environment, reading
from harness.results.reading import DamagedRunError, RunContents
from harness.results.records import CellRecord, Headline, Manifest, Status
from harness.results.store import MANIFEST

SEED = 20_240_611


@dataclass(frozen=True)
class Run:
    manifest: Manifest
    records: dict[str, CellRecord]
    """One per cell (of a repeated cell, the repeat that went worst: RunContents.records)."""
    repeats: dict[str, tuple[CellRecord, ...]]
    """Every repeat of each cell (``--repeats``), by repeat; one where there were none."""

    @classmethod
    def of(cls, contents: RunContents) -> Run:
        return cls(contents.manifest, {r.cell_id: r for r in contents.records}, contents.repeats)

    @property
    def environment(self) -> dict[str, Any]:
        return runset.environment_of(self.manifest, self.records.values())

    @property
    def planned(self) -> set[str]:
        return {c.cell_id for c in self.manifest.planned}


def _load(run_dir: Path, side: str, skip_damaged: bool) -> RunContents:
    try:
        return reading.read_run_dir(run_dir, skip_damaged=skip_damaged)
    except DamagedRunError:
        raise  # gathered over both runs by _load_both
    except RecordError as exc:
        raise CompareError(f"cannot read {side} run: {exc}") from exc
    except OSError as exc:
        raise CompareError(f"cannot read {side} run {run_dir}: {exc}. {_hint(run_dir)}") from exc


def load_both(base_dir: Path, new_dir: Path, skip_damaged: bool) -> list[RunContents]:
    """Both runs; the damaged files of both are named at once."""
    runs: list[RunContents] = []
    refused: list[str] = []
    for run_dir, side in ((base_dir, "BASE"), (new_dir, "NEW")):
        try:
            runs.append(_load(run_dir, side, skip_damaged))
        except DamagedRunError as exc:
            refused.append(f"cannot read {side} run: {exc}")
    if refused:
        raise CompareError("\n".join(refused))
    return runs


def _hint(run_dir: Path) -> str:
    runs = sorted(p.parent.name for p in run_dir.glob(f"*/{MANIFEST}"))
    if runs:
        # A results directory holds one run directory per run: the likely mix-up.
        return f"It is a results directory holding runs {', '.join(runs)}: pass one of them"
    return "Pass a run directory (<results-dir>/<run-id>/, with manifest.json and cells/)"


# --- which cells can be compared ------------------------------------------------------


def _cell_order(base: Run, new: Run) -> list[str]:
    """The order BASE planned its cells in (as the matrix shows them), then the rest."""
    ids = base.records.keys() | new.records.keys()
    planned = [c.cell_id for run in (base, new) for c in run.manifest.planned if c.cell_id in ids]
    return list(dict.fromkeys([*planned, *sorted(ids)]))


def pair_cells(base: Run, new: Run) -> list[CellComparison]:
    out = []
    for cell_id in _cell_order(base, new):
        b, n = base.records.get(cell_id), new.records.get(cell_id)
        some = b or n
        assert some is not None  # the id came from one of the two
        outcome, note = _presence(b, n, base, new) if b is None or n is None else _status(b, n)
        out.append(
            CellComparison(
                cell_id=cell_id,
                workload=some.workload,
                engine=some.engine,
                base_status=b.status.value if b else "absent",
                new_status=n.status.value if n else "absent",
                outcome=outcome,
                note=note,
            )
        )
    return out


def _presence(
    b: CellRecord | None, n: CellRecord | None, base: Run, new: Run
) -> tuple[CellOutcome, str]:
    side, other, record = ("NEW", new, b) if n is None else ("BASE", base, n)
    assert record is not None
    if record.cell_id in other.planned:
        why = "planned there but never written (interrupted? finish it with --resume)"
    else:
        why = "not part of that run"
    outcome: CellOutcome = "only in BASE" if side == "NEW" else "only in NEW"
    return outcome, f"no record in {side}: {why}"


def _status(b: CellRecord, n: CellRecord) -> tuple[CellOutcome, str]:
    ok, skipped = Status.OK, Status.SKIPPED
    if b.status is ok and n.status is ok:
        return "compared", ""
    if b.status is ok:
        # Skipped means not measured (an engine missing here), not measured worse.
        outcome: CellOutcome = "not measured in NEW" if n.status is skipped else "status regression"
        if n.status is Status.INVALID and _measurement_only(n.reasons):
            # the load generator or the window failed, not the system: nothing to judge
            outcome = "not comparable"
        return outcome, f"ok in BASE, {n.status.value} in NEW: {'; '.join(n.reasons)}"
    if n.status is ok:
        return "now ok", f"{b.status.value} in BASE, ok in NEW"
    both: CellOutcome = (
        "skipped on both sides" if b.status is n.status is skipped else "not ok on both sides"
    )
    return both, f"{b.status.value} in BASE, {n.status.value} in NEW"


def _measurement_only(reasons: Sequence[str]) -> bool:
    """Whether every reason a cell is invalid is about the measurement (the generator
    lagged, too few samples, too short a window), none about the system (failed requests)."""
    return bool(reasons) and len(validity.measurement_reasons(reasons)) == len(reasons)


def coverage_problems(cells: Sequence[CellComparison], allow_missing: bool) -> list[str]:
    if not any(c.outcome not in MISSING for c in cells):
        # Nothing would be compared: a pass would say nothing about either run.
        return [
            "the runs share no cells (were they run with the same workloads, engines and profile?)"
        ]
    missing = [c for c in cells if c.outcome in MISSING]
    if allow_missing or not missing:
        return []
    return [
        f"{len(missing)} cell(s) have no counterpart (pass --allow-missing to compare the"
        " rest): " + ", ".join(f"{c.cell_id} ({c.outcome}; {c.note})" for c in missing)
    ]


def environment_check(
    base: Mapping[str, Any], new: Mapping[str, Any], allow: Sequence[str]
) -> tuple[list[str], list[str]]:
    """(refused, accepted) differences as ``field: base != new`` lines."""
    if not base or not new:
        sides = " and ".join(s for s, env in (("BASE", base), ("NEW", new)) if not env)
        line = (
            f"environment: no fingerprint recorded in {sides} (pass --allow-env-diff"
            " environment to compare anyway)"
        )
        waived = any(fnmatch.fnmatchcase("environment", p) for p in allow)
        return ([], [line]) if waived else ([line], [])
    every = environment.differences(base, new)
    refused = environment.differences(base, new, allow=allow)
    accepted = [f for f in every if f not in refused]
    return (
        environment.describe_differences(base, new, refused),
        environment.describe_differences(base, new, accepted),
    )


# --- one figure -----------------------------------------------------------------------


@dataclass(frozen=True)
class Pending:
    """One figure measured, before the p-values of the whole comparison are adjusted."""

    headline: Headline
    direction: Direction
    base: float | None  # as recorded (mean over repeats), unscaled
    new: float | None
    estimate: stats.Estimate | None
    why_not: str = ""
    floor_s: float | None = None
    """The larger generator-lag p99 of the two runs (latency figures only)."""
    basis: Basis | None = None
    comparable: bool = True
    """False: a latency figure of a cell whose latency is no property of the system in
    one of the runs (saturated, trending), so it is not compared at all."""


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _values(metric: str, records: Sequence[CellRecord]) -> list[float] | None:
    found = [_number(r.metric(metric)) for r in records]
    return None if any(v is None for v in found) else [v for v in found if v is not None]


def _mean(values: list[float] | None) -> float | None:
    return None if not values else float(np.mean(values))


def measure(h: Headline, base: Sequence[CellRecord], new: Sequence[CellRecord]) -> Pending:
    """One figure, from every repeat of the cell in each run: judged on the spread
    between repeats where both runs have two or more, else within the first repeat's
    requests only (``basis``)."""
    repeats = len(base) >= 2 and len(new) >= 2
    if not repeats:
        base, new = base[:1], new[:1]
    way = direction(h.unit)
    b, n = _mean(_values(h.metric, base)), _mean(_values(h.metric, new))
    why = _untestable(h, way, b, n)
    if why or b is None or n is None:
        return Pending(h, way, b, n, None, why)
    latency = h.unit.partition("/")[0] in TIME_UNITS
    unstable = _unstable(base, new) if latency else ""
    if unstable:
        return Pending(h, way, b, n, None, unstable, comparable=False)
    floor = _timing_floor([*base, *new]) if latency else None
    if repeats:
        found = _from_repeats(h.metric, base, new)
    else:
        found = _from_samples(h.metric, base[0], new[0], (b, n))
    if isinstance(found, str):
        return Pending(h, way, b, n, None, found, floor_s=floor)
    basis: Basis = "repeats" if repeats else "within-run"
    return Pending(h, way, b, n, found, floor_s=floor, basis=basis)


def _unstable(base: Sequence[CellRecord], new: Sequence[CellRecord]) -> str:
    """``saturated in BASE and NEW; ...``: what makes a run's latency no property of the
    system, in the order validity.UNSTABLE_LATENCY lists them; "" when nothing does."""
    sides: dict[str, list[str]] = {p.rstrip(":"): [] for p in validity.UNSTABLE_LATENCY}
    for side, records in (("BASE", base), ("NEW", new)):
        for r in records:
            for w in validity.unstable_latency(r.validity.warnings if r.validity else ()):
                found = sides.setdefault(w.split(":", 1)[0], [])
                if side not in found:
                    found.append(side)
    return "; ".join(f"{kind} in {' and '.join(s)}" for kind, s in sides.items() if s)


def _timing_floor(records: Sequence[CellRecord]) -> float | None:
    """The largest declared generator timing error (lag p99) of the records."""
    paths = [(r, r.reporting().timing_floor) for r in records]
    lags = [_number(r.metric(path)) for r, path in paths if path is not None]
    known = [v for v in lags if v is not None and math.isfinite(v)]
    return max(known) if known else None


def _untestable(h: Headline, way: Direction, b: float | None, n: float | None) -> str:
    if way == "none":
        return f"informational unit {h.unit!r}" if h.unit else "informational, no unit"
    if b is None or n is None:
        return "no value in " + " and ".join(s for s, v in (("BASE", b), ("NEW", n)) if v is None)
    if not (math.isfinite(b) and math.isfinite(n)):
        return "value not finite"
    if b <= 0:
        return "BASE value is not positive: no relative change"
    return ""


def _from_repeats(
    metric: str, base: Sequence[CellRecord], new: Sequence[CellRecord]
) -> stats.Estimate | str:
    xs, ys = _values(metric, base), _values(metric, new)
    if xs is None or ys is None:
        return "a repeat has no value"
    return stats.between_repeats(np.asarray(xs), np.asarray(ys))


def _from_samples(
    metric: str, base: CellRecord, new: CellRecord, recorded: tuple[float, float]
) -> stats.Estimate | str:
    stat = stats.statistic(metric)
    if stat is None or stat.key not in base.samples or stat.key not in new.samples:
        return "no raw samples; --repeats tests it"
    xs = np.asarray(base.samples[stat.key], dtype=np.float64)
    ys = np.asarray(new.samples[stat.key], dtype=np.float64)
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        return "samples not finite"
    if not (stat.enough(xs) and stat.enough(ys)):
        return f"too few samples to bound it (BASE {xs.size}, NEW {ys.size})"
    if not all(stats.reproduces(stat, v, r) for v, r in ((xs, recorded[0]), (ys, recorded[1]))):
        return f"samples[{stat.key!r}] do not reproduce the recorded value"
    rng = np.random.default_rng([SEED, zlib.crc32(f"{base.cell_id}\0{metric}".encode())])
    return stats.estimate(stat, xs, ys, rng)
