"""Process isolation end to end: whole pytest runs in a subprocess with injected faults.

Each fault must cost its own cell only, leave the right status with the evidence (the
worker's last output), and leave every other cell of the run ok and intact.
"""

from __future__ import annotations

import contextlib
import json
import signal
from subprocess import DEVNULL, PIPE

import pytest

from harness.results import store
from harness.results.records import Status
from harness.session.outcome import RunExit
from tests.support.isolated import (
    can_unshare,
    env,
    interrupt_when,
    only_run_dir,
    pytest_argv,
    records_of,
    run,
    run_unshared,
    sigint_ignored,
    started,
    write_project,
)
from tests.support.once import once

pytestmark = pytest.mark.slow

pytest_plugins = ["pytester"]

TENSOR = [
    "none",
    "segfault",
    "exit",
    "hang",
    "leak",
    "wrong_shape",
    "cuda_error",
    "oom",
    "raise",
    "crash_load",
    "hang_load",
    "abort_close",
    "none+again",
]
GEN = ["none", "raise_mid_stream", "hang_mid_stream"]
LIMITS = (
    "--window=1.5",
    "--cell-timeout=8",
    "--load-timeout=6",
    "--request-timeout=0.5",
    "--worker-memory=600MiB",
    "--max-restarts=20",
)
EXPECTED = {
    "tensor.faulty.fault=none": Status.OK,
    "tensor.faulty.fault=none-again": Status.OK,
    "tensor.faulty.fault=segfault": Status.CRASHED,
    "tensor.faulty.fault=exit": Status.CRASHED,
    "tensor.faulty.fault=hang": Status.TIMEOUT,
    "tensor.faulty.fault=leak": Status.CRASHED,
    "tensor.faulty.fault=wrong_shape": Status.INVALID,
    "tensor.faulty.fault=cuda_error": Status.CRASHED,
    "tensor.faulty.fault=oom": Status.CRASHED,
    "tensor.faulty.fault=raise": Status.INVALID,
    "tensor.faulty.fault=crash_load": Status.CRASHED,
    "tensor.faulty.fault=hang_load": Status.TIMEOUT,
    "tensor.faulty.fault=abort_close": Status.OK,
    "gen.faulty-gen.fault=none": Status.OK,
    "gen.faulty-gen.fault=raise_mid_stream": Status.INVALID,
    "gen.faulty-gen.fault=hang_mid_stream": Status.INVALID,
}


@pytest.fixture(scope="module")
def fault_run(request):
    return once(request, _fault_run)


def _fault_run(root):
    write_project(root, TENSOR, GEN)
    proc = run(root, "--engine=faulty,faulty-gen", f"--results-dir={root / 'runs'}", *LIMITS)
    run_dir = only_run_dir(root / "runs")
    return proc, run_dir, records_of(run_dir)


def test_each_fault_gets_its_status_and_the_rest_stay_ok(fault_run):
    proc, run_dir, records = fault_run
    got = {cid: rec.status for cid, rec in records.items() if rec.status is not Status.SKIPPED}
    assert got == EXPECTED, proc.stdout[-3000:]
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED
    manifest = store.read_manifest(run_dir)
    assert manifest.state == "complete"
    assert set(manifest.statuses) == {c.cell_id for c in manifest.planned}


def test_healthy_cells_are_intact(fault_run):
    _, _, records = fault_run
    for cid in ("tensor.faulty.fault=none", "tensor.faulty.fault=none-again"):
        rec = records[cid]
        assert rec.validity is not None
        assert rec.validity.verdict == "valid"
        assert rec.metric("e2e.count") >= 200
        assert rec.metric("e2e.p50") > 0
        assert rec.metrics["errors"] == {}
        assert rec.stderr_tail == ()
        assert rec.telemetry["summary"]["rss_max_bytes"] > 0  # sampled in the worker
        assert "absent" in rec.telemetry["gpu"]  # no NVIDIA GPU here: recorded, not an error


