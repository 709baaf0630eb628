"""Every workload that measures a window places it on the telemetry clock, so that a GPU
machine records ``metrics.energy`` for all of them (on the first H200 run the precision
cells said "the workload did not place its measured window on the telemetry clock").

One cell of each workload runs for real (tensor workloads on ONNX Runtime with the
embedded tiny models; generative ones on null-gen) with a fake NVML of two GPUs at a
constant 300 W each, so every joule figure is exactly 600 W times the window the
workload placed, and that window must be the one it measured: not the warm-up, not
the engine's loading, not the parity passes around it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from harness.results import store
from harness.results.records import CellRecord, Status
from tests.support.imagefiles import write_small_corpus
from tests.test_energy import ConstantNvml

pytestmark = pytest.mark.slow  # real engine runs in process: about 45 s in all

pytest.importorskip("onnxruntime")

REPO = Path(__file__).resolve().parents[1]
WATTS = 600.0  # ConstantNvml: two GPUs at 300 W

# workload -> the -k expression that picks one of its cells
TENSOR = {
    "batching": "test_batching and rate100-none",
    "shapes": "test_shapes and tiny-encoder-dynamic",
    "precision": "test_precision and tiny-cnn-int8",
    "preprocessing": "test_preprocessing and pil-b8-t1",
    "preprocessing_e2e": "test_preprocessing_e2e and pil-b8",  # serial and pipelined
    "rate_sweep": "test_rate_sweep",
    "capacity": "test_capacity and none",
    "load_shape": "test_load_shape and gamma",
}
GENERATIVE = {
    "streaming": "test_streaming and closed-1",
    "dataset": "test_dataset and closed-1",
    "sessions": "test_sessions and off",
    "shared_prefix": "test_shared_prefix and off",
    "trace": "test_trace",
    "continuous_batching": "test_continuous_batching and continuous-seqs4",
}
# The generative load cells serve through GenerativeTarget, whose windows come from
# harness.load.stream_summary like the cells above; on null-gen they take minutes (the
# capacity search alone 2.5 min), and the tensor soak lasts the profile's 12 s soak_s
# through the TensorTarget.serve that load_shape checks.
NOT_RUN = {
    "soak": "12 s; its window comes from the TensorTarget.serve load_shape checks",
    "generative_soak": "12 s; GenerativeTarget.serve, summarize_stream's window",
    "generative_users_sweep": "minutes on null-gen; summarize_stream's window",
    "generative_capacity": "minutes on null-gen; summarize_stream's window",
    "generative_shape": "20 s on null-gen; summarize_stream's window",
    # null-gen has no precision_options: tests/test_vllm_precision.py runs it on vLLM
    "precision_generative": "needs an engine with precision_options (vLLM)",
    # no engine here serves pooling without vLLM; its span is summarize_trace's, as batching's
    "embeddings": "needs an engine that serves pooling (vLLM, an OpenAI pooling server)",
    # null-gen takes no images and has no speculative option; both stream through
    # summarize_stream, whose window the streaming cell above checks
    "multimodal": "needs an engine that takes images (vLLM, an OpenAI server with a VLM)",
    "speculative": "needs an engine with a speculative option (vLLM)",
}


def workload_functions() -> set[str]:
    """The workload of every ``test_*`` function under workloads/."""
    names = set()
    for path in sorted((REPO / "workloads").glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                names.add(node.name.removeprefix("test_"))
    return names


def test_every_workload_is_checked_or_said_why_not():
    # a new workload must join the runs below (or say why it cannot), not be forgotten
    assert workload_functions() == set(TENSOR) | set(GENERATIVE) | set(NOT_RUN)


def _run(pytester: pytest.Pytester, selection: dict[str, str], *args: str) -> list[CellRecord]:
    results = pytester.path / "runs"
    pytester.runpytest(
        str(REPO / "workloads"),
        f"--results-dir={results}",
        "--profile=quick",
        "--window=1.1",
        "--isolation=none",  # in process: the fake NVML is this process's
        *args,
        "-k",
        " or ".join(f"({k})" for k in selection.values()),
    )
    (run_dir,) = list(results.iterdir())
    return list(store.read_records(run_dir))


def measured_window(record: CellRecord) -> float:
    """The seconds the cell measured its figures over: a search's chosen point's window
    (the record's window sums every point), else the record's window."""
    m = record.metrics
    for search, chosen in (("sweep", "knee"), ("search", "capacity")):
        if search in m and m.get(chosen):
            load = m[chosen]["load"]
            return float(next(p for p in m[search]["points"] if p["load"] == load)["window_s"])
    return float(record.window["duration_s"])


def check_energy(records: list[CellRecord], expected: set[str]) -> None:
    # an invalid cell (too few samples on a busy machine) measured its window all the same
    measured = [r for r in records if r.status in (Status.OK, Status.INVALID)]
    others = {r.cell_id: (r.status.value, r.reasons) for r in records if r not in measured}
    assert {r.workload for r in measured} == expected, others
    wrong: dict[str, Any] = {}
    for record in measured:
        got = record.metrics["energy"]
        if "joules" not in got:
            wrong[record.cell_id] = got
            continue
        window = measured_window(record)
        # exactly the measured window: its length, and 600 W over it
        assert got["window_s"] == pytest.approx(window, abs=1e-6), record.cell_id
        assert got["joules"] == pytest.approx(WATTS * window, rel=1e-6), record.cell_id
        assert got["joules"] > 0
        assert got["window_s"] < record.duration_s, record.cell_id  # inside the cell
        assert got["samples"] >= 2
    assert wrong == {}


def test_every_tensor_workload_gets_the_energy_of_its_measured_window(pytester, monkeypatch):
    monkeypatch.setattr("harness.metrics.telemetry.shared_nvml", ConstantNvml)
    images = write_small_corpus(pytester.path / "images")  # the default corpus: seconds a pass
    records = _run(pytester, TENSOR, "--engine=onnxruntime", "--requests=120", f"--images={images}")
    check_energy(records, set(TENSOR))
    e2e = {r.params["mode"] for r in records if r.workload == "preprocessing_e2e"}
    assert e2e == {"serial", "pipelined"}


def test_every_generative_workload_gets_the_energy_of_its_measured_window(pytester, monkeypatch):
    monkeypatch.setattr("harness.metrics.telemetry.shared_nvml", ConstantNvml)
    model = pytester.path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"vocab_size": 100}')
    records = _run(
        pytester,
        GENERATIVE,
        "--engine=null-gen",
        "--engine-opt=null-gen.token_time_s=0.001",  # windows over 1 s: energy needs 2 readings
        f"--model={model}",
        "--requests=40",
    )
    check_energy(records, set(GENERATIVE))
