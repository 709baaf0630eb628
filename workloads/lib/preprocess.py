"""Image preprocessing backends behind one contract, timed stage by stage.

Contract (every backend): decode to RGB; resize so the shorter side is
``Transform.shorter`` pixels (the other side scaled and rounded) with bilinear
interpolation that antialiases when shrinking; center-crop ``Transform.crop`` square;
subtract ``mean`` and divide by ``std`` per channel (0..255 scale); NCHW float32.

The DALI backends (``workloads.lib.dali``) resize with DALI's linear filter, antialiased,
scale taken from the rounded output size (``subpixel_scale=False``, as PIL does).

Backends differ only where their libraries do: PIL's bilinear filter widens its
support when shrinking (a triangle filter over the source pixels), OpenCV's nearest
equivalent is ``INTER_AREA`` (a box filter) when shrinking and ``INTER_LINEAR`` when
enlarging. Parity against the reference (PIL) is measured, never assumed.
"""

from __future__ import annotations

import importlib
import io
import itertools
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
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
    """One backend. ``run`` is the fast path a service would use; ``staged`` times every
    stage apart (the same as ``run`` where the backend's fast path already does)."""

    name: str
    transform: Transform

    def run(self, images: Sequence[bytes]) -> tuple[Batch, dict[str, float]]:
        """-> (NCHW float32 batch, seconds per stage span for the whole batch)."""
        ...

    def staged(self, images: Sequence[bytes]) -> tuple[Batch, dict[str, float]]: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class Unavailable(RuntimeError):
    """The backend cannot run here; the message says why and what to install."""


class DecodeError(ValueError):
    """One image of a batch could not be decoded; ``position`` is its index in the batch
    (the caller knows which file that is, the backend only sees bytes)."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"image {position} of the batch: {reason}")
        self.position = position
        self.reason = reason


# PIL names the stream it was given ("<_io.BytesIO object at 0x7f...>"): noise, not a name
_STREAM = re.compile(r"\s*<_io\.BytesIO object at 0x[0-9a-fA-F]+>")


def decode_reason(exc: BaseException) -> str:
    """A decoder's exception as one line that does not name an in-memory stream."""
    text = _STREAM.sub("", str(exc)).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _CpuBackend:
    """Decode, resize+crop and normalize image by image; ``threads`` > 1 splits a batch
    into contiguous slices, one per worker thread (the libraries release the GIL while
    decoding and resizing). Stage seconds are summed over threads: cost, not wall time."""

    name = "cpu"
    interpolation = ""

    def __init__(self, transform: Transform | None = None, threads: int = 1) -> None:
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self.transform = transform or Transform()
        self.threads = threads
        self._pool = (
            ThreadPoolExecutor(threads, thread_name_prefix=self.name) if threads > 1 else None
        )

    def decode(self, data: bytes) -> Any:
        raise NotImplementedError

    def resize(self, image: Any) -> npt.NDArray[np.uint8]:
        raise NotImplementedError

    def _decode_at(self, images: Sequence[bytes], i: int) -> Any:
        try:
            return self.decode(images[i])
        except MemoryError:
            raise  # the process, not the image: must stay recognizable as fatal
        except Exception as exc:  # PIL, OpenCV and NumPy each raise their own types
            raise DecodeError(i, decode_reason(exc)) from exc

    def _fill(self, out: Batch, images: Sequence[bytes], rows: range) -> dict[str, float]:
        spent = dict.fromkeys(STAGES, 0.0)
        clock = time.perf_counter
        for i in rows:
            t0 = clock()
            decoded = self._decode_at(images, i)
            t1 = clock()
            cropped = self.resize(decoded)
            t2 = clock()
            out[i] = self.transform.normalize(cropped)
            t3 = clock()
            spent["decode"] += t1 - t0
            spent["resize"] += t2 - t1
            spent["normalize"] += t3 - t2
        return spent

    def run(self, images: Sequence[bytes]) -> tuple[Batch, dict[str, float]]:
        t = self.transform
        out = np.empty((len(images), 3, t.crop, t.crop), dtype=np.float32)
        if self._pool is None or len(images) < 2:
            return out, self._fill(out, images, range(len(images)))
        bounds = np.linspace(0, len(images), min(self.threads, len(images)) + 1).astype(int)
        parts = [
            self._pool.submit(self._fill, out, images, range(lo, hi))
            for lo, hi in itertools.pairwise(bounds)
        ]
        spent = dict.fromkeys(STAGES, 0.0)
        for part in parts:
            for stage, seconds in part.result().items():
                spent[stage] += seconds
        return out, spent

    def staged(self, images: Sequence[bytes]) -> tuple[Batch, dict[str, float]]:
        """Each stage over the whole batch before the next, ``threads`` at a time: wall
        seconds per stage, the same measure as DALI's stage pipelines."""
        t = self.transform
        each = self._pool.map if self._pool is not None else map
        clock = time.perf_counter
        t0 = clock()
        decoded = list(each(lambda i: self._decode_at(images, i), range(len(images))))
        t1 = clock()
        cropped = list(each(self.resize, decoded))
        t2 = clock()
        out = np.stack(list(each(t.normalize, cropped)))
        t3 = clock()
        return out, {"decode": t1 - t0, "resize": t2 - t1, "normalize": t3 - t2}

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "threads": self.threads,
            "interpolation": self.interpolation,
            "transform": asdict(self.transform),
            "versions": self.versions(),
        }

    def versions(self) -> dict[str, str]:
        return {"numpy": np.__version__}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


