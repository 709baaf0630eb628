"""The harness beside other pytest plugins (docs/usage.md, "Beside other pytest plugins").

The plugins are those a GPU image or a user's project commonly has. ``tox -e plugins``
installs them all and sets ``HARNESS_PLUGINS_REQUIRED=1``, so there a missing plugin fails
instead of skipping; ``tox -e tests``, without them, runs what needs none.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata
import inspect
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from _pytest.config import PytestPluginManager, default_plugins
from _pytest.config.argparsing import Parser

from harness import plugin as harness_plugin
from harness.session import neighbours
from harness.session.outcome import RunExit

pytest_plugins = ["pytester"]

POPULAR = (
    "pytest-xdist",
    "pytest-benchmark",
    "pytest-cov",
    "pytest-timeout",
    "pytest-asyncio",
    "pytest-randomly",
    "pytest-rerunfailures",
    "pytest-mock",
    "pytest-html",
    "pytest-repeat",
    "hypothesis",
)
REQUIRED = os.environ.get("HARNESS_PLUGINS_REQUIRED") == "1"
ROOT = Path(__file__).resolve().parents[1]


def need(distribution: str) -> None:
    """Skip without the plugin, except where ``tox -e plugins`` says it must be here."""
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        if REQUIRED:
            pytest.fail(f"{distribution} is not installed, and HARNESS_PLUGINS_REQUIRED=1")
        pytest.skip(f"{distribution} is not installed (tox -e plugins runs this test)")


def _registered(parser: Parser) -> tuple[set[str], set[str], set[str]]:
    """Option strings, destinations and ini names a parser was given. pytest has no public
    way to list them: its groups and ini names are read from its private attributes."""
    groups = [parser._anonymous, *parser._groups]
    options = [o for g in groups for o in g.options]
    names = {n for o in options for n in o.names()}
    dests = {o.dest for o in options}
    ini: Any = getattr(parser, "_inidict", None) or getattr(parser, "_ininames", ())
    return names, dests, {str(name) for name in ini}


def _added_by(module: Any) -> tuple[set[str], set[str], set[str]]:
    hook = getattr(module, "pytest_addoption", None)
    parser = Parser(processopt=None)
    if hook is not None:
        wanted = inspect.signature(hook).parameters
        given = {"parser": parser, "pluginmanager": PytestPluginManager()}
        hook(**{k: v for k, v in given.items() if k in wanted})
    return _registered(parser)


def _core_modules() -> list[Any]:
    return [importlib.import_module(f"_pytest.{name}") for name in default_plugins]


def _plugin_modules(distribution: str) -> list[Any]:
    dist = importlib.metadata.distribution(distribution)
    return [ep.load() for ep in dist.entry_points if ep.group == "pytest11"]


def _clashes(ours: tuple[set[str], ...], theirs: tuple[set[str], ...]) -> list[str]:
    kinds = ("option", "destination", "ini name")
    return [f"{kind} {v}" for kind, a, b in zip(kinds, ours, theirs, strict=True) for v in a & b]


def test_no_harness_option_clashes_with_pytest_itself():
    ours = _added_by(harness_plugin)
    assert "--cells-on" in ours[0]
    assert "--dist" not in ours[0]
    for module in _core_modules():
        assert not _clashes(ours, _added_by(module)), module.__name__


@pytest.mark.parametrize("distribution", POPULAR)
def test_no_harness_option_clashes_with_a_popular_plugin(distribution):
    need(distribution)
    ours = _added_by(harness_plugin)
    modules = _plugin_modules(distribution)
    assert modules, f"{distribution} registers no pytest11 entry point"
    seen = [_added_by(m) for m in modules]
    assert any(names for names, _, _ in seen) or distribution == "pytest-mock"
    for module, theirs in zip(modules, seen, strict=True):
        assert not _clashes(ours, theirs), f"{distribution} ({module.__name__})"


def test_the_clash_check_sees_a_clash():
    """The check itself: a plugin registering ``--dist`` (xdist's) or a harness destination."""

    class Clashing:
        @staticmethod
        def pytest_addoption(parser: Parser) -> None:
            parser.addoption("--dist", default="no")
            parser.addoption("--elsewhere", dest="engine")

    ours = _added_by(harness_plugin)
    assert _clashes(ours, _added_by(Clashing)) == ["destination engine"]
    before = ({*ours[0], "--dist"}, ours[1], ours[2])  # the harness before --cells-on
    assert "option --dist" in _clashes(before, _added_by(Clashing))


def test_every_installed_pytest_plugin_leaves_the_harness_options_alone():
    """Beyond the popular list: whatever else this environment has installed."""
    ours = _added_by(harness_plugin)
    for dist in importlib.metadata.distributions():
        if dist.metadata["Name"] == "inference-harness":
            continue
        for ep in dist.entry_points:
            if ep.group == "pytest11":
                assert not _clashes(ours, _added_by(ep.load())), ep.value


# ---- what each plugin does to a run -------------------------------------------------------

ONE_CELL = ("workloads/test_batching.py", "--engine=null", "-k", "rate100 and mode=none")


def _project(pytester: pytest.Pytester) -> None:
    for name in ("workloads", "engines", "conftest.py", "pyproject.toml"):
        target = pytester.path / name
        if not target.exists():
            target.symlink_to(ROOT / name)


def _run(pytester: pytest.Pytester, results: Path, *args: str) -> pytest.RunResult:
    _project(pytester)
    return pytester.runpytest_subprocess(
        *args, f"--results-dir={results}", "-p", "no:cacheprovider", "--window=1.5", timeout=300
    )


def _only_run(results: Path) -> Path:
    runs = sorted(results.iterdir()) if results.is_dir() else []
    assert len(runs) == 1, runs
    return runs[0]


def _records(run_dir: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted((run_dir / "cells").glob("*.json")):
        record = json.loads(path.read_text())
        out[record["cell_id"]] = record
    return out


@pytest.mark.slow
@pytest.mark.parametrize("harness_option", [True, False], ids=["--engine", "bare"])
def test_xdist_n_is_refused_and_writes_no_run(pytester, tmp_path, harness_option):
    need("pytest-xdist")
    _project(pytester)
    results = tmp_path / "runs"
    args = ["workloads/test_batching.py", "-k", "rate100", "-n", "2", "-p", "no:randomly"]
    if harness_option:  # refused at configuration, before any xdist worker starts
        args += ["--engine=null", f"--results-dir={results}"]
    # bare: each xdist worker leaves the cells out, and the controller says why
    result = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider", timeout=300)
    assert result.ret == RunExit.USAGE_ERROR
    said = (result.stderr if harness_option else result.stdout).str()
    assert "ERROR: pytest-xdist's -n/--numprocesses" in said
    assert "--clients N" in said
    assert "--cells-on=ray" in said
    assert not results.exists()
    assert not (pytester.path / "results").exists()


@pytest.mark.slow
def test_xdist_installed_without_n_changes_nothing(pytester, tmp_path):
    need("pytest-xdist")
    with_xdist = _run(pytester, tmp_path / "a", *ONE_CELL, "-p", "xdist")
    without = _run(pytester, tmp_path / "b", *ONE_CELL, "-p", "no:xdist")
    assert with_xdist.ret == without.ret == RunExit.OK
    a, b = _records(_only_run(tmp_path / "a")), _records(_only_run(tmp_path / "b"))
    assert list(a) == list(b) == ["batching.null.rate=100.mode=none.batch=1.delay_ms=none"]
    assert {r["status"] for r in (*a.values(), *b.values())} == {"ok"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["reruns", "count", "flaky"])
def test_reruns_and_repeats_of_a_cell_are_refused(pytester, tmp_path, kind):
    distribution = {"reruns": "pytest-rerunfailures", "flaky": "pytest-rerunfailures"}
    need(distribution.get(kind, "pytest-repeat"))
    extra = {"reruns": ["--reruns=2"], "count": ["--count=3"], "flaky": []}[kind]
    if kind == "flaky":
        pytester.makeconftest(
            "import pytest\n"
            "def pytest_collection_modifyitems(items):\n"
            "    for item in items:\n"
            "        item.add_marker(pytest.mark.flaky(reruns=1))\n"
        )
    result = _run(pytester, tmp_path / "runs", *ONE_CELL, *extra)
    assert result.ret == RunExit.USAGE_ERROR
    expected = "*pytest-repeat's --count*--repeats N*" if kind == "count" else "*--resume RUN_DIR*"
    result.stderr.fnmatch_lines([f"ERROR: {expected}"])
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_pytest_timeout_does_not_kill_a_cell_the_harness_bounds(pytester, tmp_path):
    """A 1.5 s window under --timeout=1: the worker's cells carry timeout(0); the
    harness's own --cell-timeout stays the one that records ``timeout``."""
    need("pytest-timeout")
    result = _run(pytester, tmp_path / "ok", *ONE_CELL, "--timeout=1")
    assert result.ret == RunExit.OK
    assert {r["status"] for r in _records(_only_run(tmp_path / "ok")).values()} == {"ok"}
    bounded = _run(pytester, tmp_path / "t", *ONE_CELL, "--timeout=1", "--cell-timeout=0.5")
    (record,) = _records(_only_run(tmp_path / "t")).values()
    assert bounded.ret == RunExit.FAILED
    assert record["status"] == "timeout", record["reasons"]


@pytest.mark.slow
def test_a_cell_measured_under_coverage_is_marked(pytester, tmp_path):
    need("pytest-cov")
    result = _run(pytester, tmp_path / "runs", *ONE_CELL, "--cov=harness", "--cov-report=")
    assert result.ret == RunExit.OK
    run_dir = _only_run(tmp_path / "runs")
    (record,) = _records(run_dir).values()
    (warning,) = record["validity"]["warnings"]
    assert warning.startswith("measured under a Python tracer (coverage.")
    assert "(!)" in (run_dir / "matrix.md").read_text()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["pytest_plugins"]["settings"]["_cov"]["cov_source"] == ["harness"]


@pytest.mark.slow
def test_random_order_and_reseeding_leave_cells_and_their_traffic_alone(pytester, tmp_path):
    """pytest-randomly shuffles items and reseeds ``random`` and numpy's global generator
    before every test: the cells, their ids and their order stay those of the collection,
    and their seeded traffic (arrivals, prompts, datasets, inputs, traces) is the same."""
    need("pytest-randomly")
    _project(pytester)
    digest_file = tmp_path / "traffic.txt"
    pytester.makepyfile(test_traffic=TRAFFIC_TEST.format(out=str(digest_file)))
    args = [
        "workloads/test_batching.py",
        "test_traffic.py",
        "--engine=null",
        "-k",
        "rate100 or traffic",
    ]
    digests, planned = [], []
    for i, order in enumerate(
        [
            ("-p", "no:randomly"),
            ("-p", "randomly", "--randomly-seed=1"),
            ("-p", "randomly", "--randomly-seed=2"),
        ]
    ):
        result = _run(pytester, tmp_path / f"r{i}", *args, *order)
        assert result.ret == RunExit.OK, result.stdout.str()[-2000:]
        digests.append(digest_file.read_text())
        manifest = json.loads((_only_run(tmp_path / f"r{i}") / "manifest.json").read_text())
        planned.append([c["cell_id"] for c in manifest["planned"]])
        records = _records(_only_run(tmp_path / f"r{i}"))
        assert list(records) == sorted(planned[-1])
        if i:
            assert manifest["pytest_plugins"]["settings"]["randomly"]["randomly_seed"] == i
    assert planned[0] == planned[1] == planned[2]
    assert len(planned[0]) == 3
    assert digests[0] == digests[1] == digests[2]
    assert len(digests[0].split()) == 6


TRAFFIC_TEST = """
import hashlib, json
import numpy as np
from harness.load.arrivals import Arrivals, OpenLoop
from workloads.lib import datasets, inputs, prompts, tracegen

def _h(value):
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()

def test_traffic_is_seeded():
    np.random.seed(12345)  # what a reseeding plugin does; the traffic must not notice
    parts = [
        _h(OpenLoop(rate=100, duration=2).schedule(7).tolist()),
        _h(OpenLoop(50, 2, arrivals=Arrivals.GAMMA, burstiness=3).schedule(7).tolist()),
        _h([(r.prompt, r.max_tokens) for r in prompts.text_requests(16, 7, (32, 8, 64))]),
        _h([e.prompt_text for e in datasets.default_dataset(7, n=32).entries]),
        _h(inputs.lengths(np.random.default_rng(7), 16, 32, 8, 64)),
        _h(tracegen.rows(7)),
    ]
    open({out!r}, "w").write("\\n".join(parts))
"""


# ---- the process's tracer ---------------------------------------------------------------


def test_tracing_names_a_tracer_and_is_none_without_one():
    assert neighbours.tracing() is None
    assert neighbours.tracing_warning() is None

    class FakeTracer:  # a fake of coverage's tracer, for the detection only
        def __call__(self, frame: Any, event: str, arg: Any) -> None:
            return None

    tracer = FakeTracer()
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        found = neighbours.tracing()
    finally:
        sys.settrace(previous)
    assert (
        found
        == f"{__name__}.test_tracing_names_a_tracer_and_is_none_without_one.<locals>.FakeTracer"
    )
    threading.settrace(tracer)
    try:
        assert neighbours.tracing_warning().startswith("measured under a Python tracer (")
    finally:
        threading.settrace(None)  # type: ignore[arg-type]


def test_no_traffic_code_draws_from_a_global_random_generator():
    """A reseeding plugin (pytest-randomly) resets ``random`` and numpy's global generator
    before every test: traffic drawn from either would change with it. Every generator in
    harness/, engines/ and workloads/ is made from a seed (``np.random.default_rng``,
    ``random.Random``)."""
    allowed_np = {"default_rng", "Generator", "SeedSequence", "PCG64", "Philox", "BitGenerator"}
    found = []
    for path in sorted(
        [*ROOT.glob("harness/**/*.py"), *ROOT.glob("engines/*.py"), *ROOT.glob("workloads/*.py")]
    ):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or not isinstance(
                node.value, ast.Name | ast.Attribute
            ):
                continue
            owner = ast.unparse(node.value)
            if owner in ("np.random", "numpy.random") and node.attr not in allowed_np:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {owner}.{node.attr}")
            if owner == "random" and node.attr not in ("Random", "SystemRandom"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: random.{node.attr}")
    assert not found, found
    sample = "import numpy as np\nx = np.random.rand(3)\n"
    assert any(
        isinstance(n, ast.Attribute) and n.attr == "rand" for n in ast.walk(ast.parse(sample))
    )


def test_manifest_names_the_session_plugins(pytester, tmp_path):
    _project(pytester)
    config = pytester.parseconfigure("-p", "no:cacheprovider")
    active = neighbours.active(config)
    names = {p["name"] for p in active["plugins"]}
    assert "inference-harness" in names
    assert active["pytest"] == pytest.__version__
    digest = hashlib.sha256(json.dumps(active, sort_keys=True).encode()).hexdigest()
    assert len(digest) == 64  # plain JSON: the manifest can hold it
