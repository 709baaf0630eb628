"""Published reports name no absolute path of the machine that built them: under the
project root a path reads relative to it, under the home as ``~/...``, under a temporary
directory as ``$TMPDIR/<name>``, elsewhere as ``.../<name>``; the records keep theirs."""

from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import cli
from harness.report.publicpaths import PathStyle, project_root
from harness.results import store
from harness.results.records import Status
from tests.support.records_factory import manifest, record
from tests.support.runner import REPO, run_workloads

EXAMPLE = REPO / "results" / "example"
PUBLISHED_SUFFIXES = {".html", ".md", ".csv", ".txt", ".json", ".svg"}
MACHINE_PATH = re.compile(r"(?<![\w.~$-])/(?:work|tmp|root|home)(?![\w.-])")
"""An absolute path under a folder that names this kind of machine's layout (``/workloads``
or ``.../tmp`` are not one)."""

ROOT, HOME = Path("/work/proj"), Path("/home/ann")


@pytest.fixture
def style() -> PathStyle:
    return PathStyle.of(ROOT, HOME, (Path("/tmp"),))


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("/work/proj/.tox/bench/bin/pytest workloads", ".tox/bench/bin/pytest workloads"),
        ("--results-dir=/work/proj/results/runs -q", "--results-dir=results/runs -q"),
        ("cd /work/proj && make", "cd . && make"),
        ('"path": "/home/ann/models/m.onnx"', '"path": "~/models/m.onnx"'),
        ("HOME=/home/ann", "HOME=~"),
        ("--results-dir /tmp/tmp.QG696a0pke/onnxruntime", "--results-dir $TMPDIR/onnxruntime"),
        ("&#34;/tmp/hc/models/tiny.onnx&#34;,", "&#34;$TMPDIR/tiny.onnx&#34;,"),
        ("<code>/tmp/x/run-1</code>", "<code>$TMPDIR/run-1</code>"),
        ("cannot read /tmp/a/cells/x.json.", "cannot read $TMPDIR/x.json."),
        ("a,/tmp/a/b:/home/ann/c", "a,$TMPDIR/b:~/c"),
        ('File "/usr/lib/python3.11/asyncio/base_events.py", line 3', None),
        ("p99 1.6 ms · tput 91.1 req/s · 1/2 of /s", None),
        ("see https://example.com/a/b and </td></tr> and POST /v1/chat/completions", None),
        ("/tmp alone", "$TMPDIR alone"),
        # Markdown escapes stay part of the path, and on what replaces it
        (
            r"FAILED: cannot open /tmp/te\_st/x\_y.json |",
            r"FAILED: cannot open $TMPDIR/x\_y.json |",
        ),
        (r"| /home/ann/my\_models/m\*.onnx |", r"| ~/my\_models/m\*.onnx |"),
        (r'"/work/proj/a\\b"', r'"a\\b"'),  # JSON's escaped backslash
    ],
)
def test_text_rewrites_each_absolute_path_and_nothing_else(style, given, shown):
    expected = given if shown is None else shown
    assert style.text(given) == expected
    assert style.text(expected) == expected  # what it wrote is no path to rewrite again


def test_a_path_elsewhere_keeps_its_name_only(style):
    assert style.path("/data/models/m.onnx") == ".../m.onnx"
    assert style.path("/root/.cache/m.onnx") == ".../m.onnx"  # another user's home
    assert style.text("--model=/nfs/x/m.onnx") == "--model=.../m.onnx"
    assert style.path("relative/m.onnx") == "relative/m.onnx"
    assert style.path("/") == "/"
    assert style.path("/v1/chat/completions") == "/v1/chat/completions"  # a route


def test_the_most_specific_folder_wins():
    nested = PathStyle.of(HOME / "proj", HOME, (HOME / "tmp",))
    assert nested.path(HOME / "proj" / "runs" / "r1") == "runs/r1"
    assert nested.path(HOME / "tmp" / "x" / "r1") == "$TMPDIR/r1"
    assert nested.path(HOME / "data" / "r1") == "~/data/r1"
    under_temp = PathStyle.of(Path("/tmp/ci/proj"), HOME, (Path("/tmp"),))
    assert under_temp.path("/tmp/ci/proj/runs/r1") == "runs/r1"
    assert under_temp.path("/tmp/ci/other/r1") == "$TMPDIR/r1"


def test_a_root_or_home_of_slash_claims_nothing():
    # a container's HOME=/ must not turn every path into ~/...
    assert PathStyle.of(Path("/"), Path("/")).anchors == ()


def test_the_project_root_is_the_git_checkout_else_the_folder_itself(tmp_path):
    repo, plain = tmp_path / "repo", tmp_path / "plain"
    (repo / ".git").mkdir(parents=True)
    (repo / "a" / "b").mkdir(parents=True)
    plain.mkdir()
    assert project_root(repo / "a" / "b") == repo
    assert project_root(plain) == plain


# -- what the commands write ---------------------------------------------------------------


@dataclass(frozen=True)
class Built:
    project: Path
    home: Path
    run_dir: Path
    out: Path
    files: dict[str, str]
    """Every published text file, by its path relative to ``out``."""


