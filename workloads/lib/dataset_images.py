"""Image references in the user's dataset rows, resolved and checked when the file is read.

Two forms are read (``workloads.lib.datasets`` calls ``extract`` on the rows it read):

* OpenAI chat content lists: a turn's ``content`` (or ShareGPT ``value``) is a list of
  ``{"type": "text", "text": ...}`` and ``{"type": "image_url", "image_url": {"url":
  ...}}`` parts, the URL a ``data:image/...;base64,`` URL, a ``file://`` URL or a path;
* LLaVA-style rows: an ``image`` (one path) or ``images`` (a list) field beside the
  conversation, whose turns mark the image with ``<image>`` (the marker is dropped: the
  engine places images itself, from the model's chat template).

Paths are relative to the dataset file's folder. A row's images all go with its request
(``GenerationRequest.images``, sent with the last user turn), so they are read once here:
a missing or unreadable image is a usage error naming the file and the row (its line in
a JSONL file), never a failed request mid-run. Audio and video parts are refused by
name: the harness sends images only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from harness.api import ImageInput
from workloads.lib.mmimages import ImageReadError, read_data_url, read_image_file

IMAGES_KEY = "__harness_images__"
"""Where a row carries its resolved images from ``extract`` to the entry built from it."""
MARKER = "<image>"


def extract(rows: list[object], path: Path, fmt: str) -> list[object]:
    """``rows`` with their image references resolved into ``IMAGES_KEY`` and their content
    lists turned into text; rows without images come back as they were."""
    unit = "line" if fmt == "jsonl" else "row"
    return [_row(row, path, f"{path} {unit} {i + 1}") for i, row in enumerate(rows)]


def images_of(row: Mapping[str, Any]) -> tuple[ImageInput, ...]:
    images: tuple[ImageInput, ...] = row.get(IMAGES_KEY, ())
    return images


def _row(row: object, path: Path, where: str) -> object:
    if not isinstance(row, Mapping):
        return row
    images: list[ImageInput] = []
    out = dict(row)
    for key in ("conversations", "messages"):
        turns = row.get(key)
        if isinstance(turns, list):
            out[key] = [_turn(turn, path, where, images) for turn in turns]
    listed = _listed(row, where)
    images += [_resolve(ref, path, where) for ref in listed]
    if not images:
        return row
    if listed:  # LLaVA's markers say where the image went; the template places it here
        for key in ("conversations", "messages"):
            if isinstance(out.get(key), list):
                out[key] = [_unmark(turn) for turn in out[key]]
    out[IMAGES_KEY] = tuple(images)
    return out


def _listed(row: Mapping[str, Any], where: str) -> list[str]:
    value = row.get("images", row.get("image"))
    if value is None:
        return []
    refs = [value] if isinstance(value, str) else value
    if not isinstance(refs, list) or not all(isinstance(r, str) and r for r in refs):
        raise ImageReadError(f"{where}: image/images must be a path or a list of paths")
    return refs


def _turn(turn: object, path: Path, where: str, images: list[ImageInput]) -> object:
    if not isinstance(turn, Mapping):
        return turn
    key = "content" if "content" in turn else "value"
    parts = turn.get(key)
    if not isinstance(parts, list):
        return turn
    texts = []
    for part in parts:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            images.append(_resolve(_url(part, where), path, where))
        else:
            named = kind if isinstance(kind, str) else repr(part)
            raise ImageReadError(
                f"{where}: content part {named} is not sent (the harness sends"
                " text and image_url parts; audio and video are not supported)"
            )
    return dict(turn) | {key: "\n".join(texts)}


def _url(part: Mapping[str, Any], where: str) -> str:
    field = part.get("image_url")
    url = field.get("url") if isinstance(field, Mapping) else field
    if not isinstance(url, str) or not url:
        raise ImageReadError(f"{where}: an image_url part without a url")
    return url


def _resolve(ref: str, path: Path, where: str) -> ImageInput:
    if ref.startswith("data:"):
        return read_data_url(ref, where)
    parsed = urlsplit(ref)
    if parsed.scheme in ("http", "https"):
        raise ImageReadError(
            f"{where}: image {ref} is remote; the harness sends local files and data URLs"
            " only (download it, and name the file)"
        )
    local = Path(unquote(parsed.path)) if parsed.scheme == "file" else Path(ref)
    file = local if local.is_absolute() else path.parent / local
    if not file.is_file():
        raise ImageReadError(f"{where}: image file {file} does not exist")
    try:
        return read_image_file(file)
    except ImageReadError as exc:
        raise ImageReadError(f"{where}: {exc}") from None


def _unmark(turn: object) -> object:
    if not isinstance(turn, Mapping):
        return turn
    key = "content" if "content" in turn else "value"
    text = turn.get(key)
    if not isinstance(text, str) or MARKER not in text:
        return turn
    return dict(turn) | {key: text.replace(MARKER, "").strip()}
