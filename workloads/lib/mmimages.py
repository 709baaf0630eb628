"""Images for multimodal requests: synthetic ones from a declared distribution, and the
user's image files and data URLs, read and checked once.

A spec declares how many images a request carries and their sizes, each drawn per
request from the listed choices (uniformly)::

    count=1,size=224x224                    one 224x224 image a request
    count=1-3,size=224x224|448x448          1, 2 or 3 images, each of either size
    count=0|2,size=336x336,format=jpeg      none or two; JPEG (needs Pillow)

Synthetic images are smooth gradients with seeded noise (so neither PNG nor JPEG
compresses them to nothing), the same bytes for the same seed, spec and request index.
PNG is written with the standard library alone (zlib); JPEG needs Pillow.

A file's size is read from its header (PNG, JPEG; WebP through Pillow), so a truncated
or foreign file is refused where it is named, not by the engine mid-run.
"""

from __future__ import annotations

import base64
import binascii
import io
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from harness.api import ImageInput, UsageError

FORMATS = {"png": "image/png", "jpeg": "image/jpeg"}
MAX_SIDE = 8192
MAX_COUNT = 64
SUFFIX_MIMES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
SUFFIX_MIMES |= {".webp": "image/webp"}


class ImageSpecError(UsageError):
    """A malformed image spec; the message names the part and the expected form."""


@dataclass(frozen=True)
class ImageSpec:
    """Per request: a count drawn from ``counts``, each image's size from ``sizes``."""

    counts: tuple[int, ...]
    sizes: tuple[tuple[int, int], ...]
    format: str = "png"

    def __post_init__(self) -> None:
        if not self.counts or any(not 0 <= c <= MAX_COUNT for c in self.counts):
            raise ImageSpecError(f"image counts {self.counts} must be 0..{MAX_COUNT}")
        if not self.sizes or any(
            not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE) for w, h in self.sizes
        ):
            raise ImageSpecError(f"image sizes {self.sizes} must be 1..{MAX_SIDE} a side")
        if self.format not in FORMATS:
            raise ImageSpecError(f"image format {self.format!r} is not one of {sorted(FORMATS)}")

    def to_json(self) -> dict[str, object]:
        return {
            "counts": list(self.counts),
            "sizes": [f"{w}x{h}" for w, h in self.sizes],
            "format": self.format,
        }

    def __str__(self) -> str:
        counts = "|".join(map(str, self.counts))
        sizes = "|".join(f"{w}x{h}" for w, h in self.sizes)
        return f"count={counts},size={sizes},format={self.format}"


def parse_image_spec(text: str) -> ImageSpec:
    """``count=1-2,size=224x224|448x448[,format=png|jpeg]``; count defaults to 1."""
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in {"count", "size", "format"} or not value.strip():
            raise ImageSpecError(
                f"image spec {text!r}: {part!r} is not count=N|LO-HI, size=WxH[|WxH...] or"
                " format=png|jpeg"
            )
        fields[key] = value.strip()
    if "size" not in fields:
        raise ImageSpecError(f"image spec {text!r}: size=WxH is required")
    return ImageSpec(
        counts=_counts(text, fields.get("count", "1")),
        sizes=tuple(_size(text, s) for s in fields["size"].split("|")),
        format=fields.get("format", "png"),
    )


def _counts(text: str, value: str) -> tuple[int, ...]:
    try:
        if "-" in value:
            low, high = (int(v) for v in value.split("-", 1))
            if high < low:
                raise ValueError
            return tuple(range(low, high + 1))
        return tuple(int(v) for v in value.split("|"))
    except ValueError:
        raise ImageSpecError(
            f"image spec {text!r}: count={value} is not N, LO-HI or N|M|..."
        ) from None


def _size(text: str, value: str) -> tuple[int, int]:
    width, sep, height = value.lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit():
        raise ImageSpecError(f"image spec {text!r}: size {value!r} is not WxH, e.g. 224x224")
    return int(width), int(height)


# -- synthetic images ------------------------------------------------------------------------


def synthetic_images(spec: ImageSpec, n: int, seed: int) -> list[tuple[ImageInput, ...]]:
    """The images of ``n`` requests: request ``i``'s depend on ``seed`` and ``i`` only."""
    return [_request_images(spec, np.random.default_rng([seed, i])) for i in range(n)]


def _request_images(spec: ImageSpec, rng: np.random.Generator) -> tuple[ImageInput, ...]:
    count = int(rng.choice(spec.counts))
    images = []
    for _ in range(count):
        width, height = spec.sizes[int(rng.integers(len(spec.sizes)))]
        pixels = _pixels(rng, width, height)
        data = png_bytes(pixels) if spec.format == "png" else _jpeg_bytes(pixels)
        images.append(ImageInput(data, FORMATS[spec.format], width, height, "synthetic"))
    return tuple(images)