def _build(project: Path, home: Path, run_dir: Path, out: Path) -> dict[str, str]:
    """``report --html`` and ``recommend`` run from ``project`` with ``home`` as $HOME,
    recommend's output kept as recommend.txt the way scripts/example-report keeps it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(project)
        mp.setenv("HOME", str(home))
        assert cli.main(["report", str(run_dir), "--html", "--out", str(out)]) == 0
        text = io.StringIO()
        argv = [
            "recommend",
            str(run_dir),
            "--slo",
            "e2e_p99=1s",
            "--json",
            str(out / "recommend.json"),
        ]
        with contextlib.redirect_stdout(text):
            assert cli.main(argv) in (0, 3)
    (out / "recommend.txt").write_text(text.getvalue())
    return {
        str(p.relative_to(out)): p.read_text()
        for p in sorted(out.rglob("*"))
        if p.suffix in PUBLISHED_SUFFIXES
    }


def _assert_no_machine_path(built: Built) -> None:
    machine = [built.project, built.home, built.run_dir, built.out]
    assert {"report.html", "matrix.md", "matrix.csv", "recommend.txt", "recommend.json"} <= set(
        built.files
    )
    assert any(name.startswith("plots/") for name in built.files)
    for name, text in built.files.items():
        for path in machine:
            assert str(path) not in text, f"{name} names {path}"
        found = MACHINE_PATH.findall(text)
        assert not found, f"{name} names absolute paths: {sorted(set(found))}"


def _synthetic_run(project: Path, home: Path, scratch: Path) -> Path:
    """A run whose command, engine description and failure reasons name paths under the
    project, the home, a temporary folder and a system folder."""
    run = store.new_run_dir(project / "results" / "runs")
    ok_id, failed_id = "batching.fake.rate=10", "batching.fake.rate=20"
    ok_params, failed_params = {"rate": 10.0, "mode": "static"}, {"rate": 20.0, "mode": "static"}
    m = manifest([(ok_id, "fake", ok_params), (failed_id, "fake", failed_params)])
    command = (
        f"{project}/.venv/bin/pytest",
        f"{project}/workloads",
        f"--results-dir={project}/results/runs",
        f"--model={home}/models/m.onnx",
        "--trace-file",
        f"{scratch}/trace.jsonl",
    )
    store.write_manifest(run, m.model_copy(update={"run_id": run.name, "command": command}))
    model = {"path": f"{home}/models/m.onnx", "loaded": f"{scratch}/cache/m.onnx"}
    store.write_record(
        run, record(ok_id, run_id=run.name, engine_info={"engine": "fake", "model": model})
    )
    store.write_record(
        run,
        record(
            failed_id,
            run_id=run.name,
            params=failed_params,
            status=Status.FAILED,
            reasons=(f"cannot open {scratch}/trace.jsonl: No such file or directory",),
            stderr_tail=(f'  File "{project}/engines/fake.py", line 1', '  File "/usr/lib/x.py"'),
        ),
    )
    return run


def test_report_and_recommend_built_from_a_synthetic_run_name_no_machine_path(tmp_path):
    project, home, scratch = tmp_path / "project", tmp_path / "home", tmp_path / "scratch"
    for folder in (project, home, scratch):
        folder.mkdir()
    run = _synthetic_run(project, home, scratch)
    out = scratch / "report"
    built = Built(project, home, run, out, _build(project, home, run, out))
    _assert_no_machine_path(built)
    page = built.files["report.html"]
    assert (
        "<code>.venv/bin/pytest workloads --results-dir=results/runs --model=~/models/m.onnx"
        " --trace-file $TMPDIR/trace.jsonl</code>"
    ) in page
    assert "&#34;path&#34;: &#34;~/models/m.onnx&#34;" in page
    assert "&#34;loaded&#34;: &#34;$TMPDIR/m.onnx&#34;" in page
    assert "engines/fake.py" in page
    assert "/usr/lib/x.py" in page  # the software's, the same on every machine
    assert "cannot open $TMPDIR/trace.jsonl" in built.files["matrix.md"]
    assert "cannot open $TMPDIR/trace.jsonl" in built.files["matrix.csv"]
    assert f"run {run.name}: results/runs/{run.name}" in built.files["recommend.txt"]
    assert "wrote $TMPDIR/recommend.json" in built.files["recommend.txt"]
    assert (
        json.loads(built.files["recommend.json"])["runs"][0]["path"] == f"results/runs/{run.name}"
    )
    # the records keep what was measured
    assert str(home) in (run / "cells" / "batching.fake.rate=10.json").read_text()


@pytest.mark.slow
def test_a_report_of_a_real_run_names_no_machine_path(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    # the generated model goes under the home: its path is shown in the engine's description
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(home / ".cache" / "harness"))
    run = run_workloads(
        project,
        "--engine=onnxruntime",
        "--profile=quick",
        "--window=1.5",
        "-k",
        "test_batching.py and rate100-none",
        results=project / "runs",
    )
    assert run.returncode == 0, run.stdout[-4000:]
    out = tmp_path / "scratch" / "report"
    built = Built(project, home, run.run_dir, out, _build(project, home, run.run_dir, out))
    _assert_no_machine_path(built)
    page = built.files["report.html"]
    assert " --results-dir=runs " in page
    assert re.search(r"&#34;~/\.cache/harness/models/tiny-cnn-[\w-]+\.onnx&#34;", page)
    assert f"run {run.run_dir.name}: runs/{run.run_dir.name}" in built.files["recommend.txt"]


def _example_leaks() -> dict[str, list[str]]:
    files = [p for p in sorted(EXAMPLE.rglob("*")) if p.suffix in PUBLISHED_SUFFIXES]
    assert files, f"no published files in {EXAMPLE}"
    return {
        str(p.relative_to(EXAMPLE)): sorted(set(found))
        for p in files
        if (found := MACHINE_PATH.findall(p.read_text()))
    }


def test_the_committed_example_names_no_absolute_path():
    assert _example_leaks() == {}
