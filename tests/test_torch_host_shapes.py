"""The ONNX module keeps shape arithmetic on the host, and fp32 on cuda means IEEE fp32.

A shape constant or a ``Shape`` value on the device had to be read back with ``.tolist()``
at every call: a sync per call, a graph break under ``torch.compile``, and an error inside
a CUDA graph capture. These checks run on the CPU: no forward pass reads a tensor back,
``torch.compile(fullgraph=True)`` traces the embedded models, the shape constants are not
buffers (so ``.to(device)`` leaves them), and shape values that do meet tensor ops still
give ONNX Runtime's answers. Needs torch and onnx (``tox -e torch``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (tox -e torch)")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from engines.torch import (  # noqa: E402
    TorchEngine,
    _fp32_settings,
    _StrictFp32,
    restore_fp32,
    strict_fp32,
    tf32_flags,
)
from engines.torch_onnx import OnnxModule  # noqa: E402
from harness.engine import EngineConfig  # noqa: E402
from workloads.lib.models import embedded  # noqa: E402

SCALAR_READS = ("tolist", "item", "__int__", "__index__", "__float__", "__bool__")


def _inputs(name: str, size: int = 16) -> tuple[Any, ...]:
    gen = torch.Generator().manual_seed(size)
    if name == "tiny-encoder":
        ids = torch.randint(0, 1000, (2, size), generator=gen)
        mask = torch.ones(2, size, dtype=torch.int64)
        mask[1, size // 2 :] = 0
        return ids, mask
    return (torch.randn(2, 3, 64, 64, generator=gen),)


class _NoLocalScalar(TorchDispatchMode):
    """Fails on the op every tensor-to-Python read goes through on a device."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        assert func is not torch.ops.aten._local_scalar_dense.default, "read a tensor back"
        return func(*args, **(kwargs or {}))


@pytest.fixture
def no_scalar_reads(monkeypatch) -> Iterator[None]:
    """Any read of a tensor's values into Python fails: the methods that do it raise (on a
    CPU they skip the dispatcher), and so does the aten op they use on a device."""

    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was read back to the host")

    for method in SCALAR_READS:
        monkeypatch.setattr(torch.Tensor, method, refuse)
    with _NoLocalScalar():
        yield


@pytest.mark.parametrize("name", ["tiny-encoder", "tiny-cnn"])
def test_a_forward_pass_reads_no_tensor_back(name, no_scalar_reads):
    module = OnnxModule(embedded(name).path).eval()
    with torch.inference_mode():
        (out,) = module(*_inputs(name))
    assert out.shape[0] == 2


def test_the_shape_constants_stay_python_ints_and_off_the_buffers():
    path = embedded("tiny-encoder").path
    module = OnnxModule(path).eval()
    initializers = onnx.load(str(path)).graph.initializer
    ints = {i.name for i in initializers if i.data_type == TensorProto.INT64}
    assert len(ints) == 14  # Reshape shapes, Unsqueeze/Squeeze/ReduceSum axes, Range bounds
    assert set(module.host_constants) == ints
    assert all(isinstance(v, int | tuple) for v in module.host_constants.values())
    buffers = dict(module.named_buffers())
    assert len(buffers) == len(initializers) - len(ints)
    assert {b.dtype for b in buffers.values()} == {torch.float32}
    assert [s.op_type for s in module.steps if s.host] == ["Shape", "Squeeze"]
    # on a device whose tensors cannot be read at all, the pass still runs: every value
    # it needed as a Python int was on the host
    meta = module.to("meta")
    (out,) = meta(*(t.to("meta") for t in _inputs("tiny-encoder")))
    assert out.shape == (2, 128)
    assert out.device.type == "meta"


@pytest.mark.parametrize("name", ["tiny-encoder", "tiny-cnn"])
def test_the_embedded_models_compile_as_one_graph(name):
    torch._dynamo.reset()
    module = OnnxModule(embedded(name).path).eval()
    # a graph break raises under fullgraph whatever the backend; aot_eager traces as inductor
    # does without generating kernels (12-27 s each on 2 cores; inductor runs in test_torch)
    compiled = torch.compile(module, fullgraph=True, dynamic=True, backend="aot_eager")
    with torch.inference_mode():
        for size in (16, 24):  # the sequence length stays symbolic: one graph for both
            inputs = _inputs(name, size)
            torch.testing.assert_close(compiled(*inputs), module(*inputs), rtol=1e-4, atol=1e-5)


