"""Runs the real workloads in a pytest subprocess and reads back what they recorded."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.results import store
from harness.results.records import CellRecord

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    run_dir: Path
    records: dict[str, CellRecord]


def pytest_workloads(
    tmp: Path, *args: str, results: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``pytest workloads ARGS`` in a subprocess, results under ``tmp/runs`` (or
    ``results``), generated models cached under ``tmp/cache`` unless the environment says
    where (tox shares one cache between its tests)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(REPO / "workloads"),
            "-p",
            "no:cacheprovider",
            f"--results-dir={results or tmp / 'runs'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=REPO,
        env={
            **os.environ,
            "HARNESS_CACHE_DIR": os.environ.get("HARNESS_CACHE_DIR") or str(tmp / "cache"),
        },
        check=False,
    )


def run_workloads(tmp: Path, *args: str, results: Path | None = None) -> Run:
    results = results or tmp / "runs"
    before = set(results.iterdir()) if results.is_dir() else set()
    proc = pytest_workloads(tmp, *args, results=results)
    runs = [p for p in results.iterdir() if p not in before] if results.is_dir() else []
    assert len(runs) == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    records = {r.cell_id: r for r in store.read_records(runs[0])}
    return Run(proc.returncode, proc.stdout + proc.stderr, runs[0], records)


def by_prefix_cache(run: Run, workload: str) -> dict[str, CellRecord]:
    """The run's ``workload`` cells by their ``prefix_cache`` setting; both settings there."""
    cells = {r.params["prefix_cache"]: r for r in run.records.values() if r.workload == workload}
    assert set(cells) == {"off", "on"}, list(cells)
    return {str(k): v for k, v in cells.items()}
