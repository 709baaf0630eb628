"""pytest-benchmark interplay: single-stream cells feed --benchmark-json/-save/-compare(-fail)
with the harness's own samples, from the controller only, in workers and in-process."""

import importlib.util
import json
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from pydantic import ValidationError

from harness.metrics.validity import Evidence, Policy
from harness.results import records, store
from harness.results.records import CellRecord, Headline, Status
from harness.session.benchbridge import benchmark_of
from harness.session.cell import Cell
from harness.session.outcome import RunExit
from tests.support.records_factory import record

pytest_plugins = ["pytester"]
REPO = Path(__file__).resolve().parent.parent

# Two single-stream cells (one ok, one too short: invalid), one cell with many requests in
# flight (not single-stream), one plain test. The null engine answers in ~0.2 ms.
WORKLOAD = """
import time
from pathlib import Path

import numpy as np
import pytest

from harness.metrics import stats
from harness.results.records import Headline
from harness.metrics.validity import Evidence

HEADLINE = [Headline(label="p50", metric="latency.p50", unit="ms", scale=1e3)]


def finish(cell, latency, single_stream):
    cell.finish(
        metrics={"latency": {"p50": stats.nearest_rank(latency, 50.0)}},
        evidence=Evidence(samples=len(latency), failed=0, window_s=2.0),
        headline=HEADLINE,
        samples={"latency": latency},
        single_stream=single_stream,
    )


@pytest.mark.parametrize("requests", [120, 5])
def test_single(cell, open_engine, requests):
    engine = open_engine(Path("-"), options={"service_time_s": "0.0002"})
    x = {"x": np.zeros((1, 4), np.float32)}
    latency = []
    for _ in range(requests):
        t0 = time.perf_counter()
        engine.infer(x)
        latency.append(time.perf_counter() - t0)
    finish(cell, latency, "latency")


def test_many(cell):
    finish(cell, [0.001] * 100, None)


def test_plain():
    pass
"""
SINGLE = "test_wl.py::test_single[null-120]"


def run(pytester, results, *args):
    pytester.makepyfile(test_wl=WORKLOAD)
    before = set(results.iterdir()) if results.is_dir() else set()
    result = pytester.runpytest_subprocess(
        "--engine=null", f"--results-dir={results}", "-p", "no:cacheprovider", *args
    )
    (run_dir,) = set(results.iterdir()) - before
    return result, run_dir


def latest(run_dir):
    return {r.cell_id: r for r in store.read_records(run_dir)}


def worker_logs(run_dir):
    return "".join(p.read_text() for p in (run_dir / store.LOGS).glob("*.log"))


def assert_fed_from_records(out_json, run_dir):
    benches = {b["fullname"]: b for b in json.loads(out_json.read_text())["benchmarks"]}
    assert set(benches) == {SINGLE}  # not the invalid one, not the many-in-flight one
    bench = benches[SINGLE]
    rec = latest(run_dir)["single.null.requests=120"]
    samples = np.asarray(rec.samples["latency"])
    stats = bench["stats"]
    assert stats["data"] == rec.samples["latency"]
    assert (stats["rounds"], stats["iterations"]) == (samples.size, 1)
    assert (stats["min"], stats["max"]) == (samples.min(), samples.max())
    assert stats["median"] == pytest.approx(np.median(samples), rel=1e-12)
    assert stats["mean"] == pytest.approx(samples.mean(), rel=1e-12)
    assert bench["name"] == "test_single[null-120]"
    assert bench["group"] == "single"
    assert bench["params"] == {"engine_name": "null", "requests": 120}
    assert bench["extra_info"]["cell_id"] == rec.cell_id
    assert bench["extra_info"]["run_id"] == rec.run_id


def make_baseline_faster(storage):
    (saved,) = storage.rglob("0001_*.json")
    data = json.loads(saved.read_text())
    for bench in data["benchmarks"]:
        for key in ("min", "max", "mean", "median", "q1", "q3", "ld15iqr", "hd15iqr"):
            bench["stats"][key] /= 1000
    saved.write_text(json.dumps(data))