def _shape_arithmetic_model(path) -> None:
    """y = x / x.shape[-1] and z = table[[2, 0]] + x.shape[0], with shape(x) an output: shape
    values meet tensor ops, and an int64 initializer serves as data (Gather indices)."""
    g = helper
    nodes = [
        g.make_node("Shape", ["x"], ["shape"]),
        g.make_node("Gather", ["shape", "last"], ["width"]),
        g.make_node("Cast", ["width"], ["width_f"], to=TensorProto.FLOAT),
        g.make_node("Div", ["x", "width_f"], ["y"]),
        g.make_node("Gather", ["shape", "first"], ["rows"]),
        g.make_node("Gather", ["table", "picks"], ["picked"]),
        g.make_node("Add", ["picked", "rows"], ["z"]),
    ]
    consts = {
        "last": np.array(-1, np.int64),
        "first": np.array(0, np.int64),
        "table": np.array([10, 20, 30], np.int64),
        "picks": np.array([2, 0], np.int64),
    }
    graph = g.make_graph(
        nodes,
        "shape_arithmetic",
        [g.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "width"])],
        [
            g.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "width"]),
            g.make_tensor_value_info("z", TensorProto.INT64, [2]),
            g.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    model = g.make_model(graph, opset_imports=[g.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_shape_values_that_meet_tensor_ops_give_onnxruntimes_answers(tmp_path, no_scalar_reads):
    ort = pytest.importorskip("onnxruntime")
    path = tmp_path / "shapes.onnx"
    _shape_arithmetic_model(path)
    module = OnnxModule(path).eval()
    # the Gather indices into the shape are host values; those into a tensor are a buffer
    assert set(module.host_constants) == {"last", "first"}
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    got = [t.numpy() for t in module(torch.from_numpy(x))]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for ours, theirs in zip(got, want, strict=True):
        assert ours.dtype == theirs.dtype
        np.testing.assert_allclose(ours, theirs)


# -- fp32 on cuda: IEEE, not TF32 -----------------------------------------------------------


@pytest.fixture
def backends() -> Iterator[Any]:
    """torch.backends, with its TF32 flags put back after the test (they are global)."""
    before = _fp32_settings(torch.backends)
    generic = torch.backends.fp32_precision
    try:
        yield torch.backends
    finally:
        torch.backends.fp32_precision = generic
        restore_fp32(torch.backends, before)
        _StrictFp32.holders = 0


def test_torchs_defaults_are_ieee_matmuls_and_tf32_convolutions(backends):
    # torch 2.13: cuda.matmul.fp32_precision "none" (legacy allow_tf32 False, matmul
    # precision "highest"), cudnn.conv.fp32_precision "tf32" (cudnn.allow_tf32 True)
    assert tf32_flags(backends) == {"matmul": False, "cudnn": True}
    assert backends.cuda.matmul.allow_tf32 is False
    assert backends.cudnn.allow_tf32 is True


def test_strict_fp32_turns_tf32_off_everywhere_and_restores_it(backends):
    before = _fp32_settings(backends)
    saved = strict_fp32(backends)
    assert saved == before
    assert tf32_flags(backends) == {"matmul": False, "cudnn": False}
    # both APIs agree, so torch's consistency checks (inductor reads the legacy ones) pass
    assert backends.cuda.matmul.allow_tf32 is False
    assert backends.cudnn.allow_tf32 is False
    assert torch.get_float32_matmul_precision() == "highest"
    assert (backends.cudnn.conv.fp32_precision, backends.cudnn.rnn.fp32_precision) == (
        "ieee",
        "ieee",
    )
    restore_fp32(backends, saved)
    assert _fp32_settings(backends) == before
    assert tf32_flags(backends) == {"matmul": False, "cudnn": True}


def test_a_global_tf32_setting_does_not_reach_the_strict_flags(backends):
    backends.fp32_precision = "tf32"
    assert tf32_flags(backends) == {"matmul": True, "cudnn": True}
    saved = strict_fp32(backends)
    assert saved["legacy_matmul"] is None  # torch refuses to say in this mixed state
    assert tf32_flags(backends) == {"matmul": False, "cudnn": False}
    restore_fp32(backends, saved)
    assert tf32_flags(backends) == {"matmul": True, "cudnn": True}


def test_overlapping_fp32_engines_restore_the_flags_when_the_last_one_closes(backends):
    _StrictFp32.hold(backends)
    _StrictFp32.hold(backends)
    _StrictFp32.release(backends)
    assert tf32_flags(backends)["cudnn"] is False  # one engine still runs
    _StrictFp32.release(backends)
    assert tf32_flags(backends) == {"matmul": False, "cudnn": True}


@pytest.mark.parametrize(("dtype", "strict"), [("float32", True), ("bfloat16", False)])
def test_a_cuda_engine_runs_fp32_as_ieee_and_records_it(backends, monkeypatch, dtype, strict):
    # a cuda engine whose tensors stay on the CPU: the load/describe/close path on any host
    monkeypatch.setattr(TorchEngine, "_device", lambda self: "cpu")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "fake")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    engine = TorchEngine(
        EngineConfig(embedded("tiny-cnn").path, device="cuda", options={"dtype": dtype})
    )
    engine.load()
    tf32 = {"matmul": False, "cudnn": not strict}
    assert engine.describe()["effective"]["tf32"] == tf32
    assert tf32_flags(backends) == tf32
    engine.close()
    assert tf32_flags(backends) == {"matmul": False, "cudnn": True}
