"""The verdict: every figure's p-value Holm-adjusted over the whole comparison, then
called a regression, an improvement or no change (significant, beyond the threshold and
the load generator's own timing error), and the comparison of two runs assembled, or
refused (fails closed) when they cannot be compared."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.exceptions import RecordError
from harness.metrics import stats
from harness.report.compare.comparison import (
    DEFAULT_ALPHA,
    DEFAULT_THRESHOLD,
    MISSING,
    CellComparison,
    CompareError,
    Comparison,
    MetricComparison,
    Outcome,
    SkippedFile,
    exit_status,
    is_worse,
    regressions_of,
)
from harness.report.compare.pairing import (
    Pending,
    Run,
    coverage_problems,
    environment_check,
    load_both,
    measure,
    pair_cells,
)
from harness.results import reading
from harness.results.reading import RunContents
from harness.results.records import CellRecord, Headline


@dataclass(frozen=True)
class _Settings:
    threshold: float
    alpha: float
    allow_env: tuple[str, ...]
    allow_missing: bool
    fail_within_run: bool


def _judge(
    pending: Pending, p_adj: float | None, threshold: float, alpha: float, gate_within_run: bool
) -> tuple[Outcome, str]:
    """The outcome and its words; a change judged within one run only reads "higher" or
    "lower", not "slower" or "faster", unless the user gates on it (--fail-within-run)."""
    est = pending.estimate
    if not pending.comparable:
        return "not comparable", f"not comparable: {pending.why_not}"
    if est is None or p_adj is None:
        return "not tested", f"not tested: {pending.why_not}"
    why_not = _insignificant(pending, est, p_adj, threshold, alpha)
    if why_not:
        return "no change", why_not
    worse = is_worse(pending.direction, est.change)
    outcome: Outcome = "regression" if worse else "improvement"
    if pending.basis == "within-run" and not gate_within_run:
        # Not a verdict between runs: only which way it moved, in plain words.
        return outcome, f"{'higher' if est.change > 0 else 'lower'} (within-run only)"
    if pending.direction == "lower":
        word = "slower" if worse else "faster"
    else:
        word = "worse" if worse else "better"
    if pending.basis == "within-run":
        word += " (within-run only)"
    return outcome, word


def _insignificant(
    pending: Pending, est: stats.Estimate, p_adj: float, threshold: float, alpha: float
) -> str:
    """Why a tested change is not called, or "" when it is."""
    lo, hi = est.ci95
    if p_adj >= alpha or lo <= 0.0 <= hi or (lo > 0.0) != (est.change > 0.0):
        return "no significant change"
    if not est.agrees:
        return "no significant change (the distribution shifted the other way)"
    if abs(est.change) < threshold:
        return f"no significant change (below the {threshold * 100:g}% threshold)"
    floor, b, n = pending.floor_s, pending.base, pending.new
    if floor is not None and b is not None and n is not None and abs(n - b) < floor:
        return (
            "no significant change (within the load generator's timing error: "
            f"lag p99 {floor * 1e3:.3g} ms)"
        )
    return ""


def _finish(pending: Pending, p_adj: float | None, settings: _Settings) -> MetricComparison:
    h, est = pending.headline, pending.estimate
    outcome, verdict = _judge(
        pending, p_adj, settings.threshold, settings.alpha, settings.fail_within_run
    )
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
        basis=pending.basis if est else None,
        outcome=outcome,
        verdict=verdict,
    )


def _headlines(base: CellRecord, new: CellRecord) -> list[Headline]:
    # BASE's figures first; a figure only NEW reports is shown too (BASE has no value).
    known = {h.metric for h in base.headline}
    return [*base.headline, *(h for h in new.headline if h.metric not in known)]


def _adjust(pending: Mapping[str, Sequence[Pending]]) -> dict[tuple[str, int], float]:
    """Holm-adjusted p-values of every tested figure, by (cell id, figure index)."""
    tested = {
        (cell_id, i): p.estimate.p
        for cell_id, figures in pending.items()
        for i, p in enumerate(figures)
        if p.estimate is not None
    }
    return dict(zip(tested, stats.holm(list(tested.values())), strict=True))


def _compare_figures(
    cells: Sequence[CellComparison], base: Run, new: Run, settings: _Settings
) -> list[CellComparison]:
    pending = {
        c.cell_id: [
            measure(h, base.repeats[c.cell_id], new.repeats[c.cell_id])
            for h in _headlines(base.records[c.cell_id], new.records[c.cell_id])
        ]
        for c in cells
        if c.outcome == "compared"
    }
    adjusted = _adjust(pending)
    out = []
    for cell in cells:
        figures = tuple(
            _finish(p, adjusted.get((cell.cell_id, i)), settings)
            for i, p in enumerate(pending.get(cell.cell_id, []))
        )
        out.append(cell.model_copy(update={"metrics": figures}) if figures else cell)
    return out


# --- the comparison -------------------------------------------------------------------


def _check_settings(threshold: float, alpha: float) -> None:
    if not 0.0 <= threshold < 1.0:
        raise CompareError(f"threshold {threshold} must be a fraction in [0, 1) (0.05 is 5 %)")
    if not 0.0 < alpha < 1.0:
        raise CompareError(f"alpha {alpha} must be in (0, 1)")


def compare_runs(
    base_dir: Path,
    new_dir: Path,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    allow_env: Sequence[str] = (),
    allow_missing: bool = False,
    skip_damaged: bool = False,
    fail_within_run: bool = False,
) -> Comparison:
    """Compare run ``new_dir`` with run ``base_dir``; ``threshold`` is a fraction (0.05).

    A regression judged within one run only (the runs were not both made with
    ``--repeats``) fails the comparison only with ``fail_within_run``.

    Raises ``CompareError`` when a run cannot be read (a damaged record, unless
    ``skip_damaged`` leaves it out and lists it in ``skipped``). Runs that cannot be
    compared give a Comparison with ``problems`` (exit code 2) that names them and
    compares no figure.
    """
    _check_settings(threshold, alpha)
    runs = load_both(base_dir, new_dir, skip_damaged)
    settings = _Settings(threshold, alpha, tuple(allow_env), allow_missing, fail_within_run)

    def figures(pair: Sequence[RunContents]) -> object:
        # every pair of records compared, whatever else would stop the comparison
        base, new = (Run.of(c) for c in pair)
        return _compare_figures(pair_cells(base, new), base, new, settings)

    try:
        _, comparison = reading.vet(
            runs, lambda pair: _compare(pair, settings), skip_damaged=skip_damaged, probe=figures
        )
    except RecordError as exc:
        raise CompareError(f"cannot compare: {exc}") from exc
    return comparison


def _compare(pair: Sequence[RunContents], settings: _Settings) -> Comparison:
    base, new = (Run.of(c) for c in pair)
    threshold, alpha, allow_env = settings.threshold, settings.alpha, settings.allow_env
    allow_missing = settings.allow_missing
    refused, accepted = environment_check(base.environment, new.environment, allow_env)
    cells = pair_cells(base, new)
    problems = [
        *(f"environments differ (BASE != NEW): {line}" for line in refused),
        *coverage_problems(cells, allow_missing),
    ]
    if refused:
        problems.append(
            "pass --allow-env-diff FIELD-PATTERN for each difference you mean to compare"
            " across (e.g. 'packages.onnxruntime')"
        )
    if problems:
        cells = [c for c in cells if c.outcome in MISSING]
    else:
        cells = _compare_figures(cells, base, new, settings)
    regressions = regressions_of(cells, settings.fail_within_run)
    code, reason = exit_status(problems, regressions)
    return Comparison(
        base_run=base.manifest.run_id,
        new_run=new.manifest.run_id,
        threshold=threshold,
        alpha=alpha,
        allow_env=tuple(allow_env),
        allow_missing=allow_missing,
        fail_within_run=settings.fail_within_run,
        accepted_env_differences=tuple(accepted),
        problems=tuple(problems),
        skipped=tuple(SkippedFile(path=str(d.path), why=d.why) for c in pair for d in c.skipped),
        cells=tuple(cells),
        regressions=regressions,
        exit_code=code,
        reason=reason,
    )
