"""What ``compare`` says, as data: the figures, cells and whole comparison (pydantic
models, so the JSON it writes reads back), and the rules that tie their fields together
(direction of a unit, the regressions and exit status a comparison implies)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import model_validator

from harness.exceptions import HarnessError
from harness.metrics import stats
from harness.metrics.stats import TestName
from harness.results.frozen import Frozen

DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.05
TIME_UNITS = frozenset({"ns", "us", "µs", "ms", "s"})
EXIT_OK, EXIT_REGRESSION, EXIT_CANNOT_COMPARE = 0, 1, 2

Direction = Literal["lower", "higher", "none"]
Outcome = Literal["regression", "improvement", "no change", "not tested", "not comparable"]
Basis = Literal["repeats", "within-run"]
"""What a figure's test was judged on: the spread between ``--repeats`` (separate worker
processes), or only the requests of one run on each side."""
CellOutcome = Literal[
    "compared",
    "status regression",
    "not comparable",
    "now ok",
    "not ok on both sides",
    "skipped on both sides",
    "not measured in NEW",
    "only in BASE",
    "only in NEW",
]
MISSING: frozenset[str] = frozenset({"not measured in NEW", "only in BASE", "only in NEW"})
"""Cell outcomes that leave a cell of one run without a counterpart to compare it with."""


class CompareError(HarnessError):
    """The runs cannot be read or the settings make no sense; the message says what to do."""


class MetricComparison(Frozen):
    """One headline figure of one cell, BASE against NEW (values scaled to ``unit``)."""

    label: str
    metric: str
    unit: str
    direction: Direction
    base: float | None
    new: float | None
    change: float | None
    """NEW / BASE - 1 (0.3 is 30 % more), None where there is no ratio."""
    ci95: tuple[float, float] | None = None
    test: TestName | None = None
    p: float | None = None
    p_adjusted: float | None = None
    """Holm-Bonferroni adjusted across every test of the comparison."""
    n_base: int = 0
    n_new: int = 0
    floor: float | None = None
    """The resolution floor in ``unit`` (generator lag p99), where one applies."""
    basis: Basis | None = None
    """None where the figure was not tested."""
    outcome: Outcome
    verdict: str

    @model_validator(mode="after")
    def _consistent(self) -> MetricComparison:
        tested = (self.change, self.ci95, self.test, self.p, self.p_adjusted, self.basis)
        untested = self.outcome in ("not tested", "not comparable")
        if not untested and any(v is None for v in tested):
            raise ValueError(f"a {self.outcome!r} figure needs a change, interval and p-value")
        if self.ci95 is not None and not self.ci95[0] <= self.ci95[1]:
            raise ValueError("ci95 must be [low, high]")
        if self.outcome in ("regression", "improvement") and self.change is not None:
            worse = is_worse(self.direction, self.change)
            if worse != (self.outcome == "regression"):
                raise ValueError(f"change {self.change:+.3f} is not a {self.outcome}")
        return self


class SkippedFile(Frozen):
    """A damaged results file left out with ``--skip-damaged``."""

    path: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


class CellComparison(Frozen):
    cell_id: str
    workload: str
    engine: str
    base_status: str
    """A record status, or ``absent``."""
    new_status: str
    outcome: CellOutcome
    note: str = ""
    metrics: tuple[MetricComparison, ...] = ()


class Comparison(Frozen):
    """The whole comparison; ``exit_code`` and ``reason`` follow from the rest."""

    base_run: str
    new_run: str
    threshold: float
    alpha: float
    confidence: float = stats.CONFIDENCE
    resamples: int = stats.RESAMPLES
    allow_env: tuple[str, ...] = ()
    allow_missing: bool = False
    fail_within_run: bool = False
    """Whether a regression judged within one run only (no ``--repeats`` on both sides)
    fails the comparison; by default it is reported and does not."""
    accepted_env_differences: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    """Why the runs cannot be compared; when there are any, no figure is compared."""
    skipped: tuple[SkippedFile, ...] = ()
    """Damaged files of either run left out (``--skip-damaged``); their cells have no
    counterpart."""
    cells: tuple[CellComparison, ...] = ()
    regressions: tuple[str, ...] = ()
    exit_code: int
    reason: str

    @model_validator(mode="after")
    def _consistent(self) -> Comparison:
        if self.regressions != regressions_of(self.cells, self.fail_within_run):
            raise ValueError("regressions do not match the cells")
        if (self.exit_code, self.reason) != exit_status(self.problems, self.regressions):
            raise ValueError(f"exit code {self.exit_code} does not follow from the comparison")
        return self


def direction(unit: str) -> Direction:
    """Lower is better for times (also per item: ms/img), higher for rates (.../s)."""
    numerator, _, per = unit.partition("/")
    if numerator in TIME_UNITS:
        return "lower"
    if per == "s":
        return "higher"
    return "none"


def is_worse(direction: Direction, change: float) -> bool:
    return (change > 0) == (direction == "lower")


def regressions_of(cells: Iterable[CellComparison], fail_within_run: bool) -> tuple[str, ...]:
    """What fails the comparison: status regressions, and figures significantly worse
    (judged within one run only: just with ``fail_within_run``)."""
    out = []
    for cell in cells:
        if cell.outcome == "status regression":
            out.append(f"{cell.cell_id}: {cell.note}")
        out.extend(
            f"{cell.cell_id}: {m.label} {m.verdict} {m.change * 100:+.1f}%"
            for m in cell.metrics
            if m.outcome == "regression"
            and m.change is not None
            and (fail_within_run or m.basis != "within-run")
        )
    return tuple(out)


def within_run_only(cells: Iterable[CellComparison]) -> tuple[str, ...]:
    """Significant changes, either way, judged within one run only."""
    return tuple(
        f"{cell.cell_id}: {m.label} {m.verdict} {m.change * 100:+.1f}%"
        for cell in cells
        for m in cell.metrics
        if m.outcome in ("regression", "improvement")
        and m.basis == "within-run"
        and m.change is not None
    )


def exit_status(problems: Sequence[str], regressions: Sequence[str]) -> tuple[int, str]:
    if problems:
        return EXIT_CANNOT_COMPARE, f"cannot compare: {len(problems)} problem(s), fails closed"
    if regressions:
        return EXIT_REGRESSION, f"{len(regressions)} significant regression(s)"
    return EXIT_OK, "no significant regression"
