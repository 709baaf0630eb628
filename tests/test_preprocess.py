"""The image corpus and the CPU preprocessing backends: determinism, one output contract,
and measured parity between backends."""

from __future__ import annotations

import io

import numpy as np
import pytest

from workloads.lib import backends, images, preprocess

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("cv2")

BACKENDS = [preprocess.PilPreprocessor(), preprocess.OpenCvPreprocessor()]


def test_the_corpus_is_the_same_bytes_for_the_same_seed():
    spec = images.CorpusSpec(count=6, seed=3, png_share=0.5, large_share=0.0)
    first, again = images.generate(spec), images.generate(spec)
    assert first == again
    assert images.generate(images.CorpusSpec(count=6, seed=4, large_share=0.0)) != first
    formats = {name.rsplit(".", 1)[1] for name, _ in first}
    assert formats == {"jpg", "png"}
    for name, data in first:
        size = name.split("_")[1].split(".")[0]
        with Image.open(io.BytesIO(data)) as img:
            assert f"{img.width}x{img.height}" == size


def test_the_corpus_is_cached_and_loaded_in_order(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    spec = images.CorpusSpec(count=3, large_share=0.0)
    directory = images.corpus_dir(spec)
    assert images.corpus_dir(spec) == directory  # second call: the cache
    assert images.load(directory) == images.generate(spec)
    with pytest.raises(ValueError, match=r"no \.jpg"):
        images.load(tmp_path)


def test_resize_keeps_the_aspect_ratio_on_the_shorter_side():
    t = preprocess.Transform(shorter=73, crop=64)
    assert t.size_for(640, 480) == (97, 73)
    assert t.size_for(480, 640) == (73, 97)
    assert t.size_for(73, 73) == (73, 73)
    assert t.crop_box(97, 73) == (16, 4)
    with pytest.raises(ValueError, match="crop"):
        preprocess.Transform(shorter=32, crop=64)


def _encoded(pixels: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_every_backend_meets_the_output_contract(backend):
    color = np.array([200, 100, 50], dtype=np.uint8)
    flat = np.broadcast_to(color, (300, 500, 3)).copy()
    batch, spent = backend.run([_encoded(flat, "PNG"), _encoded(flat, "JPEG")])
    assert batch.shape == (2, 3, 64, 64)
    assert batch.dtype == np.float32
    t = backend.transform
    expected = (color.astype(np.float32) - np.array(t.mean)) / np.array(t.std)
    # PNG is lossless: exact; JPEG moves a flat colour by a level or two
    np.testing.assert_allclose(batch[0].mean(axis=(1, 2)), expected, atol=1e-4)
    np.testing.assert_allclose(batch[1].mean(axis=(1, 2)), expected, atol=0.05)
    assert set(spent) == set(preprocess.STAGES)
    assert all(v > 0 for v in spent.values())


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_the_center_crop_is_taken_from_the_middle(backend):
    # left half red, right half blue: the crop's left columns red, right columns blue
    pixels = np.zeros((100, 200, 3), dtype=np.uint8)
    pixels[:, :100] = (255, 0, 0)
    pixels[:, 100:] = (0, 0, 255)
    batch, _ = backend.run([_encoded(pixels, "PNG")])
    red = batch[0, 0]
    assert red[:, :20].mean() > red[:, -20:].mean() + 3.0  # normalized units


def test_opencv_agrees_with_the_pil_reference_on_the_corpus():
    corpus = [data for _, data in images.generate(images.CorpusSpec(count=8, large_share=0.0))]
    ref, _ = preprocess.PilPreprocessor().run(corpus)
    out, _ = preprocess.OpenCvPreprocessor().run(corpus)
    diff = preprocess.parity(out, ref)
    # area vs triangle filter: small on average, larger only at sharp edges
    assert diff["mean_abs"] < 0.05
    assert diff["max_abs"] < 1.5
    assert preprocess.parity(ref, ref) == {"max_abs": 0.0, "mean_abs": 0.0}


def test_worker_threads_and_staged_runs_give_the_same_batch():
    corpus = [data for _, data in images.generate(images.CorpusSpec(count=5, large_share=0.0))]
    for cls in (preprocess.PilPreprocessor, preprocess.OpenCvPreprocessor):
        one = cls(threads=1)
        three = cls(threads=3)
        try:
            expected, _ = one.run(corpus)
            threaded, spent = three.run(corpus)
            staged, walls = three.staged(corpus)
        finally:
            one.close()
            three.close()
        np.testing.assert_array_equal(threaded, expected)
        np.testing.assert_array_equal(staged, expected)
        assert set(spent) == set(walls) == set(preprocess.STAGES)
        assert all(v > 0 for v in walls.values())
        assert three.describe()["threads"] == 3


def test_backends_are_made_by_name_and_say_why_they_cannot_run(monkeypatch):
    pil = backends.make("pil", threads=2)
    assert (pil.name, pil.describe()["threads"]) == ("pil", 2)
    assert "pillow" in pil.describe()["versions"]
    pil.close()
    with pytest.raises(ValueError, match="no preprocessing backend 'magick'; have dali-cpu"):
        backends.make("magick")
    with pytest.raises(ValueError, match="threads"):
        preprocess.PilPreprocessor(threads=0)
    real = preprocess.importlib.import_module

    def no_cv2(name: str):
        if name == "cv2":
            raise ImportError("No module named 'cv2'")
        return real(name)

    monkeypatch.setattr(preprocess.importlib, "import_module", no_cv2)
    with pytest.raises(preprocess.Unavailable, match="pip install opencv-python-headless"):
        backends.make("opencv")
