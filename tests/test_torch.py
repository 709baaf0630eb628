"""The PyTorch baseline: the conformance suite in eager and compiled modes, the same
answers as ONNX Runtime on the embedded models, torch.export programs, and the option
and input checks. Needs torch (``tox -e torch``); the checks that do not are always run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from engines.torch import TorchEngine, effective_options
from harness.engine import EngineConfig, TensorSpec, check_inputs
from harness.engine.conformance import Subject, TensorConformance, synthesize

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (tox -e torch)")


def _embedded(name: str) -> Path:
    pytest.importorskip("onnx")
    from workloads.lib.models import embedded  # noqa: PLC0415

    return embedded(name).path


def test_options_are_checked_and_defaults_filled_in():
    assert effective_options({}, "cpu")["mode"] == "eager"
    assert effective_options({"threads": "3", "dtype": "bfloat16"}, "cpu") == {
        "mode": "eager",
        "compile_mode": "default",
        "dtype": "bfloat16",
        "threads": 3,
    }
    with pytest.raises(ValueError, match="cudagraphs needs a cuda device"):
        effective_options({"mode": "cudagraphs"}, "cpu")
    assert effective_options({"mode": "cudagraphs"}, "cuda:1")["mode"] == "cudagraphs"
    for bad, message in (
        ({"mode": "jit"}, "mode must be one of eager, compile, cudagraphs"),
        ({"dtype": "int4"}, "dtype must be one of"),
        ({"threads": "0"}, "threads must be a positive integer"),
        ({"backend": "x"}, "unknown option"),
    ):
        with pytest.raises(ValueError, match=message):
            TorchEngine.validate_options(bad)


def test_inputs_are_checked_by_name_dtype_rank_and_static_size():
    specs = (TensorSpec("image", np.dtype(np.float32), ("batch", 3, 8, 8)),)
    good = np.zeros((2, 3, 8, 8), np.float32)
    assert check_inputs(specs, {"image": good})[0] is good
    with pytest.raises(ValueError, match=r"expected inputs \['image'\], got \['x'\]"):
        check_inputs(specs, {"x": good})
    with pytest.raises(ValueError, match="expected float32 of rank 4, got float64"):
        check_inputs(specs, {"image": good.astype(np.float64)})
    with pytest.raises(ValueError, match="shape"):
        check_inputs(specs, {"image": np.zeros((2, 3, 8, 9), np.float32)})


def test_probe_says_why_cuda_cannot_run():
    status = TorchEngine.probe("cuda")
    if not HAVE_TORCH:
        assert "torch is not installed" in status.reason
        return
    import torch  # noqa: PLC0415

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert not status.available
    assert status.reason.startswith(f"torch {torch.__version__} sees no CUDA device")
    assert TorchEngine.probe("cpu").available


@needs_torch
class TestTorchEagerCnn(TensorConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        return Subject(TorchEngine, model=_embedded("tiny-cnn"), options={"threads": "1"})


@needs_torch
class TestTorchEagerEncoder(TensorConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        return Subject(TorchEngine, model=_embedded("tiny-encoder"), dims={"sequence": 16})


@needs_torch
class TestTorchCompiledCnn(TensorConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        # inductor's code and kernel caches stay with the process after close
        return Subject(
            TorchEngine,
            model=_embedded("tiny-cnn"),
            options={"mode": "compile"},
            memory_slack_mib=256.0,
        )


@needs_torch
@pytest.mark.parametrize(
    ("model", "dims"),
    [
        ("tiny-cnn", {}),
        ("tiny-cnn-dynhw", {"height": 40, "width": 56}),
        ("tiny-encoder", {"sequence": 24}),
    ],
)
def test_torch_gives_onnxruntimes_answers_on_the_embedded_models(model, dims):
    pytest.importorskip("onnxruntime")
    from engines.onnxruntime import OnnxRuntimeEngine  # noqa: PLC0415

    path = _embedded(model)
    engines = [TorchEngine(EngineConfig(path)), OnnxRuntimeEngine(EngineConfig(path))]
    for engine in engines:
        engine.load()
    try:
        ours, theirs = engines
        assert [s.name for s in ours.input_specs()] == [s.name for s in theirs.input_specs()]
        assert ours.input_specs() == theirs.input_specs()
        inputs = synthesize(ours.input_specs(), dims, 3, seed=5)
        got, want = ours.infer(inputs), theirs.infer(inputs)
        assert set(got) == set(want)
        for name in got:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
    finally:
        for engine in engines:
            engine.close()


@needs_torch
@pytest.mark.slow  # builds the 100 MB model (seconds)
def test_torch_gives_onnxruntimes_answers_on_the_reference_resnet50():
    """The reference set's CNN (workloads/lib/refmodels.py): strided and padded convolutions
    and pooling that the tiny CNN does not have, converted to the same answers."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from engines.onnxruntime import OnnxRuntimeEngine  # noqa: PLC0415
    from workloads.lib.refmodels import embedded  # noqa: PLC0415

    path = embedded("resnet50-dynhw").path
    engines = [TorchEngine(EngineConfig(path)), OnnxRuntimeEngine(EngineConfig(path))]
    for engine in engines:
        engine.load()
    try:
        ours, theirs = engines
        assert ours.input_specs() == theirs.input_specs()
        inputs = synthesize(ours.input_specs(), {"height": 64, "width": 96}, 2, seed=5)
        got, want = ours.infer(inputs), theirs.infer(inputs)
        assert got["logits"].shape == (2, 1000)
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-4, atol=1e-4)
    finally:
        for engine in engines:
            engine.close()


@needs_torch
def test_a_torch_export_program_is_served_with_its_dynamic_batch(tmp_path):
    import torch  # noqa: PLC0415

    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return 3 * x + bias, x.sum(dim=1)

    batch = torch.export.Dim("batch", min=1, max=32)
    program = torch.export.export(
        Scale(),
        (torch.ones(2, 4), torch.ones(2, 4)),
        dynamic_shapes={"x": {0: batch}, "bias": {0: batch}},
    )
    path = tmp_path / "scale.pt2"
    torch.export.save(program, str(path))
    engine = TorchEngine(EngineConfig(path))
    engine.load()
    specs = engine.input_specs()
    assert [(s.name, s.shape) for s in specs] == [("x", (None, 4)), ("bias", (None, 4))]
    assert [s.name for s in engine.output_specs()] == ["output0", "output1"]
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    out = engine.infer({"x": x, "bias": np.ones_like(x)})
    np.testing.assert_allclose(out["output0"], 3 * x + 1)
    np.testing.assert_allclose(out["output1"], x.sum(axis=1))
    assert engine.describe()["model"]["format"] == ".pt2"


@needs_torch
def test_an_unmapped_onnx_operator_is_refused_by_name(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper  # noqa: PLC0415

    node = helper.make_node("Sigmoid", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    path = tmp_path / "sigmoid.onnx"
    onnx.save(helper.make_model(graph), str(path))
    engine = TorchEngine(EngineConfig(path))
    with pytest.raises(Exception, match="operators the torch adapter does not map: Sigmoid"):
        engine.load()
