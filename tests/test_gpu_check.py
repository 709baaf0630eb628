"""scripts/gpu-check on the CPU: its steps (fingerprint, engine availability with reasons,
the conformance module, a workload run, the per-engine summary), and its verdict: a check
where no engine ran a cell on the device fails, whatever pytest's exit status says."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.engine import registry
from harness.results.records import Status
from tests.support.records_factory import record
from tests.support.runner import REPO

pytest.importorskip("onnxruntime")


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


gpu_check = _module()


def _check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "check"
    proc = subprocess.run(
        [str(REPO / "scripts" / "gpu-check"), f"--out={out}", "--budget-s=300", *args],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    return proc, json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_gpu_check_runs_its_steps_and_summarizes_per_engine(tmp_path):
    proc, summary = _check(
        tmp_path, "--device=cpu", "--workloads=test_batching.py and rate100-none"
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert "=== gpu-check: environment fingerprint" in text
    assert '"python"' in text  # the fingerprint itself
    assert "=== gpu-check: per engine on cpu" in text
    assert "gpu-check: PASS: onnxruntime ran real cells (exit 0" in text
    assert summary["device"] == "cpu"
    assert (summary["exit"], summary["verdict"]) == (0, "PASS: onnxruntime ran real cells")
    ort = summary["engines"]["onnxruntime"]
    assert (ort["verdict"], ort["unavailable"], ort["failed"]) == ("RAN", "", [])
    assert ort["cells_ok"] == 1
    assert ort["conformance_passed"] > 5
    assert ort["skipped"]["TestOnnxRuntimeCudaGraphs: CUDA graphs need a cuda device"] > 0
    trt = summary["engines"]["tensorrt"]
    assert (trt["verdict"], trt["cells_ok"]) == ("SKIPPED", 0)
    assert trt["unavailable"] == "tensorrt does not support device 'cpu'"
    assert summary["engines"]["openai"]["unavailable"].startswith("a client of a server")
    assert len(summary["run_dirs"]) == 1
    [cell] = json.loads((tmp_path / "check" / "cells.json").read_text())
    assert (cell["engine"], cell["status"]) == ("onnxruntime", "ok")
    assert cell["headline"]


@pytest.mark.slow
def test_gpu_check_fails_where_no_engine_ran_on_the_gpu(tmp_path):
    if any(registry.status(n, "cuda").availability.available for n in ("onnxruntime", "torch")):
        pytest.skip("an engine can run on cuda here: this test is for machines without a GPU")
    proc, summary = _check(tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 3, text[-4000:]
    why = "FAIL: no engine ran a real cell on this device (all skipped)"
    assert summary["verdict"] == why
    assert f"gpu-check: {why} (exit 3" in text
    assert summary["run_dirs"] == []
    for name in ("onnxruntime", "tensorrt", "lmdeploy", "tensorrt-llm"):
        assert summary["engines"][name]["verdict"] == "SKIPPED"
        assert summary["engines"][name]["unavailable"]
    line = next(t for t in text.splitlines() if t.startswith("tensorrt "))
    assert "SKIPPED" in line
    assert "cells 0 ok" in line


# -- the verdict, from fabricated outcomes -------------------------------------------------


def _reports(*names: str):
    return {n: gpu_check.EngineReport(n, "tensor") for n in names}


def test_an_ok_cell_is_what_counts_as_ran():
    reports = _reports("tensorrt", "onnxruntime")
    gpu_check.add_cells(
        reports,
        [
            record("batching.tensorrt.rate=10", engine="tensorrt"),
            record("batching.onnxruntime.rate=10", engine="onnxruntime", status=Status.SKIPPED),
            record("batching.onnxruntime.rate=20", engine="onnxruntime", status=Status.INVALID),
            record("batching.other.rate=10", engine="other"),  # not an engine of this check
        ],
    )
    assert (reports["tensorrt"].verdict(), reports["tensorrt"].cells_ok) == ("RAN", 1)
    ort = reports["onnxruntime"]
    assert (ort.verdict(), ort.cells_ok, ort.cells_invalid) == ("SKIPPED", 0, 1)
    assert ort.skipped == {"cell: it skipped": 1}
    assert gpu_check.verdict(reports, []) == (0, "PASS: tensorrt ran real cells")


def test_all_skipped_or_only_invalid_is_not_a_pass():
    reports = _reports("tensorrt")
    assert gpu_check.verdict(reports, []) == (
        3,
        "FAIL: no engine ran a real cell on this device (all skipped)",
    )
    gpu_check.add_cells(reports, [record(engine="tensorrt", status=Status.INVALID)])
    assert gpu_check.verdict(reports, [])[0] == 3


@pytest.mark.parametrize("status", [Status.FAILED, Status.CRASHED, Status.TIMEOUT])
def test_a_failed_cell_fails_the_check_even_beside_cells_that_ran(status):
    reports = _reports("tensorrt", "onnxruntime")
    gpu_check.add_cells(
        reports,
        [
            record("batching.onnxruntime.rate=10", engine="onnxruntime"),
            record("batching.tensorrt.rate=10", engine="tensorrt", status=status),
        ],
    )
    assert reports["tensorrt"].verdict() == "FAILED"
    assert reports["tensorrt"].failed == [
        f"batching.tensorrt.rate=10 ({status.value}): it {status.value}"
    ]
    assert gpu_check.verdict(reports, []) == (1, "FAIL: tensorrt failed")
    assert gpu_check.verdict(_reports("x"), ["the tensor workload run exited 4"]) == (
        1,
        "FAIL: the tensor workload run exited 4",
    )


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_gpu_conformance.TestOnnxRuntimeTensorRT" name="test_a">
  <skipped type="pytest.skip" message="tests/test_gpu_conformance.py:70: needs libnvinfer.so.10"/>
</testcase>
<testcase classname="tests.test_gpu_conformance.TestOnnxRuntime" name="test_b"/>
<testcase classname="tests.test_gpu_conformance.TestTensorRT" name="test_c">
  <failure message="AssertionError: outputs differ">trace</failure>
</testcase>
<testcase classname="tests.test_gpu_conformance.TestTorchCudaGraphs" name="test_d">
  <error message="fixture failed">trace</error>
</testcase>
</testsuite></testsuites>
"""