@pytest.mark.parametrize("isolation", ["process", "none"])
@pytest.mark.slow
def test_json_save_compare_and_compare_fail(pytester, isolation):
    results, storage, out = pytester.path / "r", pytester.path / "bench", pytester.path / "o.json"
    common = [f"--isolation={isolation}", f"--benchmark-storage={storage}"]

    first, run_dir = run(
        pytester, results, *common, f"--benchmark-json={out}", "--benchmark-autosave"
    )
    first.assert_outcomes(passed=4)
    assert_fed_from_records(out, run_dir)
    assert len(list(storage.rglob("*.json"))) == 1  # the controller's; a worker saves nothing
    first.stdout.fnmatch_lines(
        ["*single-stream cells not ok, not fed*", "*test_single[[]null-5[]]: invalid*"]
    )
    assert "benchmark" not in worker_logs(run_dir).lower()

    second, run_dir = run(pytester, results, *common, "--benchmark-compare")
    table = second.stdout.str()  # rows sorted by min: either may come first
    assert "benchmark 'single': 2 tests" in table
    assert "\ntest_single[null-120] (0001_unversi) " in table
    assert "\ntest_single[null-120] (NOW) " in table
    assert second.ret == RunExit.INVALID  # the requests=5 cell is invalid on purpose
    assert "benchmark" not in worker_logs(run_dir).lower()

    make_baseline_faster(storage)
    third, run_dir = run(
        pytester, results, *common, "--benchmark-compare", "--benchmark-compare-fail=min:5%"
    )
    assert third.ret != pytest.ExitCode.OK
    said = third.stdout.str() + third.stderr.str()  # pytest-benchmark logs to stderr
    assert "Performance has regressed" in said
    assert "test_single[null-120] (0001_unversi) - Field 'min' has failed" in said
    assert store.read_manifest(run_dir).state == "complete"  # the run itself is whole


@pytest.mark.slow
def test_without_pytest_benchmark_nothing_is_fed_or_imported(pytester):
    check = "import sys\n\ndef test_x():\n    assert 'pytest_benchmark' not in sys.modules\n"
    pytester.makepyfile(test_imports=check)
    result, run_dir = run(pytester, pytester.path / "r", "-p", "no:benchmark")
    result.assert_outcomes(passed=5)
    assert latest(run_dir)["single.null.requests=120"].single_stream == "latency"
    assert not list(pytester.path.rglob("*.benchmarks*"))


@pytest.mark.parametrize(
    ("option", "isolation", "outcomes", "fed"),
    [
        ("--benchmark-disable", "none", {"passed": 4}, False),
        ("--benchmark-skip", "none", {"passed": 1, "deselected": 3}, False),
        # cells run (in workers too, where pytest-benchmark would skip them) and are fed
        ("--benchmark-only", "none", {"passed": 3, "skipped": 1}, True),
        ("--benchmark-only", "process", {"passed": 3, "skipped": 1}, True),
    ],
)
@pytest.mark.slow
def test_disable_skip_and_only(pytester, option, isolation, outcomes, fed):
    out, results = pytester.path / "o.json", pytester.path / "r"
    pytester.makepyfile(test_wl=WORKLOAD)
    result = pytester.runpytest_subprocess(
        "--engine=null",
        f"--results-dir={results}",
        f"--isolation={isolation}",
        option,
        f"--benchmark-json={out}",
    )
    result.assert_outcomes(**outcomes)
    assert out.is_file() == fed
    assert results.is_dir() == (option != "--benchmark-skip")  # nothing left to run: no run
    if fed:
        assert_fed_from_records(out, next(results.iterdir()))


def _streaming_args(tmp):
    model = tmp / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 100}))
    opts = ["--engine=null-gen", "--engine-opt=null-gen.token_time_s=0.0003", f"--model={model}"]
    return ["workloads/test_streaming.py", "-k", "closed", *opts], "streaming.null-gen.load=closed"


def _shapes_args(tmp):
    pytest.importorskip("onnxruntime")
    args = ["workloads/test_shapes.py", "-k", "tiny-encoder-fixed", "--engine=onnxruntime"]
    return [*args, "--window=1.2"], "shapes.onnxruntime.model=tiny-encoder"


