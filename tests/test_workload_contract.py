"""The workload-to-report contract: a workload declares what the reports need beside its
test (harness.results.reportspec), and ``report``, ``compare``, ``recommend`` and the
plots read it from the records, with no edit to harness/.

A toy workload, written to a temporary test file, runs on the null engine and is read
back through every report, SLOs on its own latency included (an SLO on a latency it does
not declare is refused before it runs); a typo in its headline fails the cell naming the
path; the complete example of docs/writing-a-workload.md runs; the built-in workloads'
declarations reproduce, on the committed golden runs, the reports their old records give.

The toy's runs and the documented example's are in the fast loop: the quick profile's
shortest valid window, four cells a run (two for the example), in process
(``--isolation=none``), about ten and five seconds.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
import tarfile
from pathlib import Path

import pytest

from harness import cli
from harness.results import legacyspec, store
from harness.results.records import CellRecord, PlannedCell, Status
from harness.results.reportspec import CdfPlot, ReportSpec, check_path
from tests import test_golden_outputs as golden

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "writing-a-workload.md"

TOY = """
import time

import pytest

from harness.api import CdfPlot, Evidence, Headline, Latency, Rate, ReportSpec, slo_verdicts, stats

REPORT = ReportSpec(
    throughput=Rate(
        metric="served.per_s", unit="req/s", counts="requests", completed="served.count"
    ),
    scenario=("size",),
    plots=(CdfPlot(samples="latency", what="toy latency"),),
    # its own latency, which --slo latency_pNN=... may name, with a sample per request
    latencies=(Latency(name="latency", samples="latency"),),
)


@pytest.mark.requires(family="tensor")
@pytest.mark.report_spec(REPORT)
@pytest.mark.parametrize("mode", ["fast", "slow"])
@pytest.mark.parametrize("size", [2, 3])
def test_toy(cell, open_engine, harness_settings, size, mode, tmp_path):
    engine = open_engine(tmp_path / "model")
    request = {"x": __import__("numpy").zeros((size, 4), dtype="float32")}
    latencies = []
    start = time.perf_counter()
    while time.perf_counter() - start < harness_settings.profile.window_s:
        sent = time.perf_counter()
        engine.infer(request)
        latencies.append(time.perf_counter() - sent)
    window = time.perf_counter() - start
    metrics = {
        "latency": stats.to_json(stats.summarize(latencies)),
        "served": {"per_s": len(latencies) / window, "count": len(latencies)},
    }
    metrics["slo"] = slo_verdicts(metrics, harness_settings.slos, REPORT.latency_names())
    cell.finish(
        metrics=metrics,
        evidence=Evidence(samples=len(latencies), failed=0, window_s=window),
        headline=[
            Headline(label="toy p50", metric=HEADLINE_PATH, unit="ms", scale=1e3),
            Headline(label="toy rate", metric="served.per_s", unit="req/s"),
        ],
        samples={"latency": stats.as_samples(latencies)},
        window={"duration_s": window},
    )
