"""Embedded models: deterministic bytes, the declared shapes, and padding-neutral masking."""

import hashlib

import numpy as np
import pytest

from workloads.lib import models

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))


def session(name, seed=0):
    return ort.InferenceSession(
        str(models.embedded(name, seed).path), providers=["CPUExecutionProvider"]
    )


@pytest.mark.parametrize("name", sorted(models.BUILDERS))
def test_generation_is_deterministic_and_cached_by_content(name, tmp_path):
    a = models.embedded(name, seed=3)
    b = models.embedded(name, seed=3)
    assert a == b
    assert hashlib.sha256(a.path.read_bytes()).hexdigest() == a.sha256
    assert models.BUILDERS[name](3) == a.path.read_bytes()
    assert models.embedded(name, seed=4).sha256 != a.sha256
    assert a.path.parent == tmp_path / "models"


def test_cached_file_that_was_tampered_with_is_rebuilt():
    m = models.embedded("tiny-cnn")
    m.path.write_bytes(b"garbage")
    again = models.embedded("tiny-cnn")
    assert hashlib.sha256(again.path.read_bytes()).hexdigest() == m.sha256


def test_cnn_shapes_and_dynamic_batch():
    s = session("tiny-cnn")
    assert [i.shape for i in s.get_inputs()] == [["batch", 3, 64, 64]]
    for b in (1, 5):
        (logits,) = s.run(None, {"image": np.ones((b, 3, 64, 64), np.float32)})
        assert logits.shape == (b, models.CLASSES)
        assert np.isfinite(logits).all()


def test_cnn_dynhw_accepts_any_size():
    s = session("tiny-cnn-dynhw")
    assert s.get_inputs()[0].shape == ["batch", 3, "height", "width"]
    for hw in ((32, 48), (128, 96)):
        (logits,) = s.run(None, {"image": np.ones((2, 3, *hw), np.float32)})
        assert logits.shape == (2, models.CLASSES)


def test_encoder_padding_with_mask_leaves_the_embedding_unchanged():
    s = session("tiny-encoder")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, models.VOCAB, size=(1, 20))
    (plain,) = s.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    padded_ids = np.pad(ids, ((0, 0), (0, 44)))
    mask = np.pad(np.ones_like(ids), ((0, 0), (0, 44)))
    (padded,) = s.run(None, {"input_ids": padded_ids, "attention_mask": mask})
    assert plain.shape == (1, models.HIDDEN)
    np.testing.assert_allclose(padded, plain, atol=1e-5)
    # without the mask, padding does change the answer: the mask is really used
    (unmasked,) = s.run(None, {"input_ids": padded_ids, "attention_mask": np.ones_like(padded_ids)})
    assert np.abs(unmasked - plain).max() > 1e-3


def test_unknown_model_name():
    with pytest.raises(KeyError, match="no embedded model 'nope'"):
        models.embedded("nope")
