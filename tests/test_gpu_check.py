"""scripts/gpu-check on the CPU: its steps (fingerprint, engine availability with reasons,
the conformance module, a workload run, the per-engine summary), and its verdict: a check
where no engine ran a cell on the device fails, whatever pytest's exit status says."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.engine import registry
from harness.results.records import CellRecord as Record
from harness.results.records import PlannedCell, Status
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
findings = sys.modules["gpu_check_findings"]  # what it found: scripts/gpu_check_findings.py


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
        "workload": "batching",
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
        "workload": "batching",
        "status": "skipped",
        "reasons": ["it skipped"],
    }
    assert max(len(line) for line in text.splitlines()) < 400


def test_the_check_runs_the_precision_and_load_workloads_of_tensor_engines():
    for workload in ("test_precision.py", "test_load.py", "test_batching.py", "test_shapes.py"):
        assert workload in gpu_check.WORKLOADS


# -- generative engines: their own runs, per-workload figures, the budget -------------------


def _gen(
    cell_id: str, workload: str, status: Status = Status.OK, reasons: tuple = (), **metrics: dict
) -> Record:
    fields: dict = {"engine": "transformers", "status": status, "workload": workload}
    if status in (Status.OK, Status.INVALID):
        fields["metrics"] = {"e2e": {"p50": 0.5}} | metrics
    if reasons:
        fields["reasons"] = reasons
    return record(cell_id, **fields)


def _stream(ttft: float, itl: float, tokens_s: float, energy: dict | None = None) -> dict:
    return {
        "ttft": {"p50": ttft, "p99": 2 * ttft},
        "itl": {"p50": itl, "p99": 3 * itl},
        "throughput": {"output_tokens_per_s": tokens_s},
        "energy": energy or {"absent": "no GPU power reading: nvidia-ml-py is not installed"},
    }


def test_generative_cells_give_per_workload_figures_over_their_ok_cells():
    reports = {"transformers": gpu_check.EngineReport("transformers", "generative")}
    energy = {"joules": 30.0, "window_s": 3.0, "per_output_token_j": 0.25, "count": 120}
    records = [
        _gen("streaming.transformers.level=1", "streaming", **_stream(0.010, 0.002, 300.0)),
        _gen("streaming.transformers.level=4", "streaming", **_stream(0.020, 0.004, 900.0)),
        _gen("streaming.transformers.level=12", "streaming", Status.INVALID, **_stream(9, 9, 9)),
        _gen("sessions.transformers.on", "sessions", **_stream(0.030, 0.005, 500.0, energy)),
        _gen("trace.transformers.on", "trace", Status.SKIPPED),
    ]
    gpu_check.add_cells(reports, records)
    gpu_check.add_workloads(reports, records)
    report = reports["transformers"]
    assert (report.verdict(), report.cells_ok, report.cells_invalid) == ("RAN", 3, 1)
    streaming = report.workloads["streaming"]
    assert (streaming["cells"], streaming["ok"]) == (3, 2)  # the invalid cell's 9 s are left out
    assert streaming["ttft_p50_ms"] == pytest.approx([10.0, 20.0])
    assert streaming["ttft_p99_ms"] == pytest.approx([20.0, 40.0])
    assert streaming["itl_p50_ms"] == pytest.approx([2.0, 4.0])
    assert streaming["itl_p99_ms"] == pytest.approx([6.0, 12.0])
    assert streaming["output_tokens_per_s"] == pytest.approx([300.0, 900.0])
    assert streaming["j_per_output_token"] is None
    assert streaming["energy_absent"] == "no GPU power reading: nvidia-ml-py is not installed"
    sessions = report.workloads["sessions"]
    assert sessions["j_per_output_token"] == pytest.approx([0.25, 0.25])
    assert "energy_absent" not in sessions
    assert report.workloads["trace"] == {
        "cells": 1,
        "ok": 0,
        **{name: None for name, _, _ in findings.FIGURES},
    }
    lines = report.lines()
    header = next(i for i, line in enumerate(lines) if "workload" in line)
    assert lines[header].split()[:3] == ["workload", "cells", "ok"]
    assert "TTFT p50 ms" in lines[header]
    assert "J/tok" in lines[header]
    assert lines[header + 1].split() == [
        "streaming", "2/3", "10-20", "20-40", "2-4", "6-12", "300-900", "n/a",
    ]  # fmt: skip
    assert lines[header + 2].split()[-1] == "0.25"
    assert lines[header + 3].split()[:3] == ["trace", "0/1", "n/a"]
    assert lines[header + 4].strip() == (
        "J/tok n/a: no GPU power reading: nvidia-ml-py is not installed"
    )


def test_cells_json_has_a_generative_cells_figures_and_energy_per_output_token(tmp_path):
    energy = {"joules": 30.0, "window_s": 3.0, "per_output_token_j": 0.0123456, "count": 2430}
    rec = _gen("streaming.transformers.level=1", "streaming", **_stream(0.0123, 0.002, 81, energy))
    gpu_check.write_cells(tmp_path / "cells.json", [rec])
    [cell] = json.loads((tmp_path / "cells.json").read_text())
    assert cell["workload"] == "streaming"
    assert cell["figures"] == {
        "ttft_p50_ms": 12.3,
        "ttft_p99_ms": 24.6,
        "itl_p50_ms": 2.0,
        "itl_p99_ms": 6.0,
        "output_tokens_per_s": 81.0,
        "j_per_output_token": 0.01235,
    }
    assert cell["energy"] == {"joules": 30.0, "mean_power_w": 10.0, "per_output_token_j": 0.01235}


def test_a_run_stopped_at_its_share_lists_what_it_did_not_reach_and_still_passes():
    reports = {"transformers": gpu_check.EngineReport("transformers", "generative")}
    reports["transformers"].stopped = "workload run stopped at its share of the budget (200 s)"
    interrupted = (
        "interrupted by SIGTERM after 17.7 s; the run stopped here (finish it with --resume)"
    )
    records = [
        _gen("streaming.transformers.level=1", "streaming", **_stream(0.01, 0.002, 300.0)),
        _gen("dataset.transformers.level=1", "dataset", Status.FAILED, reasons=(interrupted,)),
    ]
    planned = [
        PlannedCell(cell_id=c, workload=w, engine="transformers", params={}, nodeid=f"t::{c}")
        for c, w in (
            ("streaming.transformers.level=1", "streaming"),
            ("dataset.transformers.level=1", "dataset"),
            ("trace.transformers.on", "trace"),
            ("trace.transformers.off", "trace"),
        )
    ]
    gpu_check.add_unreached(reports, planned, records)
    gpu_check.add_cells(reports, records)
    gpu_check.add_workloads(reports, records)
    report = reports["transformers"]
    assert report.failed == []
    assert report.not_reached == {"dataset": 1, "trace": 2}
    assert list(report.workloads) == ["streaming"]  # the cut cell is not a measured one
    assert gpu_check.verdict(reports, []) == (
        0,
        "PASS: transformers ran real cells (budget: transformers not finished)",
    )
    text = "\n".join(report.lines())
    assert "workload run stopped at its share of the budget (200 s)" in text
    assert "not reached x2: trace" in text
    # an interruption this check did not cause is a failure like any other
    fresh = {"transformers": gpu_check.EngineReport("transformers", "generative")}
    gpu_check.add_cells(fresh, records)
    assert fresh["transformers"].failed == [f"dataset.transformers.level=1 (failed): {interrupted}"]


def _args(**extra) -> argparse.Namespace:
    argv = [
        "--device=cpu",
        "--out=/tmp/x",
        *(f"--{k.replace('_', '-')}={v}" for k, v in extra.items()),
    ]
    return gpu_check._parse(argv)


def test_tensor_engines_share_a_run_and_each_generative_engine_has_its_own():
    reports = {
        "onnxruntime": gpu_check.EngineReport("onnxruntime", "tensor"),
        "torch": gpu_check.EngineReport("torch", "tensor"),
        "tensorrt": gpu_check.EngineReport("tensorrt", "tensor", unavailable="not installed"),
        "transformers": gpu_check.EngineReport("transformers", "generative"),
        "vllm": gpu_check.EngineReport("vllm", "generative"),
    }
    args = _args(requests=100, engine_opt="transformers.num_blocks=64")
    steps = gpu_check.workload_steps(args, reports, Path("/tmp/runs"))
    assert [s.engines for s in steps] == [("onnxruntime", "torch"), ("transformers",), ("vllm",)]
    tensor, generative = steps[0].argv, steps[1].argv
    assert "--engine=onnxruntime,torch" in tensor
    assert tensor[tensor.index("-k") + 1] == gpu_check.WORKLOADS
    assert "--requests=100" in generative
    assert "--engine-opt=transformers.num_blocks=64" in generative
    assert not any(a.startswith("--engine-opt") for a in tensor)  # pytest would refuse it
    files = [a for a in generative if a.startswith("workloads/")]
    assert files[0] == "workloads/test_streaming.py"  # most asked-for first: a stop cuts the tail
    assert {f.rpartition("/")[2] for f in files} >= {
        "test_continuous_batching.py", "test_dataset.py", "test_sessions.py",
        "test_shared_prefix.py", "test_precision.py", "test_load.py",
    }  # fmt: skip
    selection = generative[generative.index("-k") + 1]
    for test in ("test_precision_generative", "test_generative_shape", "test_sessions"):
        assert test in selection
    assert "test_precision " not in f"{selection} "  # the tensor precision cells stay out


def test_each_workload_run_gets_an_equal_share_of_what_is_left(monkeypatch):
    """Shares from a fake clock: 400 s left, 3 runs: the first gets (400 - 10) / 3; it uses
    50 s, so the next gets (350 - 10) / 2; a stopped run marks its engines; a run whose
    share would be under MIN_RUN_S is not started."""
    clock = {"left": 400.0}
    used = iter([(50.0, 0), (170.0, gpu_check.STOPPED), (0.0, 0)])
    shares = []

    def fake_run(argv, env, timeout):
        shares.append(round(timeout, 1))
        seconds, code = next(used)
        clock["left"] -= seconds
        return code

    monkeypatch.setattr(gpu_check, "_run", fake_run)
    reports = {
        "torch": gpu_check.EngineReport("torch", "tensor"),
        "transformers": gpu_check.EngineReport("transformers", "generative"),
        "vllm": gpu_check.EngineReport("vllm", "generative"),
    }
    failures, _, logs = gpu_check._run_workloads(
        _args(out=Path("/nonexistent")), reports, {}, lambda: clock["left"]
    )
    assert failures == []
    assert shares == [130.0, 170.0, 170.0]
    assert [(log.share_s, log.stopped) for log in logs] == [
        (130.0, False),
        (170.0, True),
        (170.0, False),
    ]
    assert (
        reports["transformers"].stopped == "workload run stopped at its share of the budget (170 s)"
    )
    clock["left"] = 35.0
    reports["vllm"].stopped = ""
    gpu_check._run_workloads(
        _args(out=Path("/nonexistent")), {"vllm": reports["vllm"]}, {}, lambda: clock["left"]
    )
    assert reports["vllm"].stopped == "workload run not started: 35 s of the budget was left"


def test_a_run_past_its_share_is_stopped_with_everything_it_started(tmp_path):
    pid_file = tmp_path / "grandchild"
    script = (
        "import subprocess, sys, time;"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid));"
        "time.sleep(60)"
    )
    start = time.monotonic()
    code = gpu_check._run([sys.executable, "-c", script], dict(os.environ), 1.5)
    assert code == gpu_check.STOPPED
    assert time.monotonic() - start < 10
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has ended; only its parent has not read its status yet


def test_the_generative_precision_workloads_figures_are_its_reduced_dtypes():
    phase = {"ttft": {"p50": 0.004, "p99": 0.008}, "throughput": {"output_tokens_per_s": 50.0}}
    rec = _gen(
        "precision_generative.transformers.precision=bf16",
        "precision_generative",
        reference={"ttft": {"p50": 9.0, "p99": 9.0}},
        reduced=phase,
    )
    figures = findings.generative_figures(rec)
    assert figures["ttft_p50_ms"] == pytest.approx(4.0)
    assert figures["ttft_p99_ms"] == pytest.approx(8.0)
    assert figures["output_tokens_per_s"] == pytest.approx(50.0)
    assert figures["itl_p50_ms"] is None  # a phase summary has no ITL
    assert findings.cell_line(rec)["figures"]["ttft_p50_ms"] == 4.0


@pytest.mark.slow
def test_gpu_check_runs_a_generative_engine_and_gives_its_figures_per_workload(tmp_path):
    """On the CPU with transformers installed (and onnxruntime, which the check needs): the
    generative conformance class and a generative workload run, their figures per workload
    in the summary and per cell in cells.json."""
    pytest.importorskip(
        "transformers", reason="transformers is not installed (tox -e transformers)"
    )
    pytest.importorskip("torch", reason="torch is not installed (tox -e transformers)")
    proc, summary = _check(
        tmp_path,
        "--device=cpu",
        "--workloads=test_batching.py and rate100-none",
        "--llm-workloads=test_trace",
        "--requests=100",
        "--engine-opt=transformers.num_blocks=64",
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert "=== gpu-check: quick generative workloads on transformers, at most" in text
    engine = summary["engines"]["transformers"]
    assert (engine["verdict"], engine["family"], engine["stopped"]) == ("RAN", "generative", "")
    assert engine["conformance_passed"] > 5
    trace = engine["workloads"]["trace"]
    assert (trace["cells"], trace["ok"]) == (1, 1)
    for key in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "output_tokens_per_s"):
        low, high = trace[key]
        assert 0 < low == high, key
    assert trace["ttft_p50_ms"][0] <= trace["ttft_p99_ms"][0]
    assert trace["j_per_output_token"] is None
    assert trace["energy_absent"]
    assert [s["label"] for s in summary["steps"]] == [
        "conformance suite",
        "quick tensor workloads on onnxruntime, torch",
        "quick generative workloads on transformers",
    ]
    assert not any(s["stopped"] for s in summary["steps"])
    cells = json.loads((tmp_path / "check" / "cells.json").read_text())
    [cell] = [c for c in cells if c["engine"] == "transformers"]
    assert (cell["workload"], cell["status"]) == ("trace", "ok")
    assert cell["figures"]["ttft_p50_ms"] == pytest.approx(trace["ttft_p50_ms"][0], rel=1e-3)
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if "cells ok" in line and "TTFT" in line)
    assert lines[header + 1].split()[:2] == ["trace", "1/1"]
