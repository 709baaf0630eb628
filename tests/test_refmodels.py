"""The reference-sized tensor models, built for real and run on ONNX Runtime: their
inputs, outputs and dynamic axes are the tiny models' (so the workloads run unchanged),
their size is what their names say, the same seed gives the same file and another seed
another, and their activations stay in fp16's range. The builds take tens of seconds
(BERT-base is 440 MB): one module-wide cache serves every test."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from workloads.lib import models, refmodels

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

pytestmark = pytest.mark.slow

FP16_MAX = 65504.0


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        root = tmp_path_factory.mktemp("refmodels")
        patch.setenv("HARNESS_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def built(cache):
    return {name: refmodels.embedded(name, seed=0) for name in refmodels.BUILDERS}


def session(model):
    return ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])


def signature(sess):
    def io(values):
        return [(v.name, v.type, v.shape) for v in values]

    return io(sess.get_inputs()), io(sess.get_outputs())


def test_resnet50_is_resnet_50_sized_with_a_dynamic_batch(built):
    model = built["resnet50"]
    graph = onnx.load(str(model.path)).graph
    convs = [n for n in graph.node if n.op_type == "Conv"]
    # the stem, 3 per bottleneck (16 of them) and one projection per stage
    assert len(convs) == 1 + 3 * 16 + 4
    assert model.describe()["parameters"] == 25_530_472  # torchvision's 25.56M less batch norm
    sess = session(model)
    assert signature(sess) == (
        [("image", "tensor(float)", ["batch", 3, 224, 224])],
        [("logits", "tensor(float)", ["batch", 1000])],
    )
    rng = np.random.default_rng(0)
    images = rng.standard_normal((3, 3, 224, 224)).astype(np.float32)
    (three,) = sess.run(None, {"image": images})
    (one,) = sess.run(None, {"image": images[:1]})
    assert three.shape == (3, 1000)
    assert np.isfinite(three).all()
    np.testing.assert_allclose(one[0], three[0], rtol=1e-4, atol=1e-4)


def test_resnet50_dynhw_takes_any_height_and_width(built):
    sess = session(built["resnet50-dynhw"])
    assert signature(sess)[0] == [("image", "tensor(float)", ["batch", 3, "height", "width"])]
    rng = np.random.default_rng(1)
    for batch, hw in ((2, (224, 224)), (1, (96, 160))):
        (logits,) = sess.run(None, {"image": rng.standard_normal((batch, 3, *hw), np.float32)})
        assert logits.shape == (batch, 1000)
        assert np.isfinite(logits).all()


def test_bert_base_is_the_tiny_encoder_at_bert_base_size(built):
    model = built["bert-base"]
    assert model.describe()["parameters"] == 108_890_112  # BERT-base less token types, pooler
    tiny = ort.InferenceSession(
        str(models.embedded("tiny-encoder").path), providers=["CPUExecutionProvider"]
    )
    sess = session(model)
    inputs, outputs = signature(sess)
    assert inputs == signature(tiny)[0]
    assert inputs == [
        ("input_ids", "tensor(int64)", ["batch", "sequence"]),
        ("attention_mask", "tensor(int64)", ["batch", "sequence"]),
    ]
    assert outputs == [("embedding", "tensor(float)", ["batch", 768])]
    rng = np.random.default_rng(2)
    for batch, sequence in ((2, 16), (1, 128)):
        ids = rng.integers(0, 30522, size=(batch, sequence))
        (out,) = sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        assert out.shape == (batch, 768)
        assert np.isfinite(out).all()


def test_bert_base_padding_with_the_mask_leaves_the_embedding_unchanged(built):
    sess = session(built["bert-base"])
    ids = np.random.default_rng(3).integers(0, 30522, size=(1, 20))
    (plain,) = sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    padded = np.pad(ids, ((0, 0), (0, 44)))
    mask = np.pad(np.ones_like(ids), ((0, 0), (0, 44)))
    (masked,) = sess.run(None, {"input_ids": padded, "attention_mask": mask})
    np.testing.assert_allclose(masked, plain, atol=1e-4)
    (unmasked,) = sess.run(None, {"input_ids": padded, "attention_mask": np.ones_like(padded)})
    assert np.abs(unmasked - plain).max() > 1e-3  # the mask is really used


def _largest_activation(model, feeds) -> float:
    """The largest |value| of any float tensor the graph computes on ``feeds``."""
    proto = onnx.load(str(model.path))
    for node in proto.graph.node:
        if node.op_type not in ("Shape", "Squeeze", "Range", "Cast", "Gather"):
            proto.graph.output.append(onnx.helper.make_empty_tensor_value_info(node.output[0]))
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    values = [v for v in sess.run(None, feeds) if np.issubdtype(v.dtype, np.floating)]
    assert all(np.isfinite(v).all() for v in values)
    return max(float(np.abs(v).max()) for v in values)


def test_activations_stay_far_inside_fp16_through_every_layer(built):
    rng = np.random.default_rng(4)
    image = {"image": rng.standard_normal((2, 3, 224, 224)).astype(np.float32)}
    assert _largest_activation(built["resnet50"], image) < FP16_MAX / 100
    ids = rng.integers(0, 30522, size=(2, 64))
    text = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    assert _largest_activation(built["bert-base"], text) < FP16_MAX / 100


def test_the_same_seed_gives_the_same_file_and_another_seed_another(built):
    for name in ("resnet50", "resnet50-dynhw"):
        again = refmodels.BUILDERS[name].build(0)
        assert hashlib.sha256(again).hexdigest() == built[name].sha256
        assert hashlib.sha256(built[name].path.read_bytes()).hexdigest() == built[name].sha256
    other = refmodels.BUILDERS["resnet50-dynhw"].build(1)
    assert hashlib.sha256(other).hexdigest() != built["resnet50-dynhw"].sha256
    # the encoder's builder is the tiny one's, whose determinism tests/test_models.py checks;
    # BERT-base's file is vouched for by its note and its key
    bert = built["bert-base"]
    note = json.loads(bert.path.with_suffix(".json").read_text())
    assert note["sha256"] == bert.sha256 == hashlib.sha256(bert.path.read_bytes()).hexdigest()
    assert refmodels.cache_key("bert-base", 0) in bert.path.name
    assert refmodels.cache_key("bert-base", 1) != refmodels.cache_key("bert-base", 0)


def test_a_cache_hit_reuses_the_file_and_a_damaged_one_is_rebuilt(built, capsys):
    model = built["resnet50-dynhw"]
    built_at = model.path.stat().st_mtime_ns
    assert refmodels.embedded("resnet50-dynhw", seed=0) == model
    assert model.path.stat().st_mtime_ns == built_at  # reused, not rewritten
    data = bytearray(model.path.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: the note's sha256 catches it
    model.path.write_bytes(bytes(data))
    again = refmodels.embedded("resnet50-dynhw", seed=0)
    assert again.sha256 == model.sha256
    assert hashlib.sha256(again.path.read_bytes()).hexdigest() == model.sha256


def test_reference_models_use_only_operators_every_tensor_engine_runs_on_the_tiny_ones(built):
    """The torch engine converts ONNX node by node (engines/torch_onnx.py); it runs the
    tiny models, so the reference ones, made of the same operators, run there too."""
    tiny_ops = set()
    for name in models.BUILDERS:
        tiny_ops |= {n.op_type for n in onnx.load(str(models.embedded(name).path)).graph.node}
    for model in built.values():
        ops = {n.op_type for n in onnx.load(str(model.path)).graph.node}
        assert ops <= tiny_ops, ops - tiny_ops
