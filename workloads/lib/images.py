"""A seeded synthetic image corpus for the preprocessing workload, generated and cached.

Images are JPEG and PNG files in a spread of sizes and aspect ratios (some large), drawn
with gradients, shapes and noise so that JPEG encoding does real work. The same seed and
spec give the same bytes; the corpus is cached under ``$HARNESS_CACHE_DIR/images``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from harness.api import cache_root
from harness.session.config import IMAGE_SUFFIXES

SIZES = ((320, 240), (640, 480), (800, 600), (1024, 768), (480, 640), (1280, 720), (1920, 1080))
LARGE = ((4032, 3024),)


@dataclass(frozen=True)
class CorpusSpec:
    count: int = 64
    seed: int = 0
    png_share: float = 0.25
    large_share: float = 0.05
    jpeg_quality: int = 90

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.png_share <= 1 or not 0 <= self.large_share <= 1:
            raise ValueError("a corpus needs >= 1 image and shares in [0, 1]")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError("jpeg_quality is 1..100")

    def key(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _pixels(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """RGB uint8: two gradients, a few filled rectangles and some noise."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.empty((height, width, 3), dtype=np.float32)
    for c in range(3):
        a, b = rng.uniform(-1, 1, size=2)
        img[..., c] = 128 + 100 * np.sin(a * x / width * 6 + b * y / height * 6 + c)
    for _ in range(int(rng.integers(3, 8))):
        x0, y0 = int(rng.integers(0, width - 8)), int(rng.integers(0, height - 8))
        w, h = int(rng.integers(8, width // 2 + 9)), int(rng.integers(8, height // 2 + 9))
        img[y0 : y0 + h, x0 : x0 + w] = rng.uniform(0, 255, size=3)
    img += rng.normal(0, 6, size=img.shape)
    pixels: np.ndarray = np.clip(img, 0, 255).astype(np.uint8)
    return pixels


def _encode(pixels: np.ndarray, fmt: str, quality: int) -> bytes:
    from PIL import Image  # noqa: PLC0415

    buf = io.BytesIO()
    if fmt == "jpeg":
        Image.fromarray(pixels).save(buf, format="JPEG", quality=quality)
    else:
        Image.fromarray(pixels).save(buf, format="PNG", compress_level=6)
    return buf.getvalue()


def generate(spec: CorpusSpec) -> list[tuple[str, bytes]]:
    """``(file name, encoded bytes)`` for every image of the corpus, in order."""
    rng = np.random.default_rng(spec.seed)
    out = []
    for i in range(spec.count):
        large = rng.random() < spec.large_share
        width, height = LARGE[0] if large else SIZES[int(rng.integers(0, len(SIZES)))]
        fmt = "png" if rng.random() < spec.png_share else "jpeg"
        data = _encode(_pixels(rng, width, height), fmt, spec.jpeg_quality)
        out.append((f"img{i:05d}_{width}x{height}.{'png' if fmt == 'png' else 'jpg'}", data))
    return out


def corpus_dir(spec: CorpusSpec) -> Path:
    """The cached corpus for ``spec`` (generated on first use, atomically)."""
    target = cache_root() / "images" / spec.key()
    if (target / "spec.json").is_file():
        return target
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    for name, data in generate(spec):
        (tmp / name).write_bytes(data)
    (tmp / "spec.json").write_text(json.dumps(asdict(spec), sort_keys=True))
    try:
        tmp.rename(target)
    except OSError:  # another process won the race; its corpus is the same bytes
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
    return target


def load(directory: Path) -> list[tuple[str, bytes]]:
    """Every JPEG and PNG file of ``directory``, sorted by name."""
    files = sorted(p for p in directory.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"{directory} holds no .jpg, .jpeg or .png file")
    return [(p.name, p.read_bytes()) for p in files]
