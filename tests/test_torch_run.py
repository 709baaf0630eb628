"""The tensor workloads on ``--engine=torch`` (eager, quick profile, shortened window):
every cell that runs on ONNX Runtime runs on the baseline too, with its settings in the
record; and the GPU overhead benchmark (benchmarks/gpu_overhead.py) on the CPU. Needs
torch (``tox -e torch``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.results.records import Status
from tests.support.runner import REPO, run_workloads

pytestmark = pytest.mark.slow

pytest.importorskip("torch", reason="torch is not installed (tox -e torch)")


def test_batching_and_shapes_run_on_the_torch_baseline(tmp_path):
    result = run_workloads(
        tmp_path,
        "--engine=torch",
        "--engine-opt=torch.threads=1",
        "--window=1.5",
        "--requests=120",
        "-k",
        "(test_batching.py and rate100) or test_shapes.py"
        " or (test_precision.py and not int8 and not generative)",
    )
    assert result.returncode == 0, result.stdout[-4000:]
    by_workload: dict[str, list] = {}
    for rec in result.records.values():
        by_workload.setdefault(rec.workload, []).append(rec)
    assert len(by_workload["batching"]) == 3
    assert len(by_workload["shapes"]) == 6
    assert len(by_workload["precision"]) == 4  # fp16 and bf16 on both embedded models
    for rec in by_workload["precision"]:
        assert rec.status is Status.OK, (rec.cell_id, rec.reasons)
        m = rec.metrics
        assert m["speedup"]["p50_ratio"] > 0
        assert (
            rec.engine_info["effective"]["dtype"]
            == {"fp16": "float16", "bf16": "bfloat16"}[m["precision"]]
        )
        assert rec.engine_info["reference"]["effective"]["dtype"] == "float32"
        first = next(iter(m["agreement"]["outputs"].values()))
        assert first["max_abs"] > 0  # a reduced precision moves the outputs
    for rec in [r for w, rs in by_workload.items() if w != "precision" for r in rs]:
        assert rec.status is Status.OK, (rec.cell_id, rec.reasons)
        assert rec.engine == "torch"
        info = rec.engine_info
        assert info["engine"] == "torch"
        assert info["effective"]["mode"] == "eager"
        assert info["effective"]["torch_threads"] == 1
        assert info["embedded_model"]["name"] in ("tiny-cnn", "tiny-cnn-dynhw", "tiny-encoder")


def test_the_gpu_overhead_benchmark_runs_on_the_cpu(tmp_path):
    """benchmarks/gpu_overhead.py as a device run calls it, on the CPU to check the script:
    both ways measured, the ratio theirs, the machine's fingerprint beside them."""
    out, md = tmp_path / "overhead.json", tmp_path / "overhead.md"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu_overhead",
            "--device=cpu",
            "--model=tiny-cnn",
            "--iterations=100",
            "--rounds=2",
            "--warmup=5",
            "--threads=1",
            f"--out={out}",
            f"--md={md}",
        ],
        cwd=REPO,
        env={**os.environ, "HARNESS_CACHE_DIR": os.environ.get("HARNESS_CACHE_DIR", str(tmp_path))},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    plain, harness = doc["plain"], doc["harness"]
    assert plain["timer"] == "perf_counter"
    assert plain["count"] == harness["count"] == 100
    assert 0 < plain["median_s"] <= plain["p99_s"]
    assert 0 < harness["median_s"] <= harness["p99_s"]
    assert doc["ratio"] == pytest.approx(harness["median_s"] / plain["median_s"])
    assert doc["added_latency_s"] == pytest.approx(harness["median_s"] - plain["median_s"])
    assert len(doc["rounds"]) == 2
    assert doc["model"]["name"] == "tiny-cnn"
    assert doc["model"]["sha256"]
    assert doc["inputs"] == {"image": [1, 3, 64, 64]}
    assert doc["engine"]["effective"]["torch_threads"] == 1
    assert {"cpu", "python", "packages", "gpu"} <= doc["environment"].keys()
    assert "| plain loop | perf_counter |" in md.read_text()
    assert "ratio of medians" in proc.stdout
