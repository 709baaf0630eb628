"""Small JPEG/PNG files for tests that run the preprocessing workload through ``--images``
(the default corpus has photos up to 12 megapixels: seconds per pass)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

SIZES = ((120, 90), (90, 120), (161, 100), (100, 100))


def write_small_corpus(directory: Path, count: int = 12, seed: int = 0) -> Path:
    from PIL import Image  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        width, height = SIZES[i % len(SIZES)]
        pixels = rng.integers(0, 256, size=(height // 10 + 1, width // 10 + 1, 3), dtype=np.uint8)
        img = Image.fromarray(pixels).resize((width, height), Image.Resampling.NEAREST)
        fmt, ext = ("PNG", "png") if i % 3 == 0 else ("JPEG", "jpg")
        buf = io.BytesIO()
        img.save(buf, format=fmt)
        (directory / f"img{i:03d}.{ext}").write_bytes(buf.getvalue())
    return directory
