"""Image preprocessing backends behind one contract, timed stage by stage.

Contract (every backend): decode to RGB; resize so the shorter side is
``Transform.shorter`` pixels (the other side scaled and rounded) with bilinear
interpolation that antialiases when shrinking; center-crop ``Transform.crop`` square;
subtract ``mean`` and divide by ``std`` per channel (0..255 scale); NCHW float32.

Backends differ only where their libraries do: PIL's bilinear filter widens its
support when shrinking (a triangle filter over the source pixels), OpenCV's nearest
equivalent is ``INTER_AREA`` (a box filter) when shrinking and ``INTER_LINEAR`` when
enlarging. Parity against the reference (PIL) is measured, never assumed.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Batch = npt.NDArray[np.float32]
STAGES = ("decode", "resize", "normalize")


@dataclass(frozen=True)
class Transform:
    shorter: int = 73
    crop: int = 64
    mean: tuple[float, float, float] = (123.675, 116.28, 103.53)
    std: tuple[float, float, float] = (58.395, 57.12, 57.375)

    def __post_init__(self) -> None:
        if not 0 < self.crop <= self.shorter:
            raise ValueError("need 0 < crop <= shorter")
        if any(s <= 0 for s in self.std):
            raise ValueError("std must be > 0")

    def size_for(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after resizing the shorter side to ``shorter``."""
        if width <= height:
            return self.shorter, max(self.shorter, round(height * self.shorter / width))
        return max(self.shorter, round(width * self.shorter / height)), self.shorter

    def crop_box(self, width: int, height: int) -> tuple[int, int]:
        """Top-left corner (x, y) of the center crop."""
        return (width - self.crop) // 2, (height - self.crop) // 2

    def normalize(self, hwc: npt.NDArray[np.uint8]) -> Batch:
        mean = np.asarray(self.mean, dtype=np.float32)
        scale = 1.0 / np.asarray(self.std, dtype=np.float32)
        out: Batch = ((hwc.astype(np.float32) - mean) * scale).transpose(2, 0, 1)
        return np.ascontiguousarray(out)


class Preprocessor(Protocol):
    """``run(images)`` -> (NCHW float32 batch, seconds per stage for the whole batch)."""

    name: str

    def run(self, images: Sequence[bytes]) -> tuple[Batch, dict[str, float]]: ...


def _timed_batch(
    images: Sequence[bytes], t: Transform, decode: Any, resize: Any
) -> tuple[Batch, dict[str, float]]:
    spent = dict.fromkeys(STAGES, 0.0)
    out = np.empty((len(images), 3, t.crop, t.crop), dtype=np.float32)
    clock = time.perf_counter
    for i, data in enumerate(images):
        t0 = clock()
        rgb = decode(data)
        t1 = clock()
        cropped = resize(rgb)
        t2 = clock()
        out[i] = t.normalize(cropped)
        t3 = clock()
        spent["decode"] += t1 - t0
        spent["resize"] += t2 - t1
        spent["normalize"] += t3 - t2
    return out, spent


@dataclass(frozen=True)
class PilPreprocessor:
    """The reference: Pillow decode, ``Image.resize(BILINEAR)`` (antialiased), NumPy."""

    transform: Transform = Transform()
    name: str = "pil"

    def run(self, images: Sequence[bytes]) -> tuple[Batch, dict[str, float]]:
        from PIL import Image  # noqa: PLC0415

        t = self.transform

        def decode(data: bytes) -> Any:
            img = Image.open(io.BytesIO(data))
            return img.convert("RGB")  # forces the decode

        def resize(img: Any) -> npt.NDArray[np.uint8]:
            w, h = t.size_for(*img.size)
            small = img.resize((w, h), Image.Resampling.BILINEAR)
            x, y = t.crop_box(w, h)
            return np.asarray(small.crop((x, y, x + t.crop, y + t.crop)))

        return _timed_batch(images, t, decode, resize)


@dataclass(frozen=True)
class OpenCvPreprocessor:
    """OpenCV decode (BGR, converted to RGB), ``INTER_AREA`` shrinking, NumPy normalize."""

    transform: Transform = Transform()
    name: str = "opencv"

    def run(self, images: Sequence[bytes]) -> tuple[Batch, dict[str, float]]:
        import cv2  # noqa: PLC0415

        t = self.transform

        def decode(data: bytes) -> npt.NDArray[np.uint8]:
            bgr = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
            if bgr is None:
                raise ValueError("OpenCV could not decode the image")
            return np.asarray(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), dtype=np.uint8)

        def resize(rgb: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
            h0, w0 = rgb.shape[:2]
            w, h = t.size_for(w0, h0)
            shrink = w < w0 or h < h0
            small = cv2.resize(
                rgb, (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
            )
            x, y = t.crop_box(w, h)
            return np.asarray(small[y : y + t.crop, x : x + t.crop], dtype=np.uint8)

        return _timed_batch(images, t, decode, resize)


def parity(out: Batch, reference: Batch) -> dict[str, float]:
    """Absolute differences in normalized units (1.0 is one standard deviation)."""
    if out.shape != reference.shape:
        raise ValueError(f"shapes differ: {out.shape} vs {reference.shape}")
    diff = np.abs(out.astype(np.float64) - reference.astype(np.float64))
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean())}
