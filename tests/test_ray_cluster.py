"""Cells of every workload of the ONNX Runtime quick matrix on a real Ray cluster (a head
and a worker host, CPUs only, in network namespaces this test creates), against the same
cells run locally.

A worker host is killed mid-run: only the cells it had in flight are affected, and they
are run again on the head. ``tox -e ray`` runs this (root, Ray installed); it takes about
three and a half minutes on two cores (the whole quick matrix at its own window, locally and
on the cluster, took twelve: a cell runs on a Ray node the same way whatever its workload,
so one or two cells of each workload carry the claim).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.report import matrix
from harness.results import store
from harness.results.records import Status
from tests.support.netns import NO_PHONE_HOME, Cluster, can_make_namespaces, start_ray, two_hosts
from tests.support.runner import run_workloads

pytest.importorskip("ray", reason="Ray is not installed (tox -e ray)")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
WHY_NOT = can_make_namespaces()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(WHY_NOT is not None, reason=f"no test hosts: {WHY_NOT}"),
]

REPO = Path(__file__).resolve().parents[1]
# Which cells of each workload of the quick matrix run (`-k` terms; "" for its only cell):
# every workload at least once, measured cells of each tensor, load and preprocessing
# workload, and cells that skip (generative workloads, no GPU, a precision the CPU lacks),
# whose skips must be the same on the cluster. test_the_selection_covers_every_workload
# keeps it complete when a workload is added.
CELLS = {
    "test_batching": "rate100-none-b1 or rate100-dynamic-b8",
    "test_continuous_batching": "onnxruntime-continuous-seqs4",
    "test_dataset": "closed-1",
    "test_embeddings": "embed-1-input-closed-1",  # skips: onnxruntime serves no pooling
    "test_rate_sweep": "",
    "test_capacity": "onnxruntime-none",
    "test_soak": "",
    "test_load_shape": "burst",
    "test_multimodal": "closed-1-1img-224",  # skips: onnxruntime takes no images
    "test_generative_users_sweep": "",
    "test_generative_capacity": "",
    "test_generative_soak": "",
    "test_generative_shape": "burst",
    "test_precision": "tiny-cnn and (int8 or fp16)",
    "test_precision_generative": "bf16",
    "test_preprocessing": "pil-b8-t1 or dali-gpu-b8-t1",
    "test_preprocessing_e2e": "pil-b8-pipelined",
    "test_sessions": "off",
    "test_shared_prefix": "off",
    "test_shapes": "tiny-encoder-dynamic",
    "test_speculative": "off",  # skips: onnxruntime is not generative
    "test_streaming": "closed-1",
    "test_trace": "",
}
SELECTION = " or ".join(
    f"({name} and ({cells}))" if cells else name for name, cells in CELLS.items()
)
QUICK = ["workloads", "--engine=onnxruntime", "--profile=quick", "-p", "no:cacheprovider", "-q"]
# a window as tests/test_workloads_onnxruntime.py's: statuses are what the two runs compare
MATRIX = [*QUICK, "--window=1.5", "-k", SELECTION]
KILL_AFTER_RECORDS = 6
RUN_LIMIT_S = 1800


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **NO_PHONE_HOME, **(extra or {})}
    env.setdefault("HARNESS_CACHE_DIR", str(REPO / ".tox" / "harness-cache"))
    return env


def _run_dir(results: Path) -> Path:
    (run,) = [p for p in results.iterdir() if (p / store.MANIFEST).is_file()]
    return run


def _statuses(run: Path) -> dict[str, Status]:
    return {r.cell_id: r.status for r in store.read_records(run)}


def _local_run(results: Path) -> tuple[Path, float]:
    start = time.monotonic()
    done = run_workloads(results.parent, *MATRIX[1:], results=results)
    assert done.returncode == 0, done.stdout[-6000:]
    return done.run_dir, time.monotonic() - start


def _ray_run(results: Path, head, worker, cluster: Cluster) -> tuple[Path, float, str, float]:
    log = results.parent / "ray-driver.log"
    argv = head.argv(
        [
            sys.executable,
            "-m",
            "pytest",
            *MATRIX,
            f"--results-dir={results}",
            "--cells-on=ray",
            f"--ray-address={cluster.address}",
            "--ray-retries=2",
        ]
    )
    start = time.monotonic()
    with log.open("w") as out:
        driver = subprocess.Popen(
            argv, cwd=REPO, env=_env(cluster.env), stdout=out, stderr=subprocess.STDOUT
        )
        killed_at = _kill_worker_mid_run(results, worker, driver)
        code = driver.wait(timeout=RUN_LIMIT_S)
    text = log.read_text()
    # exit 1: the lost cell is an incident (as a local worker restart is); nothing failed
    assert code == 1, text[-4000:]
    assert " failed" not in text.splitlines()[-1], text[-4000:]
    return _run_dir(results), time.monotonic() - start, text, killed_at - start


def _kill_worker_mid_run(results: Path, worker, driver: subprocess.Popen[bytes]) -> float:
    """Once a few records exist and the worker host has a cell in flight, kill every
    process on the worker host. (Killed between two cells, the host loses nothing: the
    run has no incident and exits 0, which is not what this test is about.)"""
    deadline = time.monotonic() + RUN_LIMIT_S
    while time.monotonic() < deadline and driver.poll() is None:
        cells = list(results.glob(f"*/{store.CELLS}/*.json"))
        if len(cells) >= KILL_AFTER_RECORDS and _cell_in_flight(worker):
            assert worker.kill_all() > 0, "the worker host had no processes to kill"
            return time.monotonic()
        time.sleep(0.2)
    raise AssertionError("the distributed run ended before the worker host could be killed")


def _cell_in_flight(host) -> bool:
    """Whether a cell's pytest run (harness.dist.remotecell, in its harness-cell- scratch
    directory) is running on the host."""
    for pid in host.pids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"pytest" in argv and b"harness-cell-" in argv:
            return True
    return False


def test_quick_matrix_on_a_ray_cluster_matches_the_local_run(tmp_path):
    local, local_s = _local_run(tmp_path / "local")
    with two_hosts("r") as (head, worker):
        # Ray's socket paths must fit AF_UNIX's 107 bytes: a short directory of its own
        temp = Path(tempfile.mkdtemp(prefix="hxray", dir="/tmp"))
        cluster = start_ray(head, worker, temp)
        dist, ray_s, log, killed_s = _ray_run(tmp_path / "dist", head, worker, cluster)
    addresses = (head.address, worker.address)
    figures = check_same_matrix(local, dist, addresses) | {
        "local_s": round(local_s, 1),
        "ray_s": round(ray_s, 1),
        "ratio": round(ray_s / local_s, 2),
        "worker_killed_at_s": round(killed_s, 1),
    }
    print(json.dumps(figures, indent=1))
    out = os.environ.get("HARNESS_RAY_FIGURES")
    if out:
        Path(out).write_text(json.dumps(figures, indent=1))
    assert "ray: 2 node(s)" in log


def _collected(*args: str) -> dict[str, list[str]]:
    """The cells ``pytest --collect-only`` finds, by workload function."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *(a for a in args if a != "-q"), "--collect-only", "-q"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    cells: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        if "::" in line:
            function = line.split("::")[-1].split("[")[0]
            cells.setdefault(function, []).append(line)
    return cells