@pytest.mark.parametrize("workload", [_streaming_args, _shapes_args], ids=["streaming", "shapes"])
@pytest.mark.slow
def test_real_single_stream_workloads_reach_the_json(tmp_path, workload):
    args, prefix = workload(tmp_path)
    out, results = tmp_path / "o.json", tmp_path / "r"
    cmd = [*args, f"--results-dir={results}", "--isolation=none", f"--benchmark-json={out}"]
    import subprocess  # noqa: PLC0415

    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *cmd],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    (run_dir,) = results.iterdir()
    recs = [r for r in store.read_records(run_dir) if r.cell_id.startswith(prefix)]
    assert recs, proc.stdout[-3000:]
    benches = {b["extra_info"]["cell_id"]: b for b in json.loads(out.read_text())["benchmarks"]}
    for rec in recs:
        single = rec.single_stream is not None
        assert single == rec.cell_id.endswith(("level=1", "fixed")), rec.cell_id
        if single and rec.status is Status.OK:
            assert benches[rec.cell_id]["stats"]["data"] == rec.samples[rec.single_stream]
        else:
            assert rec.cell_id not in benches
    assert any(rec.status is Status.OK and rec.single_stream for rec in recs), proc.stdout[-3000:]


# -- units ---------------------------------------------------------------------------------
def test_single_stream_must_name_a_sample():
    with pytest.raises(ValidationError, match="not a sample"):
        record(single_stream="latency")  # the factory's samples are "e2e"
    assert record(single_stream="e2e").single_stream == "e2e"


def test_cell_finish_checks_the_key_and_only_measured_records_keep_it():
    cell = Cell(
        run_id="run-1",
        cell_id="c",
        workload="w",
        engine="e",
        params={},
        policy=Policy(min_window_s=0.0, min_samples=1),
        environment={},
    )
    kwargs = {
        "metrics": {"e2e": {"p50": 0.001}},
        "evidence": Evidence(samples=2, failed=0, window_s=1.0),
        "headline": [Headline(label="p50", metric="e2e.p50", unit="ms")],
        "samples": {"e2e": [0.001, 0.002]},
    }
    with pytest.raises(ValueError, match="names no samples"):
        cell.finish(**kwargs, single_stream="ttft")
    cell.finish(**kwargs, single_stream="e2e")
    assert cell.record().single_stream == "e2e"
    assert cell.record(Status.FAILED, ["teardown"]).single_stream is None


def test_schema_4_records_migrate_to_5_without_single_stream():
    old = json.loads(records.dump(record()))
    old.pop("single_stream")
    old["schema_version"] = 4
    back = records.parse(CellRecord, json.dumps(old).encode(), "v4.json")
    assert (back.schema_version, back.single_stream) == (records.SCHEMA_VERSION, None)
    assert records.SCHEMA_VERSION >= 5


@pytest.mark.skipif(
    importlib.util.find_spec("pytest_benchmark") is None, reason="no pytest-benchmark"
)
def test_every_sample_is_one_round():
    samples = [0.003, 0.001, 0.002, 0.010]
    rec = record(samples={"e2e": samples}, single_stream="e2e")
    item = SimpleNamespace(
        name="test_x[fake-a]",
        nodeid="w.py::test_x[fake-a]",
        callspec=SimpleNamespace(id="fake-a", params={"engine_name": "fake", "p": "a"}),
    )
    bench = benchmark_of(item, rec)
    assert bench.stats.data == samples
    assert (bench.stats.min, bench.stats.max, bench.stats.rounds) == (0.001, 0.010, 4)
    assert bench.stats.median == statistics.median(samples)
    as_json = bench.as_dict()
    assert as_json["fullname"] == "w.py::test_x[fake-a]"
    assert as_json["param"] == "fake-a"
    assert as_json["extra_info"]["samples"] == "e2e"


def test_the_bridge_can_be_held_in_a_set_as_pluggy_holds_plugins():
    """A plain @dataclass has no hash: with pytest-randomly beside pytest-benchmark,
    pluggy's subset_hook_caller put the bridge in a set and the session died
    (INTERNALERROR TypeError: unhashable type: 'Bridge')."""
    from harness.session.benchbridge import Bridge  # noqa: PLC0415

    bridge = Bridge(lambda: None, False)
    assert bridge in {bridge}
