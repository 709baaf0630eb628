"""The pytest plugin, driven through pytester: usage errors, records for every cell."""

import json
from pathlib import Path

import pytest

from harness.engine import EngineConfig, EngineError, registry
from harness.results import store
from harness.session.pool import EnginePool
from tests.support.fakes import FakeGenerativeEngine, FakeTensorEngine, FakeUnavailableEngine

pytest_plugins = ["pytester"]


@pytest.fixture
def fakes():
    with (
        registry.registered("fake-tensor", FakeTensorEngine),
        registry.registered("fake-generative", FakeGenerativeEngine),
        registry.registered("fake-unavailable", FakeUnavailableEngine),
    ):
        yield


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--engine=nope"],
            "unknown engine 'nope'; registered engines: lmdeploy, null, null-gen, onnxruntime",
        ),
        (["--engine=onnxruntime,nope"], "unknown engine 'nope'"),
        (["--profile=slow"], "--profile 'slow' is not a profile; choose one of: quick, full"),
        (["--window=-1"], "--window must be a positive number of seconds, got -1.0"),
        (["--window=nan"], "--window must be a positive number of seconds"),
        (["--requests=0"], "--requests must be >= 1, got 0"),
        (["--model=/no/such/model.onnx"], "--model '/no/such/model.onnx' does not exist"),
        (["--device=gpu"], "--device 'gpu': use cpu, cuda or cuda:N"),
        (["--seed=-3"], "--seed must be >= 0, got -3"),
        (["--dim=sequence=abc"], "--dim sequence=abc: the size must be a positive integer"),
        (
            ["--engine-opt=onnxruntime.threads=2"],
            "--engine-opt for onnxruntime: unknown option(s) threads",
        ),
        (["--engine-opt=vllm.x=1"], "expected ENGINE.OPTION=VALUE with ENGINE one of onnxruntime"),
    ],
)
def test_bad_options_are_usage_errors(pytester, args, message):
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])
    assert "Traceback" not in result.stderr.str()


def test_unknown_engine_lists_every_registered_engine(pytester, fakes):
    result = pytester.runpytest("--engine=nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*registered engines: fake-generative, fake-tensor, fake-unavailable, lmdeploy, null*"]
    )


CELLS = """
import pytest
from harness.results.records import Headline
from harness.metrics.validity import Evidence

@pytest.mark.requires(family="tensor")
@pytest.mark.parametrize("n", [100, 5])
def test_measure(cell, open_engine, n, tmp_path):
    engine = open_engine(tmp_path / "model")
    assert engine.loaded
    cell.finish(
        metrics={"x": {"p50": 0.001}},
        evidence=Evidence(samples=n, failed=0, window_s=2.0),
        headline=[Headline(label="p50", metric="x.p50", unit="ms", scale=1e3)],
        seeds={"inputs": 7},
    )

def test_boom(cell):
    raise RuntimeError("workload exploded")

def test_forgot_to_finish(cell):
    pass

def test_not_a_cell():
    pass
"""


def run_cells(pytester, *extra):
    pytester.makepyfile(test_wl=CELLS)
    results = pytester.path / "runs"
    engines = "--engine=fake-tensor,fake-generative,fake-unavailable"
    result = pytester.runpytest(engines, f"--results-dir={results}", "--isolation=none", *extra)
    (run_dir,) = list(results.iterdir())
    return result, run_dir


def test_every_planned_cell_leaves_a_record_with_its_status(pytester, fakes):
    result, run_dir = run_cells(pytester)
    records = {r.cell_id: r for r in store.read_records(run_dir)}
    status = {cid: r.status.value for cid, r in records.items()}
    assert status == {
        "measure.fake-tensor.n=100": "ok",
        "measure.fake-tensor.n=5": "invalid",
        "measure.fake-generative.n=100": "skipped",
        "measure.fake-generative.n=5": "skipped",
        "measure.fake-unavailable.n=100": "skipped",
        "measure.fake-unavailable.n=5": "skipped",
        "boom.fake-tensor": "failed",
        "boom.fake-generative": "failed",
        "boom.fake-unavailable": "skipped",
        "forgot_to_finish.fake-tensor": "failed",
        "forgot_to_finish.fake-generative": "failed",
        "forgot_to_finish.fake-unavailable": "skipped",
    }
    ok = records["measure.fake-tensor.n=100"]
    start = ok.engine_info.pop("start")  # how long loading took: recorded, not measured
    assert start["in_this_cell"] is True
    assert start["seconds"] >= 0
    assert ok.engine_info == {"engine": "fake-tensor", "version": "0-fake", "options": {}}
    assert ok.seeds == {"inputs": 7}
    assert ok.environment["python"]["version"]
    assert "commit" in ok.environment["git"]
    invalid = records["measure.fake-tensor.n=5"]
    assert invalid.reasons == (
        "5 successful samples < minimum 100",
        "p99 needs >= 100 samples, have 5",
    )
    assert invalid.validity is not None
    assert invalid.validity.verdict == "invalid"
    # beside the workload's metrics, the energy the harness adds where telemetry ran: this
    # cell's Evidence gave no span, and a CPU machine has no NVML, so it is absent either way
    assert invalid.metrics["x"] == {"p50": 0.001}
    assert list(invalid.metrics) == ["x", "energy"]
    assert list(invalid.metrics["energy"]) == ["absent"]
    assert records["measure.fake-generative.n=5"].reasons == (
        "fake-generative lacks capability family=tensor that this workload needs",
    )
    assert records["measure.fake-unavailable.n=5"].reasons == (
        "fake-unavailable needs hardware this test lacks",
    )
    assert "RuntimeError: workload exploded" in records["boom.fake-tensor"].reasons[0]
    assert records["forgot_to_finish.fake-tensor"].reasons == (
        "call: the workload ended without reporting a result (Cell.finish was never called)",
    )
    manifest = store.read_manifest(run_dir)
    assert manifest.state == "complete"
    assert len(manifest.planned) == 12
    assert manifest.statuses == {cid: r.status for cid, r in sorted(records.items())}
    # pytest agrees with the records: ok, invalid and the plain test pass; a cell that
    # never reported a result fails.
    result.assert_outcomes(passed=3, failed=4, skipped=6)


