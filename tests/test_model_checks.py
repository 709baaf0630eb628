"""`--model`, `--dim` and `--dynamic-batch` are checked once, at configuration (issue 16,
items 11, 13 and 18): one usage error (exit status 4, no traceback) instead of the same
traceback in every cell; and the ONNX inspection and rewriting behind it."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from harness.exceptions import UsageError
from harness.results.records import Manifest
from harness.session.pytestoptions import parse_settings
from harness.session.state import check_resumable
from tests.support.runner import pytest_workloads
from workloads.lib import models

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from engines import onnxprep  # noqa: E402  (needs onnx)

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
SQUEEZENET = LIGHT / "light_squeezenet.onnx"
RESNET50 = LIGHT / "light_resnet50.onnx"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))


def start(tmp: Path, *args: str) -> tuple[int, str]:
    """A workloads run that must stop at configuration: its exit status and output. One
    short cell is selected, so that a run that does not stop is over soon all the same."""
    proc = pytest_workloads(tmp, "--window=2", "-k", "rate100-none", *args)
    return proc.returncode, proc.stdout + proc.stderr


def scalar_model(path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "scalar", [x], [y])
    onnx.save(helper.make_model(graph), str(path))
    return path


def encoder_copy(tmp: Path) -> Path:
    path = tmp / "my-encoder.onnx"
    shutil.copy(models.embedded("tiny-encoder").path, path)
    return path


def _model(tmp: Path, kind: str) -> Path:
    if kind == "text":
        (tmp / "notes.onnx").write_text("these are notes, not a model\n")
        return tmp / "notes.onnx"
    if kind == "empty":
        (tmp / "empty.onnx").write_bytes(b"")
        return tmp / "empty.onnx"
    if kind == "folder":
        (tmp / "folder").mkdir()
        return tmp / "folder"
    return scalar_model(tmp / "scalar.onnx")


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("text", "notes.onnx is not an ONNX model (protobuf:"),
        ("empty", "empty.onnx is empty (0 bytes), not an ONNX model"),
        ("folder", "folder is a directory; tensor engines (onnxruntime) load a model file"),
        (
            "scalar",
            "scalar.onnx: input x is a scalar; the harness feeds batches, so every input needs"
            " a leading batch dimension ([batch, ...])",
        ),
    ],
)
@pytest.mark.slow
def test_a_model_the_tensor_engines_cannot_load_stops_the_run_with_one_message(
    tmp_path, kind, message
):
    code, out = start(tmp_path, f"--model={_model(tmp_path, kind)}")
    assert code == 4, out[-3000:]
    assert f"ERROR: --model {tmp_path}" in out
    assert message in out
    assert "Traceback" not in out
    assert out.count("ERROR:") == 1
    assert not (tmp_path / "runs").exists()  # stopped before any run directory


@pytest.mark.slow
def test_a_model_directory_is_fine_for_a_generative_engine(tmp_path):
    folder = tmp_path / "llm"
    folder.mkdir()
    code, out = start(tmp_path, "--engine=vllm", f"--model={folder}", "--collect-only", "-q")
    assert code == 0, out[-3000:]
    code, out = start(tmp_path, "--engine=vllm", f"--model={folder}", "--dynamic-batch")
    assert code == 4
    assert "--dynamic-batch rewrites an ONNX model for tensor engines; none of vllm" in out


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            "encoder",  # --dim sequence=8 is one of its dims: only nosuch is named
            "--dim nosuch: not a dynamic dimension of my-encoder.onnx, whose dynamic"
            " dimensions are: sequence; the batch dimension is sized by the workloads",
        ),
        (
            "squeezenet",
            "--dim nosuch, sequence: not a dynamic dimension of light_squeezenet.onnx, which"
            " has none besides the batch (inputs: data_0 [1, 3, 224, 224])",
        ),
        (
            None,
            "--dim nosuch: not a dynamic dimension of the embedded models, whose dynamic"
            " dimensions are: height, sequence, width",
        ),
    ],
)
@pytest.mark.slow
def test_a_dim_the_model_does_not_have_is_a_usage_error_naming_the_ones_it_has(
    tmp_path, model, message
):
    path = {"encoder": encoder_copy(tmp_path), "squeezenet": SQUEEZENET}.get(model or "")
    args = [f"--model={path}"] if path else []
    code, out = start(tmp_path, *args, "--dim=nosuch=4", "--dim=sequence=8")
    assert code == 4, out[-3000:]
    assert message in out
    assert "Traceback" not in out


def test_dynamic_batch_needs_a_model_and_is_part_of_what_a_resume_must_repeat():
    base = dict(engine=["onnxruntime"], device="cpu", profile="quick", results_dir="r", seed=0)
    with pytest.raises(UsageError, match="--dynamic-batch rewrites the batch dimension"):
        parse_settings(**base, dynamic_batch=True)
    plain = parse_settings(**base, model=str(SQUEEZENET))
    rewritten = parse_settings(**base, model=str(SQUEEZENET), dynamic_batch=True)
    assert rewritten.measurement()["dynamic_batch"] is True
    manifest = Manifest(run_id="r1", state="incomplete", created_at="t", settings=plain.to_json())
    check_resumable(manifest, plain)
    with pytest.raises(UsageError, match="dynamic_batch: was False, now True"):
        check_resumable(manifest, rewritten)


# -- the inspection and the rewriting, on ONNX's own ImageNet test models ------------------


def test_inspect_reads_the_fixed_batch_and_the_old_style_initializer_inputs():
    info = onnxprep.inspect(SQUEEZENET)
    assert info.fixed_batch == 1
    assert [(s.name, s.shape) for s in info.inputs] == [("data_0", (1, 3, 224, 224))]
    assert (info.ir_version, info.opset, info.initializer_inputs) == (3, 9, 52)


def test_a_fixed_batch_is_rewritten_as_dynamic_in_a_copy(tmp_path):
    before = hashlib.sha256(SQUEEZENET.read_bytes()).hexdigest()
    target = tmp_path / "derived.onnx"
    changed = onnxprep.make_batch_dynamic(SQUEEZENET, target)
    assert changed == ["data_0 dim 0: 1 -> batch", "softmaxout_1 dim 0: 1 -> batch"]
    assert hashlib.sha256(SQUEEZENET.read_bytes()).hexdigest() == before
    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == ["batch", 3, 224, 224]
    (out,) = session.run(None, {"data_0": np.zeros((3, 3, 224, 224), np.float32)})
    assert out.shape[0] == 3


def test_a_batch_hard_coded_in_a_reshape_refuses_the_rewrite_saying_where(tmp_path):
    target = tmp_path / "derived.onnx"
    with pytest.raises(onnxprep.RewriteRefused) as refused:
        onnxprep.make_batch_dynamic(RESNET50, target)
    assert "light_resnet50.onnx cannot take a batch other than 1" in str(refused.value)
    assert "Reshape n173 to [1, 2048]" in str(refused.value)
    assert not target.exists()


def test_weights_that_a_quantizer_would_not_see_as_constants_are_named():
    assert onnxprep.quantization_blockers(SQUEEZENET) == [
        "52 initializers listed as graph inputs",
        "26 weights computed by nodes, e.g. conv1_w_0 (from ConstantOfShape)",
    ]
    assert onnxprep.quantization_blockers(models.embedded("tiny-cnn").path) == []
