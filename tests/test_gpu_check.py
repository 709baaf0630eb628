"""scripts/gpu-check's own plumbing, on the CPU (``--device cpu``): fingerprint, engine
availability with reasons, the conformance module, a workload run and its summary."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.runner import REPO

pytest.importorskip("onnxruntime")


def test_gpu_check_runs_its_steps_and_summarizes(tmp_path):
    out = tmp_path / "check"
    proc = subprocess.run(
        [
            str(REPO / "scripts" / "gpu-check"),
            "--device=cpu",
            f"--out={out}",
            "--budget-s=300",
            "--workloads=test_batching.py and rate100-none",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert "=== gpu-check: environment fingerprint" in text
    assert '"python"' in text  # the fingerprint itself
    summary = json.loads((out / "summary.json").read_text())
    assert summary["device"] == "cpu"
    assert summary["engines"]["onnxruntime"] == ""
    assert summary["engines"]["tensorrt"] == "tensorrt does not support device 'cpu'"
    assert summary["conformance_exit"] == 0
    ok = summary["cells"]["ok"]
    assert any(c.startswith("batching.onnxruntime.rate=100.mode=none") for c in ok)
    assert all(".tensorrt." not in c for c in ok)
