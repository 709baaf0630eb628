"""``python -m harness compare BASE NEW``: did a change make an engine faster or slower?

The two run directories are matched cell by cell (the cell id encodes workload, engine
and parameters), and every headline figure of a cell that is ok on both sides is compared.

Method, for a headline figure whose raw samples both records keep (``e2e.p50`` reads
``samples["e2e"]``; ``.pNN`` is the nearest-rank percentile of harness.metrics.stats, the
definition the records use, and ``.mean`` the mean):

- change: NEW / BASE - 1 of that statistic, recomputed from the samples. Samples that do
  not reproduce the recorded figure are not used: they measured something else.
- 95% confidence interval of the change: a percentile bootstrap resampling both sides
  independently, seeded by cell and metric so that the same runs always give the same
  interval. For a percentile the order statistic of a resample is drawn from its exact
  binomial law rather than by sorting every resample, so thousands of resamples of
  thousands of samples stay cheap.
  A percentile is tested only where both runs hold enough samples to bound it (its
  distribution-free interval, harness.metrics.stats.quantile_ci, stays inside the samples: p99
  needs 368): a bootstrap never draws beyond the largest sample and would understate the
  uncertainty of a tail percentile.
- p-value: for a percentile, the two-sided Mann-Whitney U test. It tests whether one
  distribution is shifted against the other, not the percentile itself; the bootstrap
  interval is what speaks for the percentile, and a percentile that moved against the
  shift the test found is not called. For a mean, Welch's t-test. The p-values are
  Holm-Bonferroni adjusted across every test of the comparison, so that an A/A
  comparison of many cells calls a change with probability at most alpha.
- significant: adjusted p < alpha, the interval excludes no change, and |change| is at
  least the threshold (5 % by default). Over thousands of samples a test detects drifts of
  1-2 % that are run-to-run noise of a shared machine (other tenants, frequency scaling,
  cache and memory placement), not an effect of the change under test; the threshold is
  the smallest change worth acting on.

Direction comes from the unit: time (ns, us, ms, s, and per-item times such as ms/img) is
better lower, rates (req/s, tok/s, img/s) better higher; other units (avg, %, x) are shown
and never tested. Figures without raw samples on both sides (throughput) are reported,
never tested.

- resolution floor: a latency change smaller than the load generator's own timing error
  (the larger generator-lag p99 of the two records, ``metrics.lag.p99``) is not called.
  The samples of one run share that run's machine state and the tests see only the spread
  within a run; two runs of the same code on a busy machine differ in how late the OS
  wakes the generator, which moves sub-millisecond latencies by more than their spread
  (seen in an A/A of the null engine here: p50 0.14 -> 0.20 ms, lag p99 1.4-2.9 ms). A
  change below the lag the run itself measured cannot be attributed to the engine; on a
  quiet machine the lag, and so the floor, is microseconds.

It fails closed (exit 2) rather than compare unlike things: a run it cannot read (a
damaged or foreign record included, unless ``--skip-damaged`` leaves it out and lists
it; its cell then has no counterpart), no shared cells, cells on one side only (unless
``--allow-missing``), environment fingerprints that differ (unless each difference is
accepted with ``--allow-env-diff``). A cell ok in BASE
that is failed, invalid, timed out or crashed in NEW is a regression (exit 1), as is a
significant change for the worse.
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, model_validator
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from scipy import stats as sps

from harness.metrics import stats
from harness.report import runset
from harness.report.matrix import fmt_number, publish
from harness.results import environment, reading
from harness.results.reading import DamagedRunError, RunContents
from harness.results.records import CellRecord, Headline, Manifest, RecordError, Status
from harness.results.store import MANIFEST

Array = npt.NDArray[np.float64]

DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.05
RESAMPLES = 2000
SEED = 20_240_611
MEAN_CHUNK = 4_000_000
"""Indices drawn at once when resampling a mean: bounds memory whatever the sample count."""
REPRODUCE_ABS = 1e-7
"""Records keep samples rounded to 7 decimals (stats.as_samples): a statistic recomputed
from them may differ from the recorded one by half of that."""
TIME_UNITS = frozenset({"ns", "us", "µs", "ms", "s"})
EXIT_OK, EXIT_REGRESSION, EXIT_CANNOT_COMPARE = 0, 1, 2

Direction = Literal["lower", "higher", "none"]
Outcome = Literal["regression", "improvement", "no change", "not tested"]
TestName = Literal["mann-whitney-u", "welch-t"]
CellOutcome = Literal[
    "compared",
    "status regression",
    "now ok",
    "not ok on both sides",
    "skipped on both sides",
    "not measured in NEW",
    "only in BASE",
    "only in NEW",
]
MISSING: frozenset[str] = frozenset({"not measured in NEW", "only in BASE", "only in NEW"})
"""Cell outcomes that leave a cell of one run without a counterpart to compare it with."""


class CompareError(Exception):
    """The runs cannot be read or the settings make no sense; the message says what to do."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")


