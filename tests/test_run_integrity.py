"""One run never mixes two measurements, and its exit status says what it measured.

Whole pytest runs in a subprocess with the fault engines (tests/faults.py): a resumed
run refuses other inputs and a second writer, a killed controller leaves a resumable
run, and the exit status is decided by the records (invalid, incomplete, failed).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from harness.results import store
from harness.results.records import Status
from harness.session.outcome import RunExit
from tests.support.isolated import (
    can_unshare,
    env,
    only_run_dir,
    pytest_argv,
    records_of,
    run,
    run_unshared,
    write_project,
)
from workloads.lib import models

pytestmark = pytest.mark.slow

LIMITS = ("--engine=faulty", "--window=1.2")


@pytest.fixture
def model(tmp_path, monkeypatch):
    """A real ONNX file at a path the user owns (the faulty engine does not read it)."""
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "user.onnx"
    shutil.copy(models.embedded("tiny-encoder", seed=0).path, path)
    return path


def test_resume_refuses_a_model_whose_content_changed_at_the_same_path(tmp_path, model):
    write_project(tmp_path, ["none", "exit+once"])
    results = tmp_path / "r"
    args = (*LIMITS, f"--model={model}", f"--results-dir={results}")
    first = run(tmp_path, *args)
    run_dir = only_run_dir(results)
    assert records_of(run_dir)["tensor.faulty.fault=exit-once"].status is Status.CRASHED
    assert first.returncode == RunExit.FAILED
    recorded = store.read_manifest(run_dir).provenance["model"]
    assert recorded["sha256"] == models.embedded("tiny-encoder", seed=0).sha256

    shutil.copy(models.embedded("tiny-encoder", seed=1).path, model)  # same inputs, other weights
    refused = run(tmp_path, *args, f"--resume={run_dir}")
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR, refused.stdout[-2000:]
    assert f"--model {model} has other content than when the run started" in refused.stderr
    assert store.read_manifest(run_dir).attempt == 1  # nothing of the run was touched

    shutil.copy(models.embedded("tiny-encoder", seed=0).path, model)
    resumed = run(tmp_path, *args, f"--resume={run_dir}")
    assert resumed.returncode == RunExit.OK, resumed.stdout[-3000:]
    assert {r.status for r in records_of(run_dir).values()} == {Status.OK}


def test_resume_refuses_other_engine_packages(tmp_path):
    """The manifest's record of the engine packages is what a resume is checked against."""
    write_project(tmp_path, ["none", "exit+once"])
    results = tmp_path / "r"
    run(tmp_path, *LIMITS, f"--results-dir={results}")
    run_dir = only_run_dir(results)
    path = run_dir / store.MANIFEST
    data = json.loads(path.read_text())
    data["provenance"]["packages"]["numpy"] = "0.0.1"
    path.write_text(json.dumps(data))
    refused = run(tmp_path, *LIMITS, f"--resume={run_dir}")
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR
    assert "package numpy: 0.0.1 then," in refused.stderr


def _start_hanging_run(tmp_path):
    """A run whose second cell hangs (its first try only); its third has not started."""
    write_project(tmp_path, ["none", "hang+once", "none+last"])
    results = tmp_path / "r"
    args = (*LIMITS, f"--results-dir={results}", "--cell-timeout=120")
    proc = subprocess.Popen(
        pytest_argv(*args),
        cwd=tmp_path,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # SIGKILL of the controller alone, as a crash would
    )
    deadline = time.monotonic() + 120
    while not any(results.glob("*/cells/tensor.faulty.fault=none.json")):
        assert proc.poll() is None, "the run ended early"
        assert time.monotonic() < deadline, "the first cell never finished"
        time.sleep(0.1)
    time.sleep(1.0)  # the hanging cell is in flight
    return proc, only_run_dir(results), args


def test_a_second_writer_is_refused_and_a_killed_run_is_resumable(tmp_path):
    proc, run_dir, args = _start_hanging_run(tmp_path)
    try:
        second = run(tmp_path, *args, f"--resume={run_dir}")
        assert second.returncode == pytest.ExitCode.USAGE_ERROR, second.stdout[-2000:]
        assert f"is being written by pid {proc.pid}" in second.stderr
        assert store.read_manifest(run_dir).attempt == 1
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # no chance to write anything more
        proc.communicate(timeout=30)
    _wait_for_workers_to_die(run_dir)
    assert store.read_manifest(run_dir).state == "running"  # as the controller left it

    resumed = run(tmp_path, *args, f"--resume={run_dir}")
    assert resumed.returncode == RunExit.OK, resumed.stdout[-3000:]
    records = records_of(run_dir)
    assert {r.status for r in records.values()} == {Status.OK}
    assert records["tensor.faulty.fault=hang-once"].attempt == 2
    manifest = store.read_manifest(run_dir)
    assert (manifest.state, manifest.attempt) == ("complete", 2)


