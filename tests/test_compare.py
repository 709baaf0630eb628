"""``python -m harness compare``: known answers on run directories built from seeded samples."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from harness import cli
from harness.metrics import stats
from harness.metrics.stats import Statistic, resample_percentile
from harness.report.compare import (
    RESAMPLES,
    CompareError,
    Comparison,
    MetricComparison,
    compare_runs,
    direction,
    holm,
    statistic,
)
from harness.results import store
from harness.results.records import (
    CellRecord,
    Headline,
    Manifest,
    PlannedCell,
    Status,
    ValidityInfo,
)
from tests.support import records_factory

ENV: dict[str, Any] = {
    "cpu": {"model": "Test Xeon 8480", "logical_cores": 2, "affinity": 2},
    "memory_bytes": 8 * 2**30,
    "python": {"version": "3.11.9", "implementation": "cpython"},
    "packages": {"numpy": "2.4.6", "onnxruntime": "1.20.0"},
    "git": {"commit": "a" * 40, "dirty": False},
    "hostname": "bench-1",
}
HEADLINE = (
    Headline(label="p50", metric="e2e.p50", unit="ms", scale=1e3, ci="e2e.ci95.p50"),
    Headline(label="p99", metric="e2e.p99", unit="ms", scale=1e3, ci="e2e.ci95.p99"),
    Headline(label="tput", metric="throughput.requests_per_s", unit="req/s"),
    Headline(label="batch", metric="batches.mean_size", unit="avg"),
)
CELLS = ("batching.fake.rate=10", "batching.fake.rate=50", "batching.fake.rate=100")
WINDOW_S = 10.0


def ok_record(cell_id: str, run_id: str, e2e: np.ndarray, **extra: Any) -> CellRecord:
    """An ok record whose figures are computed from its samples, the way workloads do."""
    fields: dict[str, Any] = {
        "run_id": run_id,
        "cell_id": cell_id,
        "workload": "batching",
        "engine": "fake",
        "params": {"rate": float(cell_id.rsplit("=", 1)[1])},
        "status": Status.OK,
        "started_at": "2026-01-01T00:00:00.000Z",
        "finished_at": "2026-01-01T00:00:10.000Z",
        "duration_s": WINDOW_S,
        "environment": ENV,
        # Unrounded figures, rounded samples: as the harness stores them.
        "metrics": {
            "e2e": stats.to_json(stats.summarize(e2e)),
            "throughput": {"requests_per_s": e2e.size / WINDOW_S},
            "batches": {"mean_size": 1.0},
        },
        "samples": {"e2e": stats.as_samples(e2e)},
        "headline": HEADLINE,
        "validity": ValidityInfo(verdict="valid"),
    }
    return CellRecord(**(fields | extra))


def latencies(seed: int, factor: float = 1.0, n: int = 2000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.lognormal(np.log(0.010), 0.3, n) * factor


def write_run(
    root: Path,
    run_id: str,
    records: list[CellRecord],
    env: dict[str, Any] | None = None,
    planned: tuple[str, ...] = (),
) -> Path:
    run_dir = root / run_id
    (run_dir / store.CELLS).mkdir(parents=True)
    ids = list(dict.fromkeys([r.cell_id for r in records] + list(planned)))
    manifest = Manifest(
        run_id=run_id,
        state="complete",
        created_at="2026-01-01T00:00:00.000Z",
        environment=ENV if env is None else env,
        planned=tuple(
            PlannedCell(cell_id=c, workload="batching", engine="fake", params={}, nodeid=f"t::{c}")
            for c in ids
        ),
        statuses={r.slot: r.status for r in records},
    )
    store.write_manifest(run_dir, manifest)
    for record in records:
        store.write_record(run_dir, record)
    return run_dir


def run_of(
    root: Path,
    run_id: str,
    *,
    seed: int,
    factors: dict[str, float] | None = None,
    n: int = 2000,
    cells: tuple[str, ...] = CELLS,
    env: dict[str, Any] | None = None,
) -> Path:
    factors = factors or {}
    records = [
        ok_record(c, run_id, latencies(seed * 100 + i, factors.get(c, 1.0), n))
        for i, c in enumerate(cells)
    ]
    return write_run(root, run_id, records, env)


def num(value: float | None) -> float:
    assert value is not None
    return value


def ci(m: MetricComparison) -> tuple[float, float]:
    assert m.ci95 is not None
    return m.ci95


def figure(comparison: Comparison, cell_id: str, label: str) -> MetricComparison:
    cell = next(c for c in comparison.cells if c.cell_id == cell_id)
    return next(m for m in cell.metrics if m.label == label)


def figures_tested(comparison: Comparison) -> list[MetricComparison]:
    return [m for c in comparison.cells for m in c.metrics if m.outcome != "not tested"]


# --- known answers --------------------------------------------------------------------


def test_a_a_same_distribution_is_not_significant(tmp_path: Path) -> None:
    result = compare_runs(run_of(tmp_path, "base", seed=1), run_of(tmp_path, "new", seed=2))
    assert result.exit_code == 0, result.reason
    assert result.regressions == ()
    assert [c.cell_id for c in result.cells] == list(CELLS)  # the order BASE planned
    figures = figures_tested(result)
    assert len(figures) == 6  # p50 and p99 of three cells; tput and batch are not tested
    assert {m.outcome for m in figures} == {"no change"}
    assert all(m.verdict.startswith("no significant change") for m in figures)
    assert all(m.p_adjusted is not None and m.p_adjusted >= 0.05 for m in figures)
    assert all(m.test == "mann-whitney-u" and m.n_base == m.n_new == 2000 for m in figures)
    assert all(m.ci95 is not None and m.ci95[0] < 0 < m.ci95[1] for m in figures)


def test_thirty_percent_slower_is_a_regression(tmp_path: Path) -> None:
    slow = CELLS[1]
    base, new = (
        run_of(tmp_path, "base", seed=1),
        run_of(tmp_path, "new", seed=2, factors={slow: 1.3}),
    )
    result = compare_runs(base, new, fail_within_run=True)
    assert result.exit_code == 1
    p50 = figure(result, slow, "p50")
    assert (p50.outcome, p50.verdict) == ("regression", "slower (within-run only)")
    assert p50.basis == "within-run"
    assert 0.25 < num(p50.change) < 0.35
    assert 0.2 < ci(p50)[0] < 0.3 < ci(p50)[1] < 0.4
    assert num(p50.p_adjusted) < 1e-6
    assert any(r.startswith(f"{slow}: p50 slower (within-run only) +") for r in result.regressions)
    assert "regression" in result.reason
    # judged within one run only, it is reported but does not fail by default
    default = compare_runs(base, new)
    assert (default.exit_code, default.regressions) == (0, ())
    assert figure(default, slow, "p50").outcome == "regression"
    # and in plain words: which way it moved, no "slower" verdict between runs
    assert figure(default, slow, "p50").verdict == "higher (within-run only)"
    # the other cells did not move
    assert {figure(result, c, "p50").outcome for c in (CELLS[0], CELLS[2])} == {"no change"}


def test_thirty_percent_faster_is_an_improvement(tmp_path: Path) -> None:
    fast = CELLS[0]
    result = compare_runs(
        run_of(tmp_path, "base", seed=1), run_of(tmp_path, "new", seed=2, factors={fast: 1 / 1.3})
    )
    assert result.exit_code == 0
    assert result.reason == "no significant regression"
    for label in ("p50", "p99"):
        m = figure(result, fast, label)
        assert (m.outcome, m.verdict) == ("improvement", "lower (within-run only)")
        assert -0.3 < num(m.change) < -0.17  # 1/1.3 - 1 = -23 %
        assert ci(m)[1] < 0


def test_small_detectable_shift_stays_below_the_threshold(tmp_path: Path) -> None:
    cell = (CELLS[0],)
    base = run_of(tmp_path, "base", seed=1, n=20_000, cells=cell)
    new = run_of(tmp_path, "new", seed=2, n=20_000, cells=cell, factors={CELLS[0]: 1.02})
    result = compare_runs(base, new)
    p50 = figure(result, CELLS[0], "p50")
    # statistically detectable ...
    assert num(p50.p_adjusted) < 1e-3
    assert 0 < ci(p50)[0] < 0.02 < ci(p50)[1] < 0.04
    # ... but not a change worth acting on
    assert (p50.outcome, p50.verdict) == (
        "no change",
        "no significant change (below the 5% threshold)",
    )
    assert result.exit_code == 0
    # a 1 % threshold calls it
    strict = compare_runs(base, new, threshold=0.01, fail_within_run=True)
    assert figure(strict, CELLS[0], "p50").outcome == "regression"
    assert strict.exit_code == 1


def test_figures_without_samples_or_direction_are_reported_not_tested(tmp_path: Path) -> None:
    base = run_of(tmp_path, "base", seed=1, cells=CELLS[:1])
    rec = ok_record(CELLS[0], "new", latencies(5, n=1000))  # half the requests: tput -50 %
    result = compare_runs(base, write_run(tmp_path, "new", [rec]))
    tput = figure(result, CELLS[0], "tput")
    assert tput.outcome == "not tested"
    assert tput.verdict == "not tested: no raw samples; --repeats tests it"
    assert (tput.base, tput.new, tput.change) == (200.0, 100.0, -0.5)
    assert (tput.direction, tput.p, tput.ci95) == ("higher", None, None)
    batch = figure(result, CELLS[0], "batch")
    assert batch.verdict == "not tested: informational unit 'avg'"
    assert (batch.direction, batch.change) == ("none", 0.0)
    assert result.exit_code == 0


def test_mean_uses_welch_and_samples_must_reproduce_the_figure(tmp_path: Path) -> None:
    headline = (
        Headline(label="mean", metric="e2e.mean", unit="ms", scale=1e3),
        Headline(label="p50", metric="e2e.p50", unit="ms", scale=1e3),
    )
    base = ok_record(CELLS[0], "base", latencies(1), headline=headline)
    new_e2e = latencies(2, 1.3)
    metrics = stats.to_json(stats.summarize(new_e2e))
    tampered = metrics | {"p50": stats.summarize(new_e2e).percentiles["p50"] * 0.5}
    new = ok_record(CELLS[0], "new", new_e2e, headline=headline, metrics={"e2e": tampered})
    result = compare_runs(write_run(tmp_path, "base", [base]), write_run(tmp_path, "new", [new]))
    mean = figure(result, CELLS[0], "mean")
    assert (mean.test, mean.outcome) == ("welch-t", "regression")
    assert mean.verdict == "higher (within-run only)"
    assert 0.25 < num(mean.change) < 0.35
    p50 = figure(result, CELLS[0], "p50")
    assert p50.verdict == "not tested: samples['e2e'] do not reproduce the recorded value"


def test_tail_percentile_needs_samples_that_bound_it(tmp_path: Path) -> None:
    base = run_of(tmp_path, "base", seed=1, n=300, cells=CELLS[:1])
    new = run_of(tmp_path, "new", seed=2, n=300, cells=CELLS[:1], factors={CELLS[0]: 2.0})
    result = compare_runs(base, new)
    p99 = figure(result, CELLS[0], "p99")
    assert p99.verdict == "not tested: too few samples to bound it (BASE 300, NEW 300)"
    assert figure(result, CELLS[0], "p50").outcome == "regression"


# --- statuses and coverage ------------------------------------------------------------


def test_ok_to_failed_is_a_regression_and_skipped_on_both_is_fine(tmp_path: Path) -> None:
    skipped = "batching.fake.rate=999"
    skip = records_factory.record(skipped, run_id="base", engine="fake", status=Status.SKIPPED)
    base = write_run(
        tmp_path,
        "base",
        [ok_record(c, "base", latencies(i)) for i, c in enumerate(CELLS[:2])]
        + [skip.model_copy(update={"environment": ENV})],
    )
    failed = records_factory.record(CELLS[1], run_id="new", engine="fake", status=Status.FAILED)
    new = write_run(
        tmp_path,
        "new",
        [
            ok_record(CELLS[0], "new", latencies(9)),
            failed,
            skip.model_copy(update={"run_id": "new"}),
        ],
    )
    result = compare_runs(base, new)
    assert result.exit_code == 1
    by_id = {c.cell_id: c for c in result.cells}
    assert by_id[CELLS[1]].outcome == "status regression"
    assert by_id[CELLS[1]].note == "ok in BASE, failed in NEW: it failed"
    assert by_id[skipped].outcome == "skipped on both sides"
    assert result.regressions == (f"{CELLS[1]}: ok in BASE, failed in NEW: it failed",)


def test_ok_to_skipped_is_a_missing_measurement(tmp_path: Path) -> None:
    base = run_of(tmp_path, "base", seed=1, cells=CELLS[:2])
    skip = records_factory.record(CELLS[1], run_id="new", status=Status.SKIPPED)
    new = write_run(tmp_path, "new", [ok_record(CELLS[0], "new", latencies(3)), skip])
    result = compare_runs(base, new)
    assert result.exit_code == 2
    assert [(c.cell_id, c.outcome) for c in result.cells] == [(CELLS[1], "not measured in NEW")]
    assert compare_runs(base, new, allow_missing=True).exit_code == 0


def test_no_shared_cells_fails_closed_even_with_allow_missing(tmp_path: Path) -> None:
    base = run_of(tmp_path, "base", seed=1, cells=CELLS[:1])
    new = run_of(tmp_path, "new", seed=2, cells=CELLS[1:2])
    for allow in (False, True):
        result = compare_runs(base, new, allow_missing=allow)
        assert result.exit_code == 2
        assert any("share no cells" in p for p in result.problems)
        assert {(c.cell_id, c.outcome) for c in result.cells} == {
            (CELLS[0], "only in BASE"),
            (CELLS[1], "only in NEW"),
        }
        assert all(not c.metrics for c in result.cells)


def test_missing_cell_fails_closed_unless_allowed(tmp_path: Path) -> None:
    base = run_of(tmp_path, "base", seed=1)
    new_records = [ok_record(c, "new", latencies(20 + i)) for i, c in enumerate(CELLS[:2])]
    # NEW planned the third cell but never wrote it: an interrupted run
    new = write_run(tmp_path, "new", new_records, planned=CELLS)
    result = compare_runs(base, new)
    assert result.exit_code == 2
    (problem,) = result.problems
    for part in ("--allow-missing", CELLS[2], "only in BASE", "planned there but never written"):
        assert part in problem
    assert not any(c.metrics for c in result.cells)
    allowed = compare_runs(base, new, allow_missing=True)
    assert allowed.exit_code == 0
    assert [c.outcome for c in allowed.cells if c.cell_id == CELLS[2]] == ["only in BASE"]
    assert len(figures_tested(allowed)) == 4


def test_environment_difference_fails_closed_and_names_the_field(tmp_path: Path) -> None:
    other_cpu = ENV | {"cpu": ENV["cpu"] | {"model": "Other EPYC 9654"}}
    base = run_of(tmp_path, "base", seed=1)
    new = run_of(tmp_path, "new", seed=2, env=other_cpu)
    for allow in ((), ("packages.*",)):
        result = compare_runs(base, new, allow_env=allow)
        assert result.exit_code == 2
        assert (
            "environments differ (BASE != NEW): cpu.model: 'Test Xeon 8480' != 'Other EPYC 9654'"
            in (result.problems)
        )
        assert result.cells == ()


def test_package_difference_is_accepted_only_when_allowed(tmp_path: Path) -> None:
    newer = ENV | {"packages": ENV["packages"] | {"onnxruntime": "1.21.0"}, "hostname": "b2"}
    base = run_of(tmp_path, "base", seed=1)
    new = run_of(tmp_path, "new", seed=2, env=newer)
    refused = compare_runs(base, new)
    assert refused.exit_code == 2
    assert any("packages.onnxruntime: '1.20.0' != '1.21.0'" in p for p in refused.problems)
    assert not any("hostname" in p for p in refused.problems)  # never a reason to refuse
    accepted = compare_runs(base, new, allow_env=["packages.*"])
    assert accepted.exit_code == 0
    assert accepted.accepted_env_differences == ("packages.onnxruntime: '1.20.0' != '1.21.0'",)


def test_unreadable_runs_raise_with_what_to_do(tmp_path: Path) -> None:
    base = run_of(tmp_path / "results", "20260101T000000Z-abc123", seed=1)
    with pytest.raises(CompareError, match=r"cannot read NEW run .*Pass a run directory"):
        compare_runs(base, tmp_path / "nowhere")
    with pytest.raises(
        CompareError, match="results directory holding runs 20260101T000000Z-abc123"
    ):
        compare_runs(tmp_path / "results", base)
    (base / store.CELLS / f"{CELLS[0]}.json").write_text("{not json")
    with pytest.raises(CompareError, match=r"cannot read BASE run: .*corrupt results file"):
        compare_runs(base, base)


# --- pieces ---------------------------------------------------------------------------


def test_holm_known_answer() -> None:
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_direction_and_statistic_from_units_and_paths() -> None:
    expected = {"ms": "lower", "s": "lower", "us": "lower", "ms/img": "lower", "req/s": "higher"}
    expected |= {"tok/s": "higher", "avg": "none", "%": "none", "x": "none", "MiB/min": "none"}
    assert {unit: direction(unit) for unit in expected} == expected
    p99, mean = statistic("ttft.p99"), statistic("latency.mean")
    assert p99 == Statistic("ttft", 99.0)
    assert mean == Statistic("latency", None)
    assert statistic("throughput.requests_per_s") is None
    assert statistic("e2e.p100") is None


def test_percentile_bootstrap_matches_brute_force_resampling() -> None:
    values = latencies(3, n=500)
    exact = resample_percentile(values, 90.0, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    brute = [
        stats.nearest_rank(values[rng.integers(0, values.size, values.size)], 90.0)
        for _ in range(RESAMPLES)
    ]
    qs = [0.025, 0.25, 0.5, 0.75, 0.975]
    assert np.quantile(exact, qs) == pytest.approx(np.quantile(brute, qs), rel=0.02)
    assert set(exact) <= set(values)  # every resampled percentile is an observed sample


# --- the command ----------------------------------------------------------------------


def run_cli(argv: list[str]) -> tuple[int, str]:
    args = cli.parser().parse_args(argv)
    out = io.StringIO()
    code = args.func(args, Console(file=out, width=200, color_system=None))
    return code, out.getvalue()


def test_cli_prints_the_table_exits_one_and_writes_identical_json(tmp_path: Path) -> None:
    base = run_of(tmp_path, "base", seed=1)
    new = run_of(tmp_path, "new", seed=2, factors={CELLS[2]: 1.3})
    outputs = []
    for name in ("one.json", "two.json"):
        argv = ["compare", str(base), str(new), "--fail-within-run"]
        code, text = run_cli([*argv, "--json", str(tmp_path / name)])
        assert code == 1
        outputs.append(text)
    text = outputs[0]
    assert f"regression: {CELLS[2]}: p50 slower (within-run only) +" in text
    assert "not tested: no raw samples" in text
    assert "exit 1: 2 significant regression(s)" in text  # p50 and p99
    assert "threshold 5%" in text
    one, two = (tmp_path / "one.json").read_bytes(), (tmp_path / "two.json").read_bytes()
    assert one == two
    loaded = Comparison.model_validate_json(one)
    assert (loaded.exit_code, loaded.base_run, loaded.new_run) == (1, "base", "new")
    assert loaded == Comparison.model_validate_json(two)
    assert json.loads(one)["regressions"] == list(loaded.regressions)
    # without --fail-within-run the same changes are listed as within-run only, exit 0
    code, text = run_cli(["compare", str(base), str(new)])
    assert code == 0
    assert "2 significant change(s) judged within one run only" in text
    assert "they do not fail it (--fail-within-run would)" in text
    assert f"  {CELLS[2]}: p99 higher (within-run only) +" in text
    assert "slower" not in text
    assert "judged on: within-run). exit 0: no significant regression" in text


def test_cli_options_and_errors(tmp_path: Path) -> None:
    base = run_of(tmp_path, "base", seed=1, n=10_000, cells=CELLS[:1])
    newer = ENV | {"packages": ENV["packages"] | {"onnxruntime": "1.21.0", "numpy": "2.5.0"}}
    one = CELLS[:1]
    new = run_of(tmp_path, "new", seed=2, n=10_000, cells=one, factors={one[0]: 1.04}, env=newer)
    code, text = run_cli(["compare", str(base), str(new)])
    assert code == 2
    assert "cannot compare (fails closed)" in text
    assert "packages.numpy: '2.4.6' != '2.5.0'" in text
    argv = ["compare", str(base), str(new), "--allow-env-diff", "packages.onnxruntime"]
    more = ["--allow-env-diff", "packages.numpy", "--threshold", "1", "--fail-within-run"]
    code, text = run_cli([*argv, *more])
    assert code == 1  # the 4 % shift is called under a 1 % threshold
    assert "accepted environment difference: packages.numpy: '2.4.6' != '2.5.0'" in text
    code, text = run_cli(["compare", str(base), str(tmp_path / "missing")])
    assert code == 2
    assert "error: cannot read NEW run" in text
    with pytest.raises(SystemExit):
        run_cli(["compare", str(base), str(new), "--threshold", "150"])


def _with_lag(e2e: np.ndarray, lag_p99_s: float) -> dict[str, Any]:
    return {
        "e2e": stats.to_json(stats.summarize(e2e)),
        "throughput": {"requests_per_s": e2e.size / WINDOW_S},
        "batches": {"mean_size": 1.0},
        "lag": {"p99": lag_p99_s},
    }


@pytest.mark.parametrize(
    ("lag_p99_s", "verdict"),
    [
        # a busy machine: the generator itself was up to 3 ms late, the shift is 0.3 ms
        (0.003, "no significant change (within the load generator's timing error"),
        # a quiet one: 20 us of lag resolves the same 30 % shift
        (0.00002, "slower"),
    ],
)
def test_a_latency_change_below_the_generators_lag_is_not_called(tmp_path, lag_p99_s, verdict):
    cell = CELLS[0]
    fast = latencies(1) / 10  # about 1 ms
    slow = latencies(2, 1.3) / 10
    base = ok_record(cell, "base", fast, metrics=_with_lag(fast, lag_p99_s))
    new = ok_record(cell, "new", slow, metrics=_with_lag(slow, lag_p99_s / 2))
    base_dir, new_dir = write_run(tmp_path, "base", [base]), write_run(tmp_path, "new", [new])
    result = compare_runs(base_dir, new_dir, fail_within_run=True)
    p50 = next(m for m in result.cells[0].metrics if m.label == "p50")
    assert p50.verdict.startswith(verdict)
    assert p50.floor == pytest.approx(lag_p99_s * 1e3)  # in the figure's unit (ms)
    assert 0.2 < p50.change < 0.4
    assert result.exit_code == (0 if lag_p99_s > 0.001 else 1)


# --- repeats, and what is not comparable ----------------------------------------------

SATURATED = "saturated: completed 2975 req/s of 3500 offered (85%); latency grows with the window"


def repeated_run(
    root: Path,
    run_id: str,
    *,
    seed: int,
    factor: float = 1.0,
    drift: tuple[float, ...] = (1.0, 1.07, 0.95),
    warnings: tuple[str, ...] = (),
) -> Path:
    """One cell measured once per ``drift``; each repeat's scale differs by a few percent, as
    separate processes on a shared machine do, which the requests of one repeat cannot show."""
    repeats = len(drift)
    records = [
        ok_record(
            CELLS[0],
            run_id,
            latencies(seed * 10 + r, factor * drift[r], n=2000 - 30 * r - seed),
            repeat=r + 1,
            validity=ValidityInfo(verdict="valid", warnings=warnings),
        )
        for r in range(repeats)
    ]
    return write_run(root, run_id, records)


def test_a_a_with_repeats_is_judged_between_repeats_and_passes(tmp_path: Path) -> None:
    base = repeated_run(tmp_path, "base", seed=1)
    new = repeated_run(tmp_path, "new", seed=2, drift=(1.08, 0.96, 1.01))
    # within one repeat each, the 8 % between the first repeats is "significant"
    within = compare_runs(
        write_run(
            tmp_path, "b1", [store.read_records(base)[0].model_copy(update={"run_id": "b1"})]
        ),
        write_run(tmp_path, "n1", [store.read_records(new)[0].model_copy(update={"run_id": "n1"})]),
        fail_within_run=True,
    )
    result = compare_runs(base, new)
    assert result.exit_code == 0, result.reason
    tested = figures_tested(result)
    assert {m.label for m in tested} == {"p50", "p99", "tput"}  # tput too: one per repeat
    assert {(m.basis, m.test, m.n_base, m.n_new) for m in tested} == {  # n: repeats
        ("repeats", "welch-t-repeats", 3, 3)
    }
    assert {m.outcome for m in tested} == {"no change"}
    p50 = figure(result, CELLS[0], "p50")
    assert ci(p50)[0] < 0 < ci(p50)[1]
    # the figure shown is the mean over the repeats
    values = [r.metric("e2e.p50") * 1e3 for r in store.read_records(base)]
    assert num(p50.base) == pytest.approx(float(np.mean(values)))
    assert within.exit_code == 1  # what judging on one run's requests alone would have said


def test_a_real_change_is_detected_between_repeats_with_the_right_sign(tmp_path: Path) -> None:
    base = repeated_run(tmp_path, "base", seed=1)
    slower = repeated_run(tmp_path, "new", seed=2, factor=2.0)
    result = compare_runs(base, slower)
    assert result.exit_code == 1  # no --fail-within-run needed: judged between repeats
    p50 = figure(result, CELLS[0], "p50")
    assert (p50.outcome, p50.verdict, p50.basis) == ("regression", "slower", "repeats")
    assert 0.8 < num(p50.change) < 1.2
    assert 0.5 < ci(p50)[0] < num(p50.change) < ci(p50)[1] < 1.5
    faster = compare_runs(slower, base)
    assert faster.exit_code == 0
    assert figure(faster, CELLS[0], "p50").verdict == "faster"


def test_saturated_latency_is_not_comparable_but_throughput_is(tmp_path: Path) -> None:
    base = repeated_run(tmp_path, "base", seed=1)
    new = repeated_run(tmp_path, "new", seed=2, factor=1.6, warnings=(SATURATED,))
    result = compare_runs(base, new)
    assert result.exit_code == 0, result.reason
    for label in ("p50", "p99"):
        m = figure(result, CELLS[0], label)
        assert (m.outcome, m.verdict) == ("not comparable", "not comparable: saturated in NEW")
        assert (m.p, m.ci95, m.basis) == (None, None, None)
    tput = figure(result, CELLS[0], "tput")
    assert (tput.outcome, tput.basis) == ("no change", "repeats")
    # the same without repeats: still not comparable, and said so in the summary
    one = compare_runs(
        write_run(tmp_path, "b1", [ok_record(CELLS[0], "b1", latencies(1))]),
        write_run(
            tmp_path,
            "n1",
            [
                ok_record(
                    CELLS[0],
                    "n1",
                    latencies(2, 1.6),
                    validity=ValidityInfo(verdict="valid", warnings=(SATURATED,)),
                )
            ],
        ),
        fail_within_run=True,
    )
    assert one.exit_code == 0
    assert figure(one, CELLS[0], "p99").verdict == "not comparable: saturated in NEW"
    code, text = run_cli(["compare", str(tmp_path / "b1"), str(tmp_path / "n1")])
    assert code == 0
    assert "2 not comparable" in text


def test_a_cell_invalid_for_a_measurement_reason_is_not_a_regression(tmp_path: Path) -> None:
    lagged = (
        "load-generator lag p99 7.2 ms > bound 5 ms: the client, not the system, set the timing"
    )
    failing = "error rate 3.00% > ceiling 1.00% (30 of 1000 requests failed)"
    base = write_run(
        tmp_path, "base", [ok_record(c, "base", latencies(i)) for i, c in enumerate(CELLS[:2])]
    )
    invalid = [
        ok_record(
            cell,
            "new",
            latencies(9),
            status=Status.INVALID,
            reasons=(why,),
            validity=ValidityInfo(verdict="invalid", reasons=(why,)),
        )
        for cell, why in zip(CELLS[:2], (lagged, failing), strict=True)
    ]
    result = compare_runs(base, write_run(tmp_path, "new", invalid))
    by_id = {c.cell_id: c for c in result.cells}
    assert by_id[CELLS[0]].outcome == "not comparable"
    assert by_id[CELLS[0]].note == f"ok in BASE, invalid in NEW: {lagged}"
    assert by_id[CELLS[1]].outcome == "status regression"  # failed requests are the system's
    assert result.regressions == (f"{CELLS[1]}: ok in BASE, invalid in NEW: {failing}",)
    assert result.exit_code == 1


def test_a_failed_repeat_is_not_hidden_behind_an_ok_one(tmp_path: Path) -> None:
    base = repeated_run(tmp_path, "base", seed=1)
    new = repeated_run(tmp_path, "new", seed=2)
    broken = records_factory.record(CELLS[0], run_id="new", engine="fake", status=Status.CRASHED)
    store.write_record(new, broken.model_copy(update={"repeat": 2, "attempt": 2}))
    result = compare_runs(base, new)
    assert result.cells[0].outcome == "status regression"
    assert result.cells[0].new_status == "crashed"
    assert result.exit_code == 1


def test_between_repeats_known_answer() -> None:
    xs, ys = np.array([10.0, 11.0, 12.0]), np.array([20.0, 22.0, 24.0])
    est = stats.between_repeats(xs, ys)
    assert not isinstance(est, str)
    assert est.change == pytest.approx(1.0)
    welch = __import__("scipy").stats.ttest_ind(ys, xs, equal_var=False)
    assert est.p == pytest.approx(float(welch.pvalue))
    ci_diff = welch.confidence_interval(0.95)
    assert est.ci95 == pytest.approx((ci_diff.low / 11.0, ci_diff.high / 11.0))
    assert (
        stats.between_repeats(xs[:1], ys) == "needs 2 or more repeats on both sides (BASE 1, NEW 3)"
    )
    flat = stats.between_repeats(np.ones(3), np.ones(3) * 2)
    assert isinstance(flat, str)
    assert flat.startswith("no spread")