def test_conformance_outcomes_go_to_the_engine_each_class_tests(tmp_path):
    junit = tmp_path / "c.xml"
    junit.write_text(JUNIT)
    reports = _reports("onnxruntime", "tensorrt", "torch")
    assert gpu_check.add_conformance(reports, junit) == 2
    ort = reports["onnxruntime"]
    assert ort.passed == 1
    assert ort.skipped == {"TestOnnxRuntimeTensorRT: needs libnvinfer.so.10": 1}
    assert reports["tensorrt"].failed == ["TestTensorRT.test_c: AssertionError: outputs differ"]
    assert reports["torch"].failed == ["TestTorchCudaGraphs.test_d: fixture failed"]
    # passing conformance alone is not running: only measured cells are
    assert gpu_check.verdict(_reports("onnxruntime"), [])[0] == 3
    assert gpu_check.add_conformance(reports, tmp_path / "absent.xml") == 0


def test_the_per_engine_lines_say_ran_skipped_why_and_failed():
    report = gpu_check.EngineReport("tensorrt", "tensor", unavailable="tensorrt is not installed")
    report.skip("TestTensorRT: tensorrt is not installed")
    report.skip("TestTensorRT: tensorrt is not installed")
    lines = report.lines()
    assert lines[0].split()[:2] == ["tensorrt", "SKIPPED"]
    assert "cannot run here: tensorrt is not installed" in lines[1]
    assert "skipped x2: TestTensorRT: tensorrt is not installed" in lines[2]


def test_cells_json_has_one_short_line_per_cell_with_status_headline_and_energy(tmp_path):
    """On the first H200 run the run directory tarball was 59 MB: cells.json is what a
    remote machine's check is read back by (issue 30)."""
    energy = {"joules": 402.123456, "window_s": 3.0, "samples": 30, "source": "nvml"}
    records = [
        record("batching.torch.rate=10", engine="torch", p50=0.0021),
        record(
            "precision.torch.precision=fp16",
            engine="torch",
            metrics={"e2e": {"p50": 0.001}, "energy": energy},
        ),
        record(
            "shapes.torch.mode=dynamic",
            engine="torch",
            metrics={"e2e": {"p50": 0.001}, "energy": {"absent": "no NVML here"}},
        ),
        record("batching.torch.rate=20", engine="torch", status=Status.INVALID),
        record("batching.tensorrt.rate=10", engine="tensorrt", status=Status.SKIPPED),
    ]
    path = tmp_path / "cells.json"
    gpu_check.write_cells(path, records)
    text = path.read_text()
    assert len(text.splitlines()) == len(records) + 2  # one cell a line, inside [ ]
    cells = {c["cell"]: c for c in json.loads(text)}
    assert cells["batching.torch.rate=10"] == {
        "cell": "batching.torch.rate=10",
        "engine": "torch",
        "status": "ok",
        "headline": "p50 2.10 ms",
        "reasons": [],
        "energy": {"absent": "not recorded"},
    }
    assert cells["precision.torch.precision=fp16"]["energy"] == {
        "joules": 402.123,
        "mean_power_w": 134.0,
    }
    assert cells["shapes.torch.mode=dynamic"]["energy"] == {"absent": "no NVML here"}
    assert cells["batching.torch.rate=20"]["status"] == "invalid"
    assert cells["batching.torch.rate=20"]["reasons"] == ["too few samples"]
    assert cells["batching.tensorrt.rate=10"] == {
        "cell": "batching.tensorrt.rate=10",
        "engine": "tensorrt",
        "status": "skipped",
        "reasons": ["it skipped"],
    }
    assert max(len(line) for line in text.splitlines()) < 400


def test_the_check_runs_the_precision_and_load_workloads_of_tensor_engines():
    for workload in ("test_precision.py", "test_load.py", "test_batching.py", "test_shapes.py"):
        assert workload in gpu_check.WORKLOADS