"""
# the quick profile's shortest valid window (its bound is 1 s), and no worker processes:
# eight cells of the toy in about ten seconds
NULL = ("--engine=null", "--engine-opt=null.service_time_s=0.001", "--window=1.01")
SLO = "--slo=latency_p99=1s"


def run_toy(
    pytester: pytest.Pytester, headline: str = "latency.p50", *args: str
) -> tuple[int, Path]:
    pytester.makepyfile(test_toy=TOY.replace("HEADLINE_PATH", repr(headline)))
    results = pytester.path / "runs"
    before = set(results.iterdir()) if results.is_dir() else set()
    result = pytester.runpytest(*NULL, *args, f"--results-dir={results}", "--isolation=none")
    (run_dir,) = set(results.iterdir()) - before
    return result.ret, run_dir


def harness(*args: str | Path) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main([str(a) for a in args])
    return code, out.getvalue()


def test_a_toy_workload_reaches_every_report_with_no_edit_to_the_harness(pytester):
    code, run = run_toy(pytester, "latency.p50", SLO)
    assert code == 0
    _, again = run_toy(pytester, "latency.p50", SLO)
    records = {r.cell_id: r for r in store.read_records(run)}
    assert set(records) == {f"toy.null.size={s}.mode={m}" for s in (2, 3) for m in ("fast", "slow")}
    assert {r.status for r in records.values()} == {Status.OK}
    spec = records["toy.null.size=2.mode=fast"].report_spec
    assert spec is not None
    assert spec.scenario == ("size",)
    planned = store.read_manifest(run).planned
    assert {p.report_spec for p in planned} == {spec}  # in the manifest too
    # --slo named the toy's own latency: each cell is judged on it, and the run keeps it
    for record in records.values():
        verdict = record.metrics["slo"]["latency_p99"]
        assert (verdict["threshold_s"], verdict["met"]) == (1.0, True)
    assert store.read_manifest(run).settings["slos"] == {"latency_p99": 1.0}

    matrix = (run / "matrix.md").read_text()
    assert "## toy" in matrix
    assert re.search(r"\| 2 \| fast \| toy p50 [0-9.]+ ms · toy rate [0-9.k]+ req/s \|", matrix)

    code, _ = harness("report", run, "--html")
    assert code == 0
    page = (run / "report.html").read_text()
    assert 'data-workload="toy"' in page
    assert "toy: toy latency CDF" in page  # the declared plot, titled by the workload
    assert (run / "plots" / "cdf-latency-toy-1.svg").is_file()
    assert "SLO applied: latency_p99&lt;=1000ms" in page  # the page decides under the run's SLO

    code, text = harness("compare", run, again)
    assert code in (0, 1), text  # 1: the machine moved a figure; either way it compared
    assert "toy.null.size=2.mode=fast" in text
    assert "toy p50" in text
    assert "toy rate" in text
    assert "4 cell(s) compared" in text

    code, text = harness("recommend", run, "--slo", "latency_p99=1s")
    assert "== toy size=2 ==" in text  # the declared scenario: a question per size
    assert "== toy size=3 ==" in text
    # the declared throughput ranks the two modes, goodput recounted from the declared
    # latency's per-request samples
    assert "SLOs applied: latency_p99<=1000ms" in text
    assert re.search(r"RECOMMENDED: null mode=(fast|slow): goodput [0-9.k]+ req/s", text)
    assert "method: goodput recounted from per-request samples" in text
    assert code == 0, text


def test_an_slo_on_a_latency_no_cell_declares_is_a_usage_error(pytester):
    """In a run, before anything is measured (no run directory), and in recommend."""
    pytester.makepyfile(test_toy=TOY.replace("HEADLINE_PATH", repr("latency.p50")))
    results = pytester.path / "runs"
    result = pytester.runpytest(*NULL, "--slo=e2e_p99=1s", f"--results-dir={results}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --slo e2e_p99: no latency named e2e in the selected cells; they declare:"
            " latency; name one of those, or declare the latency in the workload's"
            " ReportSpec(latencies=...) (docs/writing-a-workload.md)"
        ]
    )
    assert not results.exists()  # refused before any cell ran


@pytest.mark.slow  # pytest runs of the null engine
def test_a_headline_path_the_metrics_lack_fails_the_cell_naming_it(pytester):
    code, run = run_toy(pytester, headline="latency.p9")
    assert code == pytest.ExitCode.TESTS_FAILED
    record = {r.cell_id: r for r in store.read_records(run)}["toy.null.size=2.mode=fast"]
    assert record.status is Status.FAILED
    (reason,) = record.reasons
    assert "headline 'toy p50' names metrics path 'latency.p9'" in reason
    assert "latency has no 'p9' (it has: count, failed, mean, min, max, p50" in reason
    # not a blank matrix entry: the cell failed, and says why
    assert (
        "| FAILED: call: ValueError: headline 'toy p50' names metrics path 'latency.p9'"
        in (run / "matrix.md").read_text()
    )


@pytest.mark.parametrize(
    ("metrics", "path", "why"),
    [
        ({"e2e": {"p50": 1.0}}, "e2e.p50", None),
        ({"e2e": {"p50": 1.0}}, "e2x.p50", "metrics has no 'e2x' (it has: e2e)"),
        ({"e2e": 3.0}, "e2e.p50", "e2e is a float, not a dict of metrics"),
        ({"knee": None}, "knee.load", None),  # no knee found: recorded as not measured
        ({"memory": {"absent": "no sampler"}}, "memory.slope", None),
        ({"e2e": {"ci95": {}, "needs_samples": {"p99": 100}}}, "e2e.p99", None),
        ({"e2e": {"ci95": {}, "needs_samples": {"p99": 100}}}, "e2e.ci95.p99", None),
        ({"e2e": {"ci95": {}, "needs_samples": {"p99": 100}}}, "e2e.ci95.p9", "e2e.ci95 has"),
    ],
)
def test_a_path_resolves_unless_the_metrics_lack_it(metrics, path, why):
    if why is None:
        check_path(metrics, path, "headline 'x'")
    else:
        with pytest.raises(ValueError, match=re.escape(why)):
            check_path(metrics, path, "headline 'x'")


def test_a_declaration_is_checked_when_it_is_made():
    with pytest.raises(ValueError, match="declare a search"):
        ReportSpec(plots=({"kind": "load_curve"},))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a dotted metrics path"):
        ReportSpec(timing_floor="lag..p99")


def test_records_without_a_declaration_read_as_the_reports_always_assumed():
    record = CellRecord.model_validate(
        {
            "run_id": "r",
            "cell_id": "w.e",
            "workload": "w",
            "engine": "e",
            "params": {},
            "status": "skipped",
            "reasons": ["not here"],
            "started_at": "t",
            "finished_at": "t",
            "duration_s": 0.0,
        }
    )
    assert record.report_spec is None
    assert record.reporting() == legacyspec.inferred("w", record.metric)
    assert record.reporting().scenario == legacyspec.SCENARIO
    planned = PlannedCell(cell_id="w.e", workload="w", engine="e", params={}, nodeid="t::w")
    assert planned.reporting().timing_floor == "lag.p99"
    assert CdfPlot(samples="e2e", what="E2E latency") in planned.reporting().plots


# --- the documentation's example -------------------------------------------------------


def doc_example() -> str:
    text = DOC.read_text()
    marker = re.search(
        r"<!-- docs-example: workload\b[^>]*-->\n```python\n(.*?)^```", text, re.S | re.M
    )
    assert marker, "docs/writing-a-workload.md lost its '<!-- docs-example: workload -->' block"
    return marker.group(1)


def test_the_documented_workload_runs_and_is_recommended(pytester, tmp_path, monkeypatch):
    """It imports the harness through ``harness.api`` alone (the ``open_model`` fixture
    comes from workloads/conftest.py, as it does for a file saved in workloads/), and
    reaches the matrix, ``compare`` and ``recommend``."""
    imported = re.findall(r"^(?:from|import) ([\w.]+)", doc_example(), re.M)
    assert [m for m in imported if m.split(".")[0] in ("harness", "workloads")] == ["harness.api"]
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    pytester.makeconftest('pytest_plugins = ["workloads.conftest"]')
    pytester.makepyfile(test_echo=doc_example())
    results = pytester.path / "runs"
    argv = (*NULL, "--slo=e2e_p99=1s", f"--results-dir={results}", "--isolation=none")
    result = pytester.runpytest(*argv)
    assert result.ret == 0, result.stdout.str()[-3000:]
    (run,) = results.iterdir()
    records = store.read_records(run)
    assert {r.cell_id for r in records} == {"echo.null.rows=1", "echo.null.rows=8"}
    assert all(r.status is Status.OK and r.report_spec is not None for r in records)
    assert all(r.metrics["slo"]["e2e_p99"]["met"] for r in records)
    assert "## echo" in (run / "matrix.md").read_text()
    code, text = harness("compare", run, run)
    assert code == 0, text
    assert "2 cell(s) compared" in text
    code, text = harness("recommend", run, "--slo", "e2e_p99=1s")
    assert code == 0, text
    assert "== echo rows=1 ==" in text
    assert "method: goodput recounted from per-request samples" in text


# --- the built-in workloads declare what their old records were reported by ------------


def declared() -> dict[str, ReportSpec]:
    """Each built-in workload's declaration, by workload name (test_NAME -> NAME)."""
    specs: dict[str, ReportSpec] = {}
    for path in sorted((REPO / "workloads").glob("test_*.py")):
        module = importlib.import_module(f"workloads.{path.stem}")
        for name, function in vars(module).items():
            marks = getattr(function, "pytestmark", []) if name.startswith("test_") else []
            for mark in marks:
                if mark.name == "report_spec":
                    specs[name.removeprefix("test_")] = mark.args[0]
    return specs


