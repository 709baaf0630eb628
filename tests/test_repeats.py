"""``--repeats N``: every cell measured N times, each in a fresh worker process, the
repeats kept as records of one cell, and a resume that reruns only the repeats lacking an
ok record. Whole pytest runs in a subprocess with the fault engine (tests/support)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from harness.exceptions import UsageError
from harness.results import store
from harness.results.records import Status
from harness.session.pytestoptions import parse_settings
from tests.support.isolated import only_run_dir, run, write_project

pytestmark = pytest.mark.slow

NONE, FLAKY = "tensor.faulty.fault=none", "tensor.faulty.fault=segfault-once"


def test_each_repeat_is_a_fresh_worker_and_a_resume_reruns_only_what_failed(tmp_path):
    write_project(tmp_path, ["none", "segfault+once"])
    args = ["--engine=faulty", f"--results-dir={tmp_path / 'r'}", "--window=1.2", "--repeats=3"]
    first = run(tmp_path, *args)
    assert first.returncode == pytest.ExitCode.TESTS_FAILED, first.stdout[-3000:]
    assert "1 failed, 5 passed" in first.stdout  # two cells, three times each
    run_dir = only_run_dir(tmp_path / "r")
    records = store.read_all_records(run_dir)
    assert [(r.cell_id, r.repeat, r.attempt, r.status) for r in records] == [
        (NONE, 1, 1, Status.OK),
        (NONE, 2, 1, Status.OK),
        (NONE, 3, 1, Status.OK),
        (FLAKY, 1, 1, Status.CRASHED),  # the fault fires once: in the first repeat
        (FLAKY, 2, 1, Status.OK),
        (FLAKY, 3, 1, Status.OK),
    ]
    names = sorted(p.name for p in (run_dir / "cells").iterdir())
    assert names == [f"{c}{s}.json" for c in (NONE, FLAKY) for s in ("", "@2", "@3")]
    # a fresh process per repeat: the engine's pid differs between all of them
    pids = [r.engine_info["pid"] for r in records if r.cell_id == NONE]
    assert len(set(pids)) == 3
    logs = sorted(p.name for p in (run_dir / "logs").iterdir())
    assert [n for n in logs if "repeat" in n] == [
        "attempt1-repeat2-worker2-faulty.log",
        "attempt1-repeat3-worker3-faulty.log",
    ]
    # interleaved: every cell once before any cell a second time
    order = sorted(records, key=lambda r: r.started_at)
    assert [r.repeat for r in order] == [1, 1, 2, 2, 3, 3]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["settings"]["repeats"] == 3
    assert manifest["statuses"] == {
        FLAKY: "crashed",
        f"{FLAKY}@2": "ok",
        f"{FLAKY}@3": "ok",
        NONE: "ok",
        f"{NONE}@2": "ok",
        f"{NONE}@3": "ok",
    }
    # the matrix shows the repeat that went worst, never an ok one over a failed one
    matrix = (run_dir / "matrix.md").read_text()
    assert "CRASHED" in matrix
    assert "Each cell was measured 3 times (--repeats)" in matrix

    other = run(tmp_path, "--engine=faulty", "--window=1.2", "--repeats=2", f"--resume={run_dir}")
    assert other.returncode == pytest.ExitCode.USAGE_ERROR
    assert "option repeats: was 3, now 2" in other.stderr

    again = run(tmp_path, *args, f"--resume={run_dir}")
    assert again.returncode == 0, again.stdout[-3000:]
    assert "1 passed, 1 deselected" in again.stdout  # the failed repeat of one cell only
    latest = {r.slot: r for r in store.read_records(run_dir)}
    assert (latest[FLAKY].attempt, latest[FLAKY].status) == (2, Status.OK)
    assert {r.status for r in latest.values()} == {Status.OK}
    assert len(latest) == 6
    manifest = store.read_manifest(run_dir)
    assert (manifest.state, manifest.attempt) == ("complete", 2)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repeats=0"], "--repeats must be between 1 and 100, got 0"),
        (["--repeats=2", "--isolation=none"], "it needs --isolation=process (the default)"),
    ],
)
def test_bad_repeats_are_usage_errors(tmp_path, argv, message):
    write_project(tmp_path, ["none"])
    result = run(tmp_path, "--engine=faulty", f"--results-dir={tmp_path / 'r'}", *argv)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_repeats_on_a_ray_cluster_are_refused_at_configuration(monkeypatch):
    real = importlib.util.find_spec  # Ray stands as installed
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "ray" else real(name)
    )
    with pytest.raises(UsageError, match="not supported with --cells-on=ray yet"):
        parse_settings(
            engine=["null"],
            device="cpu",
            profile="quick",
            results_dir="r",
            seed=0,
            cells_on="ray",
            repeats=2,
        )
    settings = parse_settings(
        engine=["null"], device="cpu", profile="quick", results_dir="r", seed=0, repeats=4
    )
    assert (settings.repeats, settings.to_json()["repeats"]) == (4, 4)