def _wait_for_workers_to_die(run_dir, timeout=30.0):
    """A worker dies with its controller (PR_SET_PDEATHSIG); give the kernel a moment."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = subprocess.run(
            ["pgrep", "-f", f"harness-worker.*{run_dir.parent.parent}"],
            capture_output=True,
            check=False,
        )
        if found.returncode != 0:
            return
        time.sleep(0.2)


def test_an_invalid_cell_makes_the_run_exit_10(tmp_path):
    """A cell whose every request failed is invalid; pytest passed it and exited 0."""
    write_project(tmp_path, ["none", "wrong_shape"])
    proc = run(tmp_path, *LIMITS, f"--results-dir={tmp_path / 'r'}")
    records = records_of(only_run_dir(tmp_path / "r"))
    assert records["tensor.faulty.fault=wrong_shape"].status is Status.INVALID
    assert proc.returncode == RunExit.INVALID == 10, proc.stdout[-3000:]
    assert "INVALID: 1 cell(s) measured outside the profile's bounds" in proc.stdout
    assert "tensor.faulty.fault=wrong_shape" in proc.stdout.split("INVALID:")[-1]


def test_a_run_left_incomplete_exits_11_and_names_the_missing_cells(tmp_path):
    proc, run_dir, args = _start_hanging_run(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    _wait_for_workers_to_die(run_dir)
    narrower = run(tmp_path, *args, f"--resume={run_dir}", "-k", "last")
    assert narrower.returncode == RunExit.INCOMPLETE == 11, narrower.stdout[-3000:]
    assert "resume: planned cells not collected this time: tensor.faulty.fault=hang-once" in (
        narrower.stdout
    )
    assert f"finish the run with --resume {run_dir}" in narrower.stdout
    assert records_of(run_dir)["tensor.faulty.fault=none-last"].status is Status.OK
    assert store.read_manifest(run_dir).state == "incomplete"


def test_a_run_of_ok_and_skipped_cells_exits_0(tmp_path):
    write_project(tmp_path, ["none"], ["none"])  # the generative cell skips on a tensor engine
    proc = run(tmp_path, *LIMITS, f"--results-dir={tmp_path / 'r'}")
    statuses = {r.status for r in records_of(only_run_dir(tmp_path / "r")).values()}
    assert statuses == {Status.OK, Status.SKIPPED}
    assert proc.returncode == RunExit.OK, proc.stdout[-3000:]


@pytest.mark.parametrize("where", ["file", "under-file", "proc"])
def test_a_results_dir_that_cannot_be_written_is_a_usage_error(tmp_path, where):
    write_project(tmp_path, ["none"])
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    target = {"file": a_file, "under-file": a_file / "runs", "proc": "/proc/harness-runs"}[where]
    proc = run(tmp_path, *LIMITS, f"--results-dir={target}")
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout[-2000:]
    assert f"--results-dir '{target}'" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "INTERNALERROR" not in proc.stdout + proc.stderr


READ_ONLY_PROBE = "mount --bind /tmp /tmp && mount -o remount,bind,ro /tmp"


@pytest.mark.skipif(
    not can_unshare("-m", READ_ONLY_PROBE), reason="needs unshare -m and bind mounts (root)"
)
def test_a_read_only_results_dir_is_a_usage_error(tmp_path):
    write_project(tmp_path, ["none"])
    results = tmp_path / "ro"
    results.mkdir()
    command = " ".join(pytest_argv(*LIMITS, f"--results-dir={results}"))
    script = (
        f"mount --bind {results} {results} && mount -o remount,bind,ro {results} && exec {command}"
    )
    proc = run_unshared(tmp_path, "-m", script, timeout=120)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout[-2000:] + proc.stderr
    assert f"--results-dir '{results}': cannot write files there: Read-only file system" in (
        proc.stderr
    )
    assert "INTERNALERROR" not in proc.stdout + proc.stderr


def test_resume_refuses_a_record_planted_from_another_run(tmp_path):
    """A well-formed record of another run, under the right name, in place of this run's."""
    write_project(tmp_path, ["none", "exit+once"])
    first, second = tmp_path / "a", tmp_path / "b"
    run(tmp_path, *LIMITS, f"--results-dir={first}")
    run(tmp_path, *LIMITS, f"--results-dir={second}")  # exit+once no longer fires: ok
    target, donor = only_run_dir(first), only_run_dir(second)
    name = "tensor.faulty.fault=exit-once.json"
    assert records_of(donor)["tensor.faulty.fault=exit-once"].status is Status.OK
    (target / "cells" / name).unlink()
    shutil.copy(donor / "cells" / name, target / "cells" / name)
    refused = run(tmp_path, *LIMITS, f"--resume={target}")
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR, refused.stdout[-2000:]
    assert "damaged results files would be built on:" in refused.stderr
    assert f"{target / 'cells' / name}: holds a record of run '{donor.name}'" in refused.stderr
    assert store.read_manifest(target).attempt == 1