class PilPreprocessor(_CpuBackend):
    """The reference: Pillow decode, ``Image.resize(BILINEAR)`` (antialiased), NumPy."""

    name = "pil"
    interpolation = "PIL BILINEAR (triangle filter widened when shrinking: antialiased)"

    def __init__(self, transform: Transform | None = None, threads: int = 1) -> None:
        self._image = _require("PIL.Image", "pillow", "preprocessing")
        super().__init__(transform, threads)

    def decode(self, data: bytes) -> Any:
        return self._image.open(io.BytesIO(data)).convert("RGB")  # convert forces the decode

    def resize(self, image: Any) -> npt.NDArray[np.uint8]:
        t = self.transform
        w, h = t.size_for(*image.size)
        small = image.resize((w, h), self._image.Resampling.BILINEAR)
        x, y = t.crop_box(w, h)
        return np.asarray(small.crop((x, y, x + t.crop, y + t.crop)))

    def versions(self) -> dict[str, str]:
        return super().versions() | {"pillow": importlib.import_module("PIL").__version__}


class OpenCvPreprocessor(_CpuBackend):
    """OpenCV decode (BGR, converted to RGB), ``INTER_AREA`` shrinking, NumPy normalize."""

    name = "opencv"
    interpolation = "OpenCV INTER_AREA when shrinking (box filter), INTER_LINEAR enlarging"

    def __init__(self, transform: Transform | None = None, threads: int = 1) -> None:
        self._cv2 = _require("cv2", "opencv-python-headless", "preprocessing")
        # OpenCV's own thread pool would compete with ours; one variable at a time.
        self._cv2.setNumThreads(1)
        super().__init__(transform, threads)

    def decode(self, data: bytes) -> npt.NDArray[np.uint8]:
        cv2 = self._cv2
        bgr = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
        if bgr is None:
            raise ValueError("OpenCV could not decode the image")
        return np.asarray(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), dtype=np.uint8)

    def resize(self, image: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
        cv2, t = self._cv2, self.transform
        h0, w0 = image.shape[:2]
        w, h = t.size_for(w0, h0)
        shrink = w < w0 or h < h0
        small = cv2.resize(
            image, (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
        )
        x, y = t.crop_box(w, h)
        return np.asarray(small[y : y + t.crop, x : x + t.crop], dtype=np.uint8)

    def versions(self) -> dict[str, str]:
        return super().versions() | {"opencv": str(self._cv2.__version__)}


def _require(module: str, package: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise Unavailable(
            f"{module} is not installed ({exc}); pip install {package}"
            f" (the harness's {extra!r} extra)"
        ) from None


def parity(out: Batch, reference: Batch) -> dict[str, float]:
    """Absolute differences in normalized units (1.0 is one standard deviation)."""
    if out.shape != reference.shape:
        raise ValueError(f"shapes differ: {out.shape} vs {reference.shape}")
    diff = np.abs(out.astype(np.float64) - reference.astype(np.float64))
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean())}