def test_the_selection_covers_every_workload():
    everything, selected = _collected(*QUICK), _collected(*MATRIX)
    assert set(CELLS) == set(everything), "CELLS must name every workload of the quick matrix"
    assert set(selected) == set(everything)
    # a -k term that matches every cell of its workload would select nothing smaller
    assert sum(map(len, selected.values())) < sum(map(len, everything.values())) / 2


def check_same_matrix(local: Path, dist: Path, addresses: tuple[str, str]) -> dict[str, object]:
    """The distributed run against the local one; returns what a reader wants to know."""
    local_status, dist_status = _statuses(local), _statuses(dist)
    manifest = store.read_manifest(dist)
    # every planned cell has a record; the same cells as the local run
    assert manifest.state == "complete"
    assert set(dist_status) == set(local_status) == {c.cell_id for c in manifest.planned}
    # what the engine can and cannot run does not depend on where it ran
    for status in (Status.SKIPPED, Status.FAILED, Status.CRASHED, Status.TIMEOUT):
        assert {c for c, s in dist_status.items() if s is status} == {
            c for c, s in local_status.items() if s is status
        }, status
    # measured cells stay measured; a validity verdict may differ where two cells
    # shared this machine's two cores (a cluster's cells each have their own machine)
    measured = (Status.OK, Status.INVALID)
    assert {c for c, s in dist_status.items() if s in measured} == {
        c for c, s in local_status.items() if s in measured
    }
    flips = {
        c: (local_status[c], dist_status[c])
        for c in dist_status
        if dist_status[c] is not local_status[c]
    }
    assert len(flips) <= 3, flips
    # the killed host cost only its cells in flight: they were lost and run again
    lost = [i for i in manifest.incidents if "lost to the cluster" in i]
    assert 1 <= len(lost) <= 2, manifest.incidents
    assert all("running it again" in i for i in lost)
    nodes = {r.environment.get("ray_node") for r in store.read_records(dist)}
    assert nodes == set(addresses)  # both hosts ran cells; all came back
    # the same matrix: rows, columns and which entries have numbers
    local_matrix = matrix.build(store.read_manifest(local), store.read_records(local))
    dist_matrix = matrix.build(manifest, store.read_records(dist))
    assert [(r.workload, r.params) for r in dist_matrix.rows] == [
        (r.workload, r.params) for r in local_matrix.rows
    ]
    assert dist_matrix.engines == local_matrix.engines
    return {
        "cells": len(dist_status),
        "statuses": {
            s.value: list(dist_status.values()).count(s) for s in set(dist_status.values())
        },
        "verdict_flips": {c: [a.value, b.value] for c, (a, b) in flips.items()},
        "incidents": list(manifest.incidents),
    }