def test_every_builtin_workload_declares_its_reporting():
    specs = declared()
    assert len(specs) >= 16
    assert all(isinstance(s, ReportSpec) for s in specs.values())


@pytest.mark.slow  # every golden report, twice
def test_the_declarations_give_the_golden_reports_of_the_old_records(tmp_path, monkeypatch):
    """The committed runs, each record and planned cell given its workload's declaration:
    every output is byte-identical to what the old records give, but the HTML page (whose
    record drill-downs now show the declarations)."""
    specs = declared()
    source = tmp_path / "source"
    with tarfile.open(golden.ARCHIVE) as tar:
        tar.extractall(source, filter="data")
    for path in source.rglob("*.json"):
        data = json.loads(path.read_text())
        for item in [data, *data.get("planned", [])]:
            if "workload" in item:
                item["report_spec"] = specs[item["workload"]].model_dump(mode="json")
        path.write_text(json.dumps(data, indent=1))
    archive = tmp_path / "declared.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(source / "golden", arcname="golden")
    monkeypatch.setattr(golden, "ARCHIVE", archive)
    produced = golden.produce(tmp_path / "out")
    index = json.loads((golden.EXPECTED / "index.json").read_text())
    page = produced.pop("html/report.html").decode()
    assert page.count("report_spec") > 0
    differ = [
        name
        for name in index["files"]
        if name in produced and produced[name] != (golden.EXPECTED / name).read_bytes()
    ]
    assert not differ
