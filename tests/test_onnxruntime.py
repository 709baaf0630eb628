"""The ONNX Runtime adapter on the CPU provider, and its refusal of silent fallbacks."""

import numpy as np
import pytest

from engines.onnxruntime import OnnxRuntimeEngine
from harness.engine import EngineConfig, EngineError, TensorEngine
from workloads.lib import models

onnxruntime = pytest.importorskip("onnxruntime")


@pytest.fixture
def cnn(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    return models.embedded("tiny-cnn")


def test_loads_runs_and_describes_what_it_used(cnn):
    engine = OnnxRuntimeEngine(EngineConfig(cnn.path, options={"intra_op_threads": "1"}))
    engine.load()
    assert isinstance(engine, TensorEngine)
    out = engine.infer({"image": np.zeros((3, 3, 64, 64), np.float32)})
    assert out["logits"].shape == (3, 10)
    info = engine.describe()
    assert info["active_providers"] == ["CPUExecutionProvider"]
    assert info["threads"] == {"intra_op": 1, "inter_op": 1}
    assert info["allow_spinning"] is False
    assert info["graph_optimization"] == "all"
    assert info["version"]
    assert info["model"]["sha256"] == cnn.sha256
    assert info["inputs"] == [{"name": "image", "dtype": "float32", "shape": ["batch", 3, 64, 64]}]
    engine.close()
    with pytest.raises(EngineError, match="not loaded"):
        engine.infer({"image": np.zeros((1, 3, 64, 64), np.float32)})


@pytest.mark.filterwarnings("ignore:Specified provider")
def test_silent_fallback_to_cpu_fails_the_load(cnn):
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this machine really has the CUDA provider")
    engine = OnnxRuntimeEngine(EngineConfig(cnn.path, device="cuda"))
    with pytest.raises(
        EngineError, match=r"requested CUDAExecutionProvider but onnxruntime activated"
    ):
        engine.load()


def test_probe_says_precisely_why_cuda_is_unavailable():
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this machine really has the CUDA provider")
    avail = OnnxRuntimeEngine.probe("cuda:0")
    assert not avail.available
    assert "no CUDAExecutionProvider" in avail.reason
    assert "onnxruntime-gpu" in avail.reason
    assert OnnxRuntimeEngine.probe("cpu").available


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"threads": "2"}, "unknown option"),
        ({"intra_op_threads": "0"}, "positive integer"),
        ({"graph_optimization": "max"}, "graph_optimization must be one of"),
        ({"provider": "rocm"}, "provider must be cuda or tensorrt"),
        ({"allow_spinning": "yes"}, "allow_spinning must be 0 or 1"),
    ],
)
def test_bad_options_are_rejected(options, message):
    with pytest.raises(ValueError, match=message):
        OnnxRuntimeEngine.validate_options(options)


def test_missing_or_broken_model_is_an_engine_error(tmp_path):
    with pytest.raises(EngineError, match="not an ONNX file"):
        OnnxRuntimeEngine(EngineConfig(tmp_path / "none.onnx")).load()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(EngineError, match="could not load"):
        OnnxRuntimeEngine(EngineConfig(bad)).load()
