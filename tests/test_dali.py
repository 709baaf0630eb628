"""DALI in CPU mode against the preprocessing contract: the same batch as the PIL
reference within the stated tolerance, the contract's crop corner, batch after batch
through one pipeline, stage pipelines, and the GPU backend's reason where there is no
GPU. Runs where nvidia-dali is installed (``tox -e dali``)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from harness.results.records import Status
from tests.support.imagefiles import write_small_corpus
from tests.support.runner import run_workloads
from workloads.lib import backends, images, pipeline, preprocess

dali = pytest.importorskip("nvidia.dali")
Image = pytest.importorskip("PIL.Image")


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def backend():
    made = backends.make("dali-cpu", threads=2)
    yield made
    made.close()


def test_a_flat_image_normalizes_exactly(backend):
    color = np.array([200, 100, 50], dtype=np.uint8)
    flat = np.broadcast_to(color, (300, 500, 3)).copy()
    batch, spent = backend.run([_png(flat)])
    t = backend.transform
    assert batch.shape == (1, 3, t.crop, t.crop)
    assert batch.dtype == np.float32
    expected = (color.astype(np.float32) - np.array(t.mean)) / np.array(t.std)
    np.testing.assert_allclose(batch[0].mean(axis=(1, 2)), expected, atol=1e-4)
    assert set(spent) == {"pipeline"}
    assert spent["pipeline"] > 0


def test_the_crop_corner_is_the_contracts_on_odd_margins(backend):
    # 97x73 needs no resize; the crop's spare width is 33: the contract takes x=16, DALI's
    # own rounding of 0.5 * 33 would take 17. Every column has its own value.
    pixels = np.zeros((73, 97, 3), dtype=np.uint8)
    pixels[:, :, 0] = np.arange(97, dtype=np.uint8)[None, :] * 2
    pixels[:, :, 1] = np.arange(73, dtype=np.uint8)[:, None] * 3
    ours, _ = backend.run([_png(pixels)])
    reference = preprocess.PilPreprocessor()
    expected, _ = reference.run([_png(pixels)])
    np.testing.assert_allclose(ours, expected, atol=1e-4)
    t = backend.transform
    first_column = ours[0, 0, 0, 0] * t.std[0] + t.mean[0]
    assert first_column == pytest.approx(2 * 16, abs=1e-3)


def test_batch_after_batch_matches_the_reference(backend):
    corpus = [d for _, d in images.generate(images.CorpusSpec(count=12, large_share=0.0))]
    reference = preprocess.PilPreprocessor()
    for start in range(0, 12, 4):  # one pipeline, fed before every run (prefetch depth 1)
        batch = corpus[start : start + 4]
        ours, _ = backend.run(batch)
        expected, _ = reference.run(batch)
        found = pipeline.compare(
            ours, expected, [str(i) for i in range(4)], None, pipeline.Tolerance()
        )
        assert found["within_tolerance"], found
        assert found["max_abs"] > 0  # a different resampler, not a copy of PIL's output


def test_stage_pipelines_give_the_fused_batch_with_a_time_per_stage(backend):
    corpus = [d for _, d in images.generate(images.CorpusSpec(count=4, large_share=0.0))]
    fused, _ = backend.run(corpus)
    staged, spent = backend.staged(corpus)
    np.testing.assert_array_equal(staged, fused)
    assert set(spent) == set(preprocess.STAGES)
    assert all(v > 0 for v in spent.values())
    info = backend.describe()
    assert info["threads"] == 2
    assert info["prefetch_queue_depth"] == 1
    assert info["versions"]["dali"] == dali.__version__


def test_dali_gpu_says_it_needs_a_gpu():
    if dali.backend.GetCUDADeviceCount() > 0:
        pytest.skip("a GPU is present: dali-gpu can run here")
    with pytest.raises(preprocess.Unavailable, match="dali-gpu needs an NVIDIA GPU"):
        backends.make("dali-gpu")


@pytest.mark.slow
def test_the_workload_runs_dali_cpu_cells_ok(tmp_path: Path):
    pytest.importorskip("onnxruntime")
    result = run_workloads(
        tmp_path,
        "--engine=onnxruntime",
        "--window=1.2",
        f"--images={write_small_corpus(tmp_path / 'images')}",
        "-k",
        "test_preprocessing.py and dali",
    )
    assert result.returncode == 0, result.stdout[-4000:]
    by_backend: dict[str, list] = {}
    for rec in result.records.values():
        by_backend.setdefault(str(rec.params["backend"]), []).append(rec)
    assert len(by_backend["dali-cpu"]) == 4 + 2
    for rec in by_backend["dali-cpu"]:
        assert rec.status is Status.OK, rec.reasons
        assert rec.metrics["parity"]["within_tolerance"], rec.metrics["parity"]
        assert rec.engine_info["preprocessing"]["backend"] == "dali-cpu"
        if rec.workload == "preprocessing":
            assert rec.metrics["stage_times"]["decode"]["per_image_s"] > 0
        else:
            assert rec.metrics["parity"]["top1_agreement"] == 1.0
    assert all(r.status is Status.SKIPPED for r in by_backend["dali-gpu"])