class MetricComparison(_Frozen):
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
    outcome: Outcome
    verdict: str

    @model_validator(mode="after")
    def _consistent(self) -> MetricComparison:
        tested = (self.change, self.ci95, self.test, self.p, self.p_adjusted)
        if self.outcome != "not tested" and any(v is None for v in tested):
            raise ValueError(f"a {self.outcome!r} figure needs a change, interval and p-value")
        if self.ci95 is not None and not self.ci95[0] <= self.ci95[1]:
            raise ValueError("ci95 must be [low, high]")
        if self.outcome in ("regression", "improvement") and self.change is not None:
            worse = _is_worse(self.direction, self.change)
            if worse != (self.outcome == "regression"):
                raise ValueError(f"change {self.change:+.3f} is not a {self.outcome}")
        return self


class SkippedFile(_Frozen):
    """A damaged results file left out with ``--skip-damaged``."""

    path: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


class CellComparison(_Frozen):
    cell_id: str
    workload: str
    engine: str
    base_status: str
    """A record status, or ``absent``."""
    new_status: str
    outcome: CellOutcome
    note: str = ""
    metrics: tuple[MetricComparison, ...] = ()


class Comparison(_Frozen):
    """The whole comparison; ``exit_code`` and ``reason`` follow from the rest."""

    base_run: str
    new_run: str
    threshold: float
    alpha: float
    confidence: float = stats.CONFIDENCE
    resamples: int = RESAMPLES
    allow_env: tuple[str, ...] = ()
    allow_missing: bool = False
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
        if self.regressions != _regressions(self.cells):
            raise ValueError("regressions do not match the cells")
        if (self.exit_code, self.reason) != _exit(self.problems, self.regressions):
            raise ValueError(f"exit code {self.exit_code} does not follow from the comparison")
        return self


# --- reading the runs -----------------------------------------------------------------


@dataclass(frozen=True)
class _Run:
    manifest: Manifest
    records: dict[str, CellRecord]

    @classmethod
    def of(cls, contents: RunContents) -> _Run:
        return cls(contents.manifest, {r.cell_id: r for r in contents.records})

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


def _load_both(base_dir: Path, new_dir: Path, skip_damaged: bool) -> list[RunContents]:
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


def _cell_order(base: _Run, new: _Run) -> list[str]:
    """The order BASE planned its cells in (as the matrix shows them), then the rest."""
    ids = base.records.keys() | new.records.keys()
    planned = [c.cell_id for run in (base, new) for c in run.manifest.planned if c.cell_id in ids]
    return list(dict.fromkeys([*planned, *sorted(ids)]))


