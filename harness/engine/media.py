"""The media a multimodal request carries: images as the user's encoded bytes.

Kept apart from the request types so that both the generative contract and the payload
builders (data URLs for the OpenAI chat API, decoded images for in-process engines) lean
on one definition, validated once, when the request is built.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

IMAGE_MIMES = frozenset({"image/png", "image/jpeg", "image/webp"})


@dataclass(frozen=True)
class ImageInput:
    """One image of a request: its encoded bytes (PNG, JPEG or WebP, as sent), its size in
    pixels and where it came from (a file path, a data URL's owner, or ``synthetic``)."""

    data: bytes
    mime: str
    width: int
    height: int
    source: str = "synthetic"

    def __post_init__(self) -> None:
        if self.mime not in IMAGE_MIMES:
            raise ValueError(f"image mime {self.mime!r} is not one of {sorted(IMAGE_MIMES)}")
        if self.width < 1 or self.height < 1:
            raise ValueError(f"image size {self.width}x{self.height} must be at least 1x1")
        if not self.data:
            raise ValueError(f"image {self.source!r} has no bytes")

    @property
    def pixels(self) -> int:
        return self.width * self.height

    def data_url(self) -> str:
        """The image as the OpenAI chat API's ``image_url`` takes it inline."""
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"
