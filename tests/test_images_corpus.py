"""A corrupt or truncated file under `--images` (issue 16, item 12): the corpus is decoded
once at start and the run stops with one usage error naming each bad file and why; a
backend that fails on an image inside a cell names the file too."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from tests.support.imagefiles import write_small_corpus
from tests.support.runner import pytest_workloads
from workloads.lib import pipeline
from workloads.lib.backends import make

Image = pytest.importorskip("PIL.Image")


def truncated_jpeg() -> bytes:
    rng = np.random.default_rng(1)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()[: len(buf.getvalue()) // 2]  # a download cut off half-way


def bad_corpus(directory: Path) -> Path:
    write_small_corpus(directory, count=3)
    (directory / "cut.jpg").write_bytes(truncated_jpeg())
    (directory / "notes.png").write_text("not a picture\n")
    return directory


@pytest.mark.slow
def test_undecodable_images_stop_the_run_with_one_message_naming_each(tmp_path):
    images = bad_corpus(tmp_path / "images")
    proc = pytest_workloads(tmp_path, f"--images={images}", "-k", "test_preprocessing.py and pil")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out[-3000:]
    assert (
        f"ERROR: --images {images}: 2 file(s) cannot be decoded by the reference decoder (PIL);"
        " remove or replace them:"
    ) in out
    assert "cut.jpg: OSError: image file is truncated" in out
    assert "notes.png: UnidentifiedImageError: cannot identify image file" in out
    assert "BytesIO" not in out
    assert "img000" not in out  # the good files are not listed
    assert "Traceback" not in out
    assert not (tmp_path / "runs").exists()


@pytest.fixture
def corpus(tmp_path):
    return pipeline.load_corpus(bad_corpus(tmp_path / "images"), seed=0)


@pytest.mark.parametrize("backend", ["pil", "opencv"])
def test_a_decode_error_inside_a_cell_names_the_file(corpus, backend):
    if backend == "opencv":
        pytest.importorskip("cv2")
    pre = make(backend, threads=2)
    try:
        with pytest.raises(pipeline.ImageError, match=r"cannot decode cut\.jpg \(") as error:
            pipeline.run_over(pre, corpus, 8)  # the parity pass every cell starts with
        assert str(corpus.source) in str(error.value)
        assert "BytesIO" not in str(error.value)
        good = pipeline.Corpus(corpus.names[2:], corpus.data[2:], corpus.source)
        assert good.names[-1] == "notes.png"
        with pytest.raises(pipeline.ImageError, match=r"cannot decode notes\.png"):
            pipeline.stage_pass(pre, good, 2)  # the staged pass, stage by stage
    finally:
        pre.close()