def _pixels(rng: np.random.Generator, width: int, height: int) -> npt.NDArray[np.uint8]:
    """A colour gradient at a random angle plus noise: every image distinct (an engine's
    image cache never hits), none trivially compressible."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    angle = rng.uniform(0, 2 * np.pi, size=3).astype(np.float32)
    ramp = np.cos(angle) * x[..., None] / width + np.sin(angle) * y[..., None] / height
    noise = rng.normal(0.0, 12.0, size=(height, width, 3)).astype(np.float32)
    return np.clip(127.5 + 100.0 * ramp + noise, 0, 255).astype(np.uint8)


def png_bytes(pixels: npt.NDArray[np.uint8]) -> bytes:
    """An RGB PNG of ``pixels`` [height, width, 3], with the standard library alone."""
    height, width, _ = pixels.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), pixels.reshape(height, -1)], axis=1)

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(rows.tobytes(), 6)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


def _jpeg_bytes(pixels: npt.NDArray[np.uint8]) -> bytes:
    try:
        from PIL import Image  # noqa: PLC0415
    except ImportError:
        raise ImageSpecError("format=jpeg needs Pillow: pip install pillow") from None
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=90)
    return out.getvalue()


# -- the user's images -----------------------------------------------------------------------


class ImageReadError(UsageError):
    """An image the user named that cannot be used; the message names it and why."""


def image_size(data: bytes, mime: str) -> tuple[int, int]:
    """(width, height) from the header; ValueError when the bytes are not that image."""
    if mime == "image/png":
        if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR" or len(data) < 24:
            raise ValueError("not a PNG file")
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    if mime == "image/jpeg":
        return _jpeg_size(data)
    return _pillow_size(data)


def _jpeg_size(data: bytes) -> tuple[int, int]:
    if data[:2] != b"\xff\xd8":
        raise ValueError("not a JPEG file")
    at = 2
    while at + 9 <= len(data):
        if data[at] != 0xFF:
            raise ValueError("a damaged JPEG file (no marker where one belongs)")
        marker = data[at + 1]
        length = struct.unpack(">H", data[at + 2 : at + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a frame header
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return int(width), int(height)
        at += 2 + length
    raise ValueError("a truncated JPEG file (no frame header)")


def _pillow_size(data: bytes) -> tuple[int, int]:
    try:
        from PIL import Image  # noqa: PLC0415
    except ImportError:
        raise ValueError("reading a WebP image needs Pillow: pip install pillow") from None
    try:
        with Image.open(io.BytesIO(data)) as image:
            return int(image.width), int(image.height)
    except Exception as exc:  # Pillow raises several unrelated types for bad bytes
        raise ValueError(f"not a readable image ({exc})") from None


def _checked(data: bytes, mime: str, source: str) -> ImageInput:
    if not data:
        raise ImageReadError(f"image {source} is empty")
    try:
        width, height = image_size(data, mime)
        return ImageInput(data, mime, width, height, source)
    except ValueError as exc:
        raise ImageReadError(f"image {source} cannot be used: {exc}") from None


def read_image_file(path: Path) -> ImageInput:
    """The image at ``path`` (PNG, JPEG or WebP, by its suffix), checked."""
    mime = SUFFIX_MIMES.get(path.suffix.lower())
    if mime is None:
        raise ImageReadError(
            f"image {path}: suffix {path.suffix or '(none)'} is not one of {sorted(SUFFIX_MIMES)}"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ImageReadError(f"image {path} cannot be read: {exc.strerror or exc}") from None
    return _checked(data, mime, str(path))


def read_data_url(url: str, owner: str) -> ImageInput:
    """The image of a ``data:image/...;base64,...`` URL; ``owner`` names where it was."""
    head, sep, payload = url.partition(",")
    mime = head.removeprefix("data:").removesuffix(";base64")
    if not sep or not head.endswith(";base64") or mime not in SUFFIX_MIMES.values():
        raise ImageReadError(
            f"image data URL in {owner} is not data:image/png|jpeg|webp;base64,..."
        )
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageReadError(f"image data URL in {owner} is not valid base64") from None
    return _checked(data, mime, f"data URL in {owner}")


def image_totals(images: tuple[ImageInput, ...]) -> tuple[int, int]:
    """(count, pixels) of one request's images."""
    return len(images), sum(image.pixels for image in images)


def request_samples(images: list[tuple[ImageInput, ...]]) -> dict[str, list[float]]:
    """Per request, in order: its image count and its pixels in all (a cell's samples)."""
    totals = [image_totals(one) for one in images]
    return {
        "image_count": [float(n) for n, _ in totals],
        "image_pixels": [float(p) for _, p in totals],
    }