def test_crashes_keep_the_workers_last_words(fault_run):
    _, _, records = fault_run
    seg = records["tensor.faulty.fault=segfault"]
    assert "killed by SIGSEGV" in seg.reasons[0]
    assert any("Segmentation fault" in line for line in seg.stderr_tail)
    assert any("about to dereference NULL" in line for line in seg.stderr_tail)
    ex = records["tensor.faulty.fault=exit"]
    assert "exit code 17" in ex.reasons[0]
    assert "faulty: exiting mid-run" in ex.stderr_tail
    load = records["tensor.faulty.fault=crash_load"]
    assert "exit code 13" in load.reasons[0]
    assert "while loading faulty" in load.reasons[0]
    leak = records["tensor.faulty.fault=leak"]
    assert leak.reasons[0].startswith("out of memory: the worker's processes held")
    assert "--worker-memory" in leak.reasons[0]
    assert (
        "CUDA error: an illegal memory access"
        in records["tensor.faulty.fault=cuda_error"].reasons[0]
    )
    assert "MemoryError" in records["tensor.faulty.fault=oom"].reasons[0]


def test_hangs_time_out_with_the_stack_where_they_hung(fault_run):
    _, _, records = fault_run
    hang = records["tensor.faulty.fault=hang"]
    assert hang.reasons[0].startswith("timeout: running test_faults.py::test_tensor[faulty-hang]")
    assert any("_hang" in line for line in hang.stderr_tail)  # faulthandler's dump
    load = records["tensor.faulty.fault=hang_load"]
    assert load.reasons[0].startswith("timeout: loading faulty took over 6 s")


def test_failed_requests_count_against_the_cell(fault_run):
    _, _, records = fault_run
    shape = records["tensor.faulty.fault=wrong_shape"]
    assert any(r.startswith("error rate 100.00%") for r in shape.reasons)
    assert shape.metric("e2e.adjusted.p50") == float("inf")
    [(message, count)] = shape.metrics["errors"].items()
    assert "output rows for a batch of 1" in message
    assert count >= 200
    raised = records["tensor.faulty.fault=raise"]  # a different message for every request
    assert len(raised.metrics["errors"]) == 21
    assert sum(raised.metrics["errors"].values()) == raised.metric("e2e.failed")
    stream = records["gen.faulty-gen.fault=raise_mid_stream"]
    assert stream.metrics["requests"]["failed"] == 20
    assert stream.metrics["errors"] == {"ConnectionResetError: faulty: stream reset mid-way": 20}
    assert stream.metric("ttft.adjusted.p99") == float("inf")
    hung = records["gen.faulty-gen.fault=hang_mid_stream"]
    assert hung.metrics["errors"] == {"timeout after 0.5 s": 20}
    assert hung.metrics["requests"] == {"total": 200, "ok": 180, "failed": 20, "met_slo": 180}


def test_a_crash_while_closing_keeps_the_record_and_fails_the_run(fault_run):
    proc, run_dir, records = fault_run
    rec = records["tensor.faulty.fault=abort_close"]
    assert rec.status is Status.OK
    assert rec.metric("e2e.count") >= 200
    incidents = store.read_manifest(run_dir).incidents
    assert any("abort_close" in i and "SIGABRT" in i for i in incidents)
    assert "ERROR at teardown of test_tensor[faulty-abort_close]" in proc.stdout


def test_worker_output_is_logged_in_the_run(fault_run):
    _, run_dir, _ = fault_run
    logs = sorted((run_dir / "logs").glob("*.log"))
    assert logs, "every worker's output is kept"
    text = "".join(p.read_text() for p in logs)
    assert "faulty: exiting mid-run" in text


def test_each_shared_engine_instance_gets_a_fresh_process(tmp_path):
    write_project(tmp_path, [], ["none", "none+same", "raise_mid_stream", "none+again"])
    proc = run(tmp_path, "--engine=faulty-gen", f"--results-dir={tmp_path / 'r'}")
    run_dir = only_run_dir(tmp_path / "r")
    records = records_of(run_dir)
    pid = {
        cid.split("fault=")[1]: r.engine_info["pid"]
        for cid, r in records.items()
        if cid.startswith("gen.")
    }
    assert pid["none"] == pid["none-same"]  # one configuration: one instance, loaded once
    assert len({pid["none"], pid["raise_mid_stream"], pid["none-again"]}) == 3
    assert records["gen.faulty-gen.fault=none-again"].status is Status.OK
    assert len(list((run_dir / "logs").glob("*.log"))) == 3
    assert store.read_manifest(run_dir).incidents == ()
    # raise_mid_stream is invalid on purpose (10 % failed requests): exit 10, not 0
    assert records["gen.faulty-gen.fault=raise_mid_stream"].status is Status.INVALID
    assert proc.returncode == RunExit.INVALID, proc.stdout[-2000:]


