"""A/A and A/B on real runs: ``compare`` must come out clean when nothing changed, and
still find a change that is there, with the right sign.

* A/A on ONNX Runtime, as a user runs it (no ``--repeats``): two quick runs of the same
  cells back to back, one of them saturated (rate 3500 with no batching completes about
  two thirds of what is offered here). The saturated cell's latency is not comparable, the
  other figures are judged within one run only and fail nothing: exit 0, and no
  "faster"/"slower" verdict anywhere.
* A/A and A/B on the null engine with ``--repeats 3``: a fixed service time of 2 ms against
  the same, and against 6 ms. Judged between repeats, the A/A passes and the A/B is a
  regression of about +200 % in p50, and an improvement the other way round.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from harness import cli
from harness.report.compare import Comparison, compare_runs
from tests.support.once import once
from tests.support.runner import run_workloads

pytestmark = pytest.mark.slow

ORT_CELLS = (
    "test_batching and (rate100-none-b1 or rate3500-none-b1) or test_shapes and tiny-encoder-fixed"
)
SATURATED = "batching.onnxruntime.rate=3500.mode=none.batch=1.delay_ms=none"
NULL_CELL = "test_batching and rate100-none-b1"
NULL_ID = "batching.null.rate=100.mode=none.batch=1.delay_ms=none"


def compare_cli(base: Path, new: Path) -> tuple[int, str]:
    args = cli.parser().parse_args(["compare", str(base), str(new)])
    out = io.StringIO()
    code = args.func(args, Console(file=out, width=240, color_system=None))
    return code, out.getvalue()


def verdicts(comparison: Comparison, cell_id: str) -> dict[str, str]:
    (cell,) = [c for c in comparison.cells if c.cell_id == cell_id]
    return {m.label: m.verdict for m in cell.metrics}


@pytest.fixture(scope="module")
def ort_pair(request: pytest.FixtureRequest) -> tuple[Path, Path]:
    pytest.importorskip("onnxruntime")
    return once(request, _ort_pair)


def _ort_pair(tmp: Path) -> tuple[Path, Path]:
    runs = []
    for _ in range(2):
        run = run_workloads(
            tmp, "--engine=onnxruntime", "--profile=quick", "--window=1.5", "-k", ORT_CELLS
        )
        assert set(run.records) >= {SATURATED}, run.stdout[-3000:]
        runs.append(run.run_dir)
    return runs[0], runs[1]


def test_an_a_a_pair_on_onnxruntime_is_clean(ort_pair: tuple[Path, Path]) -> None:
    base, new = ort_pair
    code, text = compare_cli(base, new)
    assert code == 0, text[-4000:]
    assert "slower" not in text
    assert "faster" not in text
    comparison = compare_runs(base, new)
    assert comparison.regressions == ()
    latency = verdicts(comparison, SATURATED)
    for label in ("p50", "p99"):
        assert latency[label].startswith("not comparable: saturated in "), latency
    # throughput is still compared (reported: no raw samples without repeats)
    assert latency["tput"].startswith("not tested: no raw samples")
    judged = [m for c in comparison.cells for m in c.metrics if m.basis is not None]
    assert judged  # the unsaturated cells were tested, within one run each
    assert {m.basis for m in judged} == {"within-run"}


@pytest.fixture(scope="module")
def null_runs(request: pytest.FixtureRequest) -> dict[str, Path]:
    return once(request, _null_runs)


def _null_runs(tmp: Path) -> dict[str, Path]:
    out = {}
    # 2 ms against 6 ms: a change far above a busy machine's generator lag (the floor)
    for name, service_s in (("one", "0.002"), ("one-again", "0.002"), ("two", "0.006")):
        run = run_workloads(
            tmp,
            "--engine=null",
            f"--engine-opt=null.service_time_s={service_s}",
            "--profile=quick",
            "--window=1.5",
            "--repeats=3",
            "-k",
            NULL_CELL,
        )
        assert run.returncode == 0, run.stdout[-3000:]
        out[name] = run.run_dir
    return out


def test_an_a_a_pair_with_repeats_is_judged_between_repeats_and_passes(
    null_runs: dict[str, Path],
) -> None:
    comparison = compare_runs(null_runs["one"], null_runs["one-again"])
    assert comparison.exit_code == 0, comparison.reason
    (cell,) = [c for c in comparison.cells if c.cell_id == NULL_ID]
    tested = [m for m in cell.metrics if m.basis is not None]
    assert {m.label for m in tested} >= {"p50", "p99"}
    assert {(m.basis, m.n_base, m.n_new) for m in tested} == {("repeats", 3, 3)}


def test_a_real_change_is_detected_with_the_right_sign(null_runs: dict[str, Path]) -> None:
    slower = compare_runs(null_runs["one"], null_runs["two"], allow_env=["*"])
    assert slower.exit_code == 1, slower.reason
    p50 = next(m for c in slower.cells for m in c.metrics if m.label == "p50")
    assert (p50.outcome, p50.verdict, p50.basis) == ("regression", "slower", "repeats")
    assert p50.change is not None
    assert 1.5 < p50.change < 2.5  # 2 ms -> 6 ms of service: about +200 %
    faster = compare_runs(null_runs["two"], null_runs["one"], allow_env=["*"])
    assert faster.exit_code == 0
    p50 = next(m for c in faster.cells for m in c.metrics if m.label == "p50")
    assert (p50.outcome, p50.verdict) == ("improvement", "faster")