def _pair_cells(base: _Run, new: _Run) -> list[CellComparison]:
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
    b: CellRecord | None, n: CellRecord | None, base: _Run, new: _Run
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
        return outcome, f"ok in BASE, {n.status.value} in NEW: {'; '.join(n.reasons)}"
    if n.status is ok:
        return "now ok", f"{b.status.value} in BASE, ok in NEW"
    both: CellOutcome = (
        "skipped on both sides" if b.status is n.status is skipped else "not ok on both sides"
    )
    return both, f"{b.status.value} in BASE, {n.status.value} in NEW"


def _coverage_problems(cells: Sequence[CellComparison], allow_missing: bool) -> list[str]:
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


def _environment_check(
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
class _Stat:
    """The statistic a headline path names, computed from the samples under ``key``."""

    key: str
    percentile: float | None  # None: the mean

    def of(self, values: Array) -> float:
        if self.percentile is None:
            return float(values.mean())
        return stats.nearest_rank(values, self.percentile)

    def enough(self, values: Array) -> bool:
        """Whether ``values`` bound the statistic: a tail percentile whose distribution-free
        interval reaches past the largest sample is not resampled (a bootstrap cannot draw
        beyond the largest sample, so it would understate the uncertainty)."""
        if self.percentile is None:
            return values.size >= 2
        if values.size < stats.min_samples_for(self.percentile):
            return False
        return None not in stats.quantile_ci(np.sort(values), self.percentile)


_STAT_PATH = re.compile(r"(?P<key>.+)\.(?:mean|p(?P<p>\d+(?:\.\d+)?))")


def statistic(metric: str) -> _Stat | None:
    """``e2e.p99`` -> the 99th percentile of samples["e2e"]; None for other paths."""
    m = _STAT_PATH.fullmatch(metric)
    if m is None:
        return None
    p = float(m["p"]) if m["p"] else None
    if p is not None and not 0.0 < p < 100.0:
        return None
    return _Stat(m["key"], p)


def direction(unit: str) -> Direction:
    """Lower is better for times (also per item: ms/img), higher for rates (.../s)."""
    numerator, _, per = unit.partition("/")
    if numerator in TIME_UNITS:
        return "lower"
    if per == "s":
        return "higher"
    return "none"


def _is_worse(direction: Direction, change: float) -> bool:
    return (change > 0) == (direction == "lower")


@dataclass(frozen=True)
class _Estimate:
    change: float
    ci95: tuple[float, float]
    p: float
    test: TestName
    n_base: int
    n_new: int
    agrees: bool
    """Whether the test statistic moved the same way as the figure: a p99 that fell while
    the whole distribution shifted up is not called on the strength of that shift."""


@dataclass(frozen=True)
class _Pending:
    """One figure measured, before the p-values of the whole comparison are adjusted."""

    headline: Headline
    direction: Direction
    base: float | None  # as recorded, unscaled
    new: float | None
    estimate: _Estimate | None
    why_not: str = ""
    floor_s: float | None = None
    """The larger generator-lag p99 of the two runs (latency figures only)."""


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _measure(h: Headline, base: CellRecord, new: CellRecord) -> _Pending:
    way = direction(h.unit)
    b, n = _number(base.metric(h.metric)), _number(new.metric(h.metric))
    why = _untestable(h, way, b, n)
    if why or b is None or n is None:
        return _Pending(h, way, b, n, None, why)
    found = _from_samples(h.metric, base, new, (b, n))
    if isinstance(found, str):
        return _Pending(h, way, b, n, None, found)
    floor = _timing_floor(base, new) if h.unit in TIME_UNITS else None
    return _Pending(h, way, b, n, found, floor_s=floor)


def _timing_floor(base: CellRecord, new: CellRecord) -> float | None:
    lags = [_number(r.metric("lag.p99")) for r in (base, new)]
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


def _from_samples(
    metric: str, base: CellRecord, new: CellRecord, recorded: tuple[float, float]
) -> _Estimate | str:
    stat = statistic(metric)
    if stat is None or stat.key not in base.samples or stat.key not in new.samples:
        return "no raw samples"
    xs = np.asarray(base.samples[stat.key], dtype=np.float64)
    ys = np.asarray(new.samples[stat.key], dtype=np.float64)
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        return "samples not finite"
    if not (stat.enough(xs) and stat.enough(ys)):
        return f"too few samples to bound it (BASE {xs.size}, NEW {ys.size})"
    if not all(
        math.isclose(stat.of(v), r, rel_tol=1e-9, abs_tol=REPRODUCE_ABS)
        for v, r in ((xs, recorded[0]), (ys, recorded[1]))
    ):
        return f"samples[{stat.key!r}] do not reproduce the recorded value"
    rng = np.random.default_rng([SEED, zlib.crc32(f"{base.cell_id}\0{metric}".encode())])
    return _estimate(stat, xs, ys, rng)


def _estimate(stat: _Stat, xs: Array, ys: Array, rng: np.random.Generator) -> _Estimate | str:
    before = stat.of(xs)
    if before <= 0.0:  # a recorded figure within rounding of zero
        return "BASE value is not positive: no relative change"
    change = stat.of(ys) / before - 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = _resample(stat, ys, rng) / _resample(stat, xs, rng) - 1.0
    tail = (1.0 - stats.CONFIDENCE) / 2.0
    lo, hi = (float(v) for v in np.quantile(boot, [tail, 1.0 - tail]))
    p, test, shift = _test(stat, xs, ys)
    if not all(math.isfinite(v) for v in (change, lo, hi, p)):
        return "undefined for these samples (zero values or no spread)"
    agrees = np.sign(shift) == np.sign(change)
    return _Estimate(change, (lo, hi), p, test, int(xs.size), int(ys.size), bool(agrees))


def _resample(stat: _Stat, values: Array, rng: np.random.Generator) -> Array:
    if stat.percentile is None:
        return _resample_mean(values, rng)
    return _resample_percentile(values, stat.percentile, rng)


def _resample_percentile(values: Array, p: float, rng: np.random.Generator) -> Array:
    """The nearest-rank percentile of RESAMPLES bootstrap resamples of ``values``."""
    ordered = np.sort(values)
    n = ordered.size
    # The rank nearest_rank picks, by its own definition: the percentile of ranks 1..n.
    rank = round(stats.nearest_rank(np.arange(1, n + 1), p))
    # In a resample (n draws of indices into ``ordered``) the rank-th smallest value is
    # ordered[j] for the rank-th smallest index drawn, and P(j <= i) is the chance that at
    # least ``rank`` of the n draws land in 0..i: a binomial tail. Inverting that law
    # draws j exactly, in O(n + resamples) instead of sorting every resample.
    cdf = sps.binom.sf(rank - 1, n, np.arange(1, n + 1) / n)
    j = np.searchsorted(cdf, rng.random(RESAMPLES), side="left")
    return ordered[np.minimum(j, n - 1)]


def _resample_mean(values: Array, rng: np.random.Generator) -> Array:
    n = values.size
    per = max(1, MEAN_CHUNK // n)
    parts = [
        values[rng.integers(0, n, size=(min(per, RESAMPLES - done), n))].mean(axis=1)
        for done in range(0, RESAMPLES, per)
    ]
    return np.concatenate(parts)


def _test(stat: _Stat, xs: Array, ys: Array) -> tuple[float, TestName, float]:
    """(two-sided p-value, test, which way NEW moved: > 0 up, < 0 down)."""
    if stat.percentile is None:
        welch = sps.ttest_ind(ys, xs, equal_var=False)
        return float(welch.pvalue), "welch-t", float(welch.statistic)
    mwu = sps.mannwhitneyu(ys, xs, alternative="two-sided")
    # U / (n_new * n_base) is P(a NEW sample > a BASE sample), ties counted half.
    return float(mwu.pvalue), "mann-whitney-u", float(mwu.statistic) / (ys.size * xs.size) - 0.5


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the order given."""
    p = np.asarray(p_values, dtype=np.float64)
    m = p.size
    order = np.argsort(p, kind="stable")
    # The i-th smallest of m is held to alpha / (m - i); monotone so ranks cannot swap.
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return [float(v) for v in adjusted]


def _judge(
    pending: _Pending, p_adj: float | None, threshold: float, alpha: float
) -> tuple[Outcome, str]:
    est = pending.estimate
    if est is None or p_adj is None:
        return "not tested", f"not tested: {pending.why_not}"
    lo, hi = est.ci95
    if p_adj >= alpha or lo <= 0.0 <= hi or (lo > 0.0) != (est.change > 0.0):
        return "no change", "no significant change"
    if not est.agrees:
        return "no change", "no significant change (the distribution shifted the other way)"
    if abs(est.change) < threshold:
        return "no change", f"no significant change (below the {threshold * 100:g}% threshold)"
    floor, b, n = pending.floor_s, pending.base, pending.new
    if floor is not None and b is not None and n is not None and abs(n - b) < floor:
        return "no change", (
            "no significant change (within the load generator's timing error: "
            f"lag p99 {floor * 1e3:.3g} ms)"
        )
    worse = _is_worse(pending.direction, est.change)
    if pending.direction == "lower":
        word = "slower" if worse else "faster"
    else:
        word = "worse" if worse else "better"
    return ("regression" if worse else "improvement"), word


def _finish(
    pending: _Pending, p_adj: float | None, threshold: float, alpha: float
) -> MetricComparison:
    h, est = pending.headline, pending.estimate
    outcome, verdict = _judge(pending, p_adj, threshold, alpha)
    b, n = pending.base, pending.new
    ratio = n / b - 1.0 if b and n is not None and b > 0 and math.isfinite(n / b) else None
    return MetricComparison(
        label=h.label,
        metric=h.metric,
        unit=h.unit,
        direction=pending.direction,
        base=None if b is None else b * h.scale,
        new=None if n is None else n * h.scale,
        change=est.change if est else ratio,
        ci95=est.ci95 if est else None,
        test=est.test if est else None,
        p=est.p if est else None,
        p_adjusted=p_adj,
        n_base=est.n_base if est else 0,
        n_new=est.n_new if est else 0,
        floor=None if pending.floor_s is None else pending.floor_s * h.scale,
        outcome=outcome,
        verdict=verdict,
    )


def _headlines(base: CellRecord, new: CellRecord) -> list[Headline]:
    # BASE's figures first; a figure only NEW reports is shown too (BASE has no value).
    known = {h.metric for h in base.headline}
    return [*base.headline, *(h for h in new.headline if h.metric not in known)]


def _adjust(pending: Mapping[str, Sequence[_Pending]]) -> dict[tuple[str, int], float]:
    """Holm-adjusted p-values of every tested figure, by (cell id, figure index)."""
    tested = {
        (cell_id, i): p.estimate.p
        for cell_id, figures in pending.items()
        for i, p in enumerate(figures)
        if p.estimate is not None
    }
    return dict(zip(tested, holm(list(tested.values())), strict=True))


def _compare_figures(
    cells: Sequence[CellComparison], base: _Run, new: _Run, threshold: float, alpha: float
) -> list[CellComparison]:
    pending = {
        c.cell_id: [
            _measure(h, base.records[c.cell_id], new.records[c.cell_id])
            for h in _headlines(base.records[c.cell_id], new.records[c.cell_id])
        ]
        for c in cells
        if c.outcome == "compared"
    }
    adjusted = _adjust(pending)
    out = []
    for cell in cells:
        figures = tuple(
            _finish(p, adjusted.get((cell.cell_id, i)), threshold, alpha)
            for i, p in enumerate(pending.get(cell.cell_id, []))
        )
        out.append(cell.model_copy(update={"metrics": figures}) if figures else cell)
    return out


# --- the comparison -------------------------------------------------------------------


def _regressions(cells: Iterable[CellComparison]) -> tuple[str, ...]:
    out = []
    for cell in cells:
        if cell.outcome == "status regression":
            out.append(f"{cell.cell_id}: {cell.note}")
        for m in cell.metrics:
            if m.outcome == "regression" and m.change is not None:
                out.append(f"{cell.cell_id}: {m.label} {m.verdict} {m.change * 100:+.1f}%")
    return tuple(out)


def _exit(problems: Sequence[str], regressions: Sequence[str]) -> tuple[int, str]:
    if problems:
        return EXIT_CANNOT_COMPARE, f"cannot compare: {len(problems)} problem(s), fails closed"
    if regressions:
        return EXIT_REGRESSION, f"{len(regressions)} significant regression(s)"
    return EXIT_OK, "no significant regression"


def _check_settings(threshold: float, alpha: float) -> None:
    if not 0.0 <= threshold < 1.0:
        raise CompareError(f"threshold {threshold} must be a fraction in [0, 1) (0.05 is 5 %)")
    if not 0.0 < alpha < 1.0:
        raise CompareError(f"alpha {alpha} must be in (0, 1)")


@dataclass(frozen=True)
class _Settings:
    threshold: float
    alpha: float
    allow_env: tuple[str, ...]
    allow_missing: bool


def compare_runs(
    base_dir: Path,
    new_dir: Path,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    allow_env: Sequence[str] = (),
    allow_missing: bool = False,
    skip_damaged: bool = False,
) -> Comparison:
    """Compare run ``new_dir`` with run ``base_dir``; ``threshold`` is a fraction (0.05).

    Raises ``CompareError`` when a run cannot be read (a damaged record, unless
    ``skip_damaged`` leaves it out and lists it in ``skipped``). Runs that cannot be
    compared give a Comparison with ``problems`` (exit code 2) that names them and
    compares no figure.
    """
    _check_settings(threshold, alpha)
    runs = _load_both(base_dir, new_dir, skip_damaged)
    settings = _Settings(threshold, alpha, tuple(allow_env), allow_missing)

    def figures(pair: Sequence[RunContents]) -> object:
        # every pair of records compared, whatever else would stop the comparison
        base, new = (_Run.of(c) for c in pair)
        return _compare_figures(_pair_cells(base, new), base, new, threshold, alpha)

    try:
        _, comparison = reading.vet(
            runs, lambda pair: _compare(pair, settings), skip_damaged=skip_damaged, probe=figures
        )
    except RecordError as exc:
        raise CompareError(f"cannot compare: {exc}") from exc
    return comparison


def _compare(pair: Sequence[RunContents], settings: _Settings) -> Comparison:
    base, new = (_Run.of(c) for c in pair)
    threshold, alpha, allow_env = settings.threshold, settings.alpha, settings.allow_env
    allow_missing = settings.allow_missing
    refused, accepted = _environment_check(base.environment, new.environment, allow_env)
    cells = _pair_cells(base, new)
    problems = [
        *(f"environments differ (BASE != NEW): {line}" for line in refused),
        *_coverage_problems(cells, allow_missing),
    ]
    if refused:
        problems.append(
            "pass --allow-env-diff FIELD-PATTERN for each difference you mean to compare"
            " across (e.g. 'packages.onnxruntime')"
        )
    if problems:
        cells = [c for c in cells if c.outcome in MISSING]
    else:
        cells = _compare_figures(cells, base, new, threshold, alpha)
    regressions = _regressions(cells)
    code, reason = _exit(problems, regressions)
    return Comparison(
        base_run=base.manifest.run_id,
        new_run=new.manifest.run_id,
        threshold=threshold,
        alpha=alpha,
        allow_env=tuple(allow_env),
        allow_missing=allow_missing,
        accepted_env_differences=tuple(accepted),
        problems=tuple(problems),
        skipped=tuple(SkippedFile(path=str(d.path), why=d.why) for c in pair for d in c.skipped),
        cells=tuple(cells),
        regressions=regressions,
        exit_code=code,
        reason=reason,
    )


def to_json(comparison: Comparison) -> bytes:
    """Stable bytes: the same comparison always serializes the same way."""
    return (comparison.model_dump_json(indent=1) + "\n").encode()


# --- the command ----------------------------------------------------------------------

_STYLE = {"regression": "red", "improvement": "green"}


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
    count = {o: sum(m.outcome == o for m in figures) for o in _STYLE | {"no change": 0}}
    untested = sum(m.outcome == "not tested" for m in figures)
    compared = sum(bool(cell.metrics) for cell in c.cells)
    status = sum(cell.outcome == "status regression" for cell in c.cells)
    return (
        f"{compared} cell(s) compared, {status} status regression(s); figures:"
        f" {count['regression']} regression(s), {count['improvement']} improvement(s),"
        f" {count['no change']} no significant change, {untested} not tested"
        f" (threshold {c.threshold * 100:g}%, alpha {c.alpha:g}, Holm-adjusted)."
        f" exit {c.exit_code}: {c.reason}"
    )


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
    for regression in comparison.regressions:
        console.print(f"[red]regression:[/red] {escape(regression)}", soft_wrap=True)
    # one line however long: scripts and CI logs grep it
    console.print(escape(_summary(comparison)), highlight=False, soft_wrap=True)


def _fraction_of_percent(text: str) -> float:
    try:
        value = float(text) / 100.0
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of percent") from exc
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text}% is not in [0, 100)")
    return value


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from exc
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not in (0, 1)")
    return value


def command(args: argparse.Namespace, console: Console) -> int:
    """``compare``: print the comparison, optionally write it as JSON; the exit status."""
    try:
        comparison = compare_runs(
            Path(args.base),
            Path(args.new),
            threshold=args.threshold,
            alpha=args.alpha,
            allow_env=tuple(args.allow_env),
            allow_missing=args.allow_missing,
            skip_damaged=args.skip_damaged,
        )
    except CompareError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return EXIT_CANNOT_COMPARE
    render(comparison, console)
    if args.json_path is not None:
        try:
            publish(Path(args.json_path), to_json(comparison))
        except OSError as exc:
            console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
            return EXIT_CANNOT_COMPARE
        console.print(f"wrote {escape(str(args.json_path))}", highlight=False)
    return comparison.exit_code


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``compare`` subcommand to ``python -m harness``."""
    p = sub.add_parser(
        "compare",
        help="compare two runs cell by cell; exit 1 on a significant regression",
        description=(
            "Per cell, the change of each headline figure NEW/BASE - 1 with a 95%% bootstrap"
            " interval and a Holm-adjusted test on the raw samples. Exit 0: no significant"
            " regression; 1: a significant regression (or a cell ok in BASE that is not ok"
            " in NEW); 2: the runs cannot be compared (unreadable or damaged files, no shared"
            " cells, cells missing, environments differ)."
        ),
    )
    p.add_argument("base", metavar="BASE", help="run directory before the change")
    p.add_argument("new", metavar="NEW", help="run directory after the change")
    p.add_argument(
        "--threshold",
        type=_fraction_of_percent,
        default=DEFAULT_THRESHOLD,
        metavar="PERCENT",
        help="smallest change called significant, in percent (default 5): smaller drifts"
        " are run-to-run noise however many samples detect them",
    )
    p.add_argument("--alpha", type=_probability, default=DEFAULT_ALPHA, help="default 0.05")
    p.add_argument(
        "--allow-env-diff",
        dest="allow_env",
        action="append",
        default=[],
        metavar="PATTERN",
        help="accept environment differences in fields matching PATTERN (fnmatch, e.g."
        " 'packages.onnxruntime' or 'packages.*'); repeatable",
    )
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="compare the shared cells even when some cells are in one run only",
    )
    p.add_argument("--json", dest="json_path", metavar="PATH", help="also write the comparison")
    reading.add_skip_damaged(p)
    p.set_defaults(func=command)