def test_restarts_are_capped(pytester):
    write_project(pytester.path, ["exit+1", "exit+2", "exit+3", "exit+4", "none"])
    result = pytester.runpytest_subprocess(
        "--engine=faulty", f"--results-dir={pytester.path / 'r'}", "--max-restarts=2"
    )
    records = records_of(only_run_dir(pytester.path / "r"))
    statuses = [records[f"tensor.faulty.fault=exit-{i}"].status for i in (1, 2, 3, 4)]
    assert statuses == [Status.CRASHED] * 3 + [Status.FAILED]
    assert records["tensor.faulty.fault=none"].status is Status.FAILED
    capped = records["tensor.faulty.fault=none"]
    assert "over the restart cap (--max-restarts=2)" in capped.reasons[0]
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=5)


def test_cells_record_the_same_under_isolation_as_in_process(pytester):
    """The plugin's own scenarios (tests/test_plugin.py) give the same statuses in workers."""
    from tests.test_plugin import CELLS  # noqa: PLC0415

    write_project(pytester.path, [])
    pytester.makepyfile(test_faults="", test_wl=CELLS)
    statuses = {}
    for mode in ("process", "none"):
        results = pytester.path / mode
        result = pytester.runpytest_subprocess(
            "--engine=fake-tensor,fake-generative,fake-unavailable",
            f"--results-dir={results}",
            f"--isolation={mode}",
        )
        result.assert_outcomes(passed=3, failed=4, skipped=6)
        run_dir = only_run_dir(results)
        statuses[mode] = {c: r.status for c, r in records_of(run_dir).items()}
        assert store.read_manifest(run_dir).state == "complete"
    assert statuses["process"] == statuses["none"]
    assert len(statuses["process"]) == 12


@pytest.mark.parametrize(
    ("sig", "isolation"),
    [(signal.SIGINT, "process"), (signal.SIGTERM, "process"), (signal.SIGINT, "none")],
    ids=["SIGINT", "SIGTERM", "SIGINT-in-process"],
)
def test_interrupt_keeps_finished_cells_and_resume_completes(tmp_path, sig, isolation):
    write_project(tmp_path, ["none", "hang+once", "none+last"])
    results = tmp_path / "r"
    args = [
        "--engine=faulty",
        f"--results-dir={results}",
        "--window=1.5",
        f"--isolation={isolation}",
    ]
    with contextlib.ExitStack() as stack:
        with sigint_ignored():  # as `cmd &`, nohup or a CI runner would start these tests
            proc = stack.enter_context(started(pytest_argv(*args), tmp_path, stdout=PIPE))
        first = lambda: any(results.glob("*/cells/tensor.faulty.fault=none.json"))  # noqa: E731
        interrupt_when(proc, first, sig, timeout=120)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-2000:]
    run_dir = only_run_dir(results)
    records = records_of(run_dir)
    assert records["tensor.faulty.fault=none"].status is Status.OK
    hung = records["tensor.faulty.fault=hang-once"]
    assert hung.status is Status.FAILED
    assert hung.reasons[0].startswith(f"interrupted by {sig.name}")
    assert "tensor.faulty.fault=none-last" not in records
    assert store.read_manifest(run_dir).state == "incomplete"
    kept = (run_dir / "cells" / "tensor.faulty.fault=none.json").read_bytes()
    (run_dir / "cells" / ".tmp-killed-writer.json").write_text('{"schema_ver')

    again = run(tmp_path, *args, f"--resume={run_dir}")
    assert again.returncode == 0, again.stdout[-3000:]
    assert "2 passed, 1 deselected" in again.stdout
    records = records_of(run_dir)
    assert {r.status for r in records.values()} == {Status.OK}
    assert records["tensor.faulty.fault=hang-once"].attempt == 2
    attempts = [r for r in store.read_all_records(run_dir) if "hang" in r.cell_id]
    assert [(r.attempt, r.status) for r in attempts] == [(1, Status.FAILED), (2, Status.OK)]
    assert (run_dir / "cells" / "tensor.faulty.fault=none.json").read_bytes() == kept
    assert not list((run_dir / "cells").glob(".tmp-*"))
    manifest = store.read_manifest(run_dir)
    assert (manifest.state, manifest.attempt) == ("complete", 2)
    assert "INTERRUPTED" not in (run_dir / "matrix.md").read_text()