def test_matrix_is_written_at_session_end_and_printed(pytester, fakes):
    result, run_dir = run_cells(pytester)
    md = (run_dir / "matrix.md").read_text()
    assert "| 100 | p50 1 ms | SKIPPED: fake-generative lacks capability family=tensor" in md
    assert "| 5 | INVALID: 5 successful samples &lt; minimum 100" in md
    result.stdout.fnmatch_lines(
        ["*harness result matrix*", "*cells: 4 failed, 1 invalid, 1 ok, 6 skipped*"]
    )
    assert (run_dir / "matrix.csv").is_file()


def test_the_terminal_summary_shows_the_matrix_as_plain_text(pytester, fakes, monkeypatch):
    # issue 35: matrix.md is escaped for Markdown (&lt;); the terminal gets the text as is
    monkeypatch.setenv("COLUMNS", "300")  # wide enough that no entry wraps
    result, run_dir = run_cells(pytester)
    assert "5 successful samples &lt; minimum 100" in (run_dir / "matrix.md").read_text()
    out = result.stdout.str()
    assert "INVALID: 5 successful samples < minimum 100" in out
    assert "&lt;" not in out
    assert "|---|" not in out  # no Markdown table syntax either


def test_interrupted_run_is_visibly_incomplete(pytester, fakes):
    _, run_dir = run_cells(pytester, "--maxfail=1")
    manifest = store.read_manifest(run_dir)
    assert manifest.state == "incomplete"
    assert len(manifest.planned) == 12
    assert 0 < len(manifest.statuses) < 12
    assert "MISSING (no record: interrupted?)" in (run_dir / "matrix.md").read_text()
    assert json.loads((run_dir / "manifest.json").read_text())["state"] == "incomplete"


def test_non_cell_runs_create_no_run_directory(pytester):
    pytester.makepyfile(test_plain="def test_x():\n    assert True\n")
    results = pytester.path / "runs"
    result = pytester.runpytest(f"--results-dir={results}")
    result.assert_outcomes(passed=1)
    assert not results.exists()


def test_engine_options_reach_the_adapter(pytester, fakes):
    pytester.makepyfile(
        test_opt="""
def test_o(cell, open_engine, tmp_path):
    engine = open_engine(tmp_path / "m")
    assert engine.config.options == {"fail": "infer"}
    assert cell.engine_info["options"] == {"fail": "infer"}
"""
    )
    result = pytester.runpytest(
        "--engine=fake-tensor",
        "--engine-opt=fake-tensor.fail=infer",
        f"--results-dir={pytester.path / 'r'}",
        "--isolation=none",
    )
    result.assert_outcomes(failed=1)  # no result reported, but the option arrived
    result.stdout.fnmatch_lines(["*Cell.finish was never called*"])
    result.stdout.fnmatch_lines(["*cells: 1 failed*"])


def test_cells_run_grouped_by_engine_in_option_order(pytester, fakes):
    pytester.makepyfile(test_wl=CELLS)
    results = pytester.path / "runs"
    pytester.runpytest(
        "--engine=fake-unavailable,fake-tensor", f"--results-dir={results}", "--isolation=none"
    )
    (run_dir,) = list(results.iterdir())
    engines = [c.engine for c in store.read_manifest(run_dir).planned]
    assert engines == ["fake-unavailable"] * 4 + ["fake-tensor"] * 4


def test_engine_pool_keeps_one_engine_and_remembers_failures():
    pool = EnginePool()
    a = pool.get(("a",), lambda: FakeTensorEngine(EngineConfig(model=Path("m"))))
    assert pool.get(("a",), lambda: pytest.fail("must reuse")) is a
    b = pool.get(("b",), lambda: FakeTensorEngine(EngineConfig(model=Path("m"))))
    assert a.closed
    assert not b.closed

    def broken():
        raise EngineError("no such model")

    with pytest.raises(EngineError, match=r"^no such model$"):  # the first cell: the reason
        pool.get(("c",), broken)
    assert b.closed
    with pytest.raises(EngineError, match="earlier cell: no such model"):
        pool.get(("c",), lambda: pytest.fail("must not retry a failed load"))
    assert pool.close_all() == []
