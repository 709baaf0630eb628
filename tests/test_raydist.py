"""harness.dist.raydist and harness.dist.remotecell without a cluster: the node side for real, Ray
itself replaced by a named fake (tests/fakeray.py) that injects losses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.dist.remotecell import node_argv, run_cell, spec_for
from harness.results import store
from harness.results.records import Status
from tests.support.runner import REPO, run_workloads

pytestmark = pytest.mark.slow

FAKE = ["-p", "tests.support.fakeray", "--cells-on=ray", "--engine=null"]
TWO_CELLS = ["-k", "test_batching and rate100 and (none or static)"]
NONE_CELL = "workloads/test_batching.py::test_batching[rate100-none-b1-null]"


def test_node_argv_drops_driver_only_options_and_selects_the_cell(tmp_path):
    args = [
        "workloads",
        "--engine=null",
        "--cells-on",
        "ray",
        "--ray-address=h:1",
        "--ray-python",
        "torch=/x/python",
        "--resume",
        "/runs/r1",
        "--results-dir=/runs",
        "--benchmark-json",
        "out.json",
        "--benchmark-autosave",
        "-k",
        "batching",
    ]
    argv = node_argv(args, NONE_CELL, tmp_path)
    assert argv[:4] == ["workloads", "--engine=null", "-k", "batching"]
    assert argv[4:] == [
        "-p",
        "no:benchmark",
        "-p",
        "no:cacheprovider",
        "-q",
        "--cells-on=local",
        f"--results-dir={tmp_path}",
        f"--harness-only={NONE_CELL}",
    ]


def test_a_node_runs_one_cell_and_returns_its_record_with_the_nodes_fingerprint(monkeypatch):
    monkeypatch.setenv("HARNESS_RAY_NODE", "10.1.2.3")
    spec = spec_for(NONE_CELL, ["workloads", "--engine=null"], REPO, sys.executable, 300)
    result = run_cell(spec)
    assert result.error == ""
    assert result.record_json is not None
    record = json.loads(result.record_json)
    assert record["cell_id"] == "batching.null.rate=100.mode=none.batch=1.delay_ms=none"
    assert record["status"] == "ok"
    assert record["environment"]["ray_node"] == "10.1.2.3"
    assert any("1 passed" in line for line in result.tail)


def test_a_cell_the_node_cannot_collect_says_so():
    spec = spec_for("workloads/test_batching.py::nope", ["workloads"], REPO, sys.executable, 60)
    result = run_cell(spec)
    assert result.record_json is None
    assert "wrote no record for workloads/test_batching.py::nope" in result.error
    assert not result.timed_out


def test_a_node_run_past_its_deadline_is_killed():
    spec = spec_for(NONE_CELL, ["workloads", "--engine=null"], REPO, sys.executable, 1)
    spec = type(spec)(spec.nodeid, spec.args, spec.cwd, spec.python, spec.env, 0.5)
    result = run_cell(spec)
    assert result.timed_out
    assert result.record_json is None
    assert "took over 0.5 s and was killed" in result.error


def test_cells_come_back_into_one_run_directory(tmp_path):
    run = run_workloads(tmp_path, *FAKE, *TWO_CELLS)
    assert run.returncode == 0, run.stdout[-3000:]
    manifest = store.read_manifest(run.run_dir)
    assert manifest.state == "complete"
    assert {r.status for r in run.records.values()} == {Status.OK}
    for record in run.records.values():
        assert record.run_id == manifest.run_id  # the node's own run id is replaced
        assert record.environment["ray_node"] == "10.99.0.7"
    assert manifest.settings["dist"]["mode"] == "ray"
    assert "ray: 1 node(s), 1 CPUs at a local Ray instance" in run.stdout


def test_a_cell_lost_to_the_cluster_is_run_again(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_FAKERAY_LOSE", "none-b1:1")
    monkeypatch.setenv("HARNESS_FAKERAY_LOG", str(tmp_path / "tries.log"))
    run = run_workloads(tmp_path, *FAKE, *TWO_CELLS, "--ray-retries=2")
    manifest = store.read_manifest(run.run_dir)
    assert {r.status for r in run.records.values()} == {Status.OK}
    (incident,) = manifest.incidents
    assert "rate100-none-b1-null]: lost to the cluster (WorkerCrashedError" in incident
    assert incident.endswith("running it again (try 2 of 3)")
    tries = (tmp_path / "tries.log").read_text().splitlines()
    assert sum("none-b1" in t for t in tries) == 2
    assert run.returncode == 1  # an incident fails the run, as a local worker restart does


def test_a_cell_lost_more_often_than_the_retries_is_recorded_crashed(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_FAKERAY_LOSE", "none-b1:9")
    run = run_workloads(tmp_path, *FAKE, *TWO_CELLS, "--ray-retries=1")
    lost = run.records["batching.null.rate=100.mode=none.batch=1.delay_ms=none"]
    assert lost.status is Status.CRASHED
    (reason,) = lost.reasons
    assert reason.startswith("lost to the cluster 2 time(s) (--ray-retries 1): WorkerCrashedError")
    assert reason.count("WorkerCrashedError") == 2
    other = run.records["batching.null.rate=100.mode=static.batch=8.delay_ms=none"]
    assert other.status is Status.OK  # the loss cost only its own cell


def test_a_task_that_fails_on_its_own_is_not_run_again(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_FAKERAY_BREAK", "static-b8")
    monkeypatch.setenv("HARNESS_FAKERAY_LOG", str(tmp_path / "tries.log"))
    run = run_workloads(tmp_path, *FAKE, *TWO_CELLS)
    broken = run.records["batching.null.rate=100.mode=static.batch=8.delay_ms=none"]
    assert broken.status is Status.FAILED
    assert broken.reasons == (
        "the Ray task failed: RayTaskError: the task raised ValueError (injected)",
    )
    tries = (tmp_path / "tries.log").read_text().splitlines()
    assert sum("static-b8" in t for t in tries) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ray-address=h:1"], "--ray-address only applies with --cells-on=ray or --clients-on"),
        (["--cells-on=mars"], "--cells-on 'mars': choose local (this machine) or ray"),
        (["-p", "tests.support.fakeray", "--cells-on=ray", "--isolation=none"], "drop --isolation"),
        (
            ["-p", "tests.support.fakeray", "--cells-on=ray", "--ray-python=torch"],
            "expected ENGINE=PATH",
        ),
        (
            ["-p", "tests.support.fakeray", "--cells-on=ray", "--ray-retries=-1"],
            "retries must be >= 0",
        ),
    ],
)
def test_bad_dist_options_are_usage_errors(tmp_path, args, message):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "workloads", "--collect-only", "-q", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ray_missing_is_a_usage_error_naming_the_extra(tmp_path):
    code = (
        "import sys, importlib.util as u; real = u.find_spec;"
        " u.find_spec = lambda n, *a: None if n == 'ray' else real(n, *a);"
        " import pytest; sys.exit(pytest.main(['workloads', '--collect-only', '-q',"
        " '--cells-on=ray']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR
    assert "pip install 'inference-harness[ray]'" in proc.stderr