def test_resume_refuses_other_options_and_bad_directories(tmp_path):
    write_project(tmp_path, ["none"])
    run(tmp_path, "--engine=faulty", f"--results-dir={tmp_path / 'r'}", "--window=1.2")
    run_dir = only_run_dir(tmp_path / "r")
    other = run(tmp_path, "--engine=faulty", "--window=1.2", "--seed=5", f"--resume={run_dir}")
    assert other.returncode == pytest.ExitCode.USAGE_ERROR
    assert "seed: was 0, now 5" in other.stderr
    (run_dir / "cells" / "tensor.faulty.fault=none.json").write_text("{not json")
    broken = run(tmp_path, "--engine=faulty", "--window=1.2", f"--resume={run_dir}")
    assert broken.returncode == pytest.ExitCode.USAGE_ERROR
    assert "tensor.faulty.fault=none.json: corrupt results file" in broken.stderr
    nowhere = run(tmp_path, "--engine=faulty", f"--resume={tmp_path}")
    assert "not a run directory" in nowhere.stderr


def test_concurrent_runs_into_one_directory_never_collide(tmp_path):
    write_project(tmp_path, ["none", "none+b"])
    results = tmp_path / "shared"
    args = pytest_argv("--engine=faulty", f"--results-dir={results}", "--window=1.2")
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(started(args, tmp_path, stdout=DEVNULL)) for _ in range(2)]
        assert [p.wait(timeout=180) for p in procs] == [0, 0]
    runs = sorted(p for p in results.iterdir() if p.is_dir())
    assert len(runs) == 2
    assert runs[0].name != runs[1].name
    for run_dir in runs:
        records = records_of(run_dir)
        assert {r.run_id for r in records.values()} == {run_dir.name}
        assert {r.status for r in records.values()} == {Status.OK}
        assert store.read_manifest(run_dir).state == "complete"


SECRET = "sk-test-0123456789abcdef"


def test_secrets_never_reach_results_and_engine_text_is_escaped(tmp_path):
    write_project(tmp_path, ["leak_secret", "none"])
    results = tmp_path / "r"
    argv = pytest_argv("--engine=faulty", f"--results-dir={results}", "--window=1.2")
    environ = {**env(), "OPENAI_API_KEY": SECRET}
    with started(argv, tmp_path, environ, stdout=PIPE, stderr=PIPE) as proc:
        out, err = proc.communicate(timeout=180)
    run_dir = only_run_dir(results)
    records = records_of(run_dir)
    leaked = records["tensor.faulty.fault=leak_secret"]
    assert leaked.status is Status.FAILED
    assert "[REDACTED]" in leaked.reasons[0]
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
    assert "faulty: using key [REDACTED]" in logs
    md = (run_dir / "matrix.md").read_text()
    assert "<script>" not in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt; \\| pipe" in md
    assert SECRET not in out + err  # the replayed failure, the summary
    assert "[REDACTED]" in out
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED


@pytest.mark.skipif(
    not can_unshare("-rm", "mount -t tmpfs -o size=16k tmpfs /mnt"),
    reason="needs unshare -rm and tmpfs mounts (a full disk)",
)
def test_a_full_disk_stops_the_run_loudly_and_keeps_what_was_written(tmp_path):
    write_project(tmp_path, [f"none+{i}" for i in range(24)])
    disk, saved = tmp_path / "disk", tmp_path / "saved"
    disk.mkdir()
    command = " ".join(pytest_argv("--engine=faulty", f"--results-dir={disk}", "--window=1.1"))
    script = (
        f"mount -t tmpfs -o size=48k tmpfs {disk} && {{ {command}; echo rc=$?; }};"
        f" cp -r {disk} {saved}"
    )
    proc = run_unshared(tmp_path, "-rm", script, timeout=600)
    out = proc.stdout + proc.stderr
    assert "rc=2" in out, out[-3000:]
    assert "no space left on the device" in out
    assert "--resume" in out
    run_dir = only_run_dir(saved)
    cells = run_dir / "cells"
    assert not list(cells.glob(".tmp-*")), "no partial record is left behind"
    records = records_of(run_dir)  # every record that exists parses
    assert 0 < len(records) < 24
    assert {r.status for r in records.values()} == {Status.OK}
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["state"] != "complete"
