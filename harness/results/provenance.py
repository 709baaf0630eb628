"""What a run measured beyond its options, so that a resumed run cannot measure another.

Options name inputs; they do not pin them. The same ``--model`` path can hold another
model tomorrow, another engine release can be installed, the run can be resumed on
another machine or from other code. A run's manifest keeps the identity of each of
these; ``--resume`` recomputes it and refuses, listing every difference, when one
matrix would otherwise hold cells of two measurements.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from harness.results.environment import hardware


def file_digest(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            yield path


def content_digest(path: Path) -> str:
    """sha256 of a file, or of a directory's files (relative names and contents), so a
    model directory that changed any file reads as another model."""
    if path.is_file():
        return file_digest(path)
    outer = hashlib.sha256()
    for file in _files(path):
        outer.update(f"{file.relative_to(path).as_posix()}\0{file_digest(file)}\n".encode())
    return outer.hexdigest()


def _content(path: Path | None) -> dict[str, str] | None:
    if path is None:
        return None
    return {"path": str(path), "sha256": content_digest(path)}


def collect(
    *,
    model: Path | None,
    images: Path | None,
    environment: Mapping[str, Any],
) -> dict[str, Any]:
    """The identity of a run's inputs and instruments (stored in its manifest)."""
    git = environment.get("git") or {}
    return {
        "model": _content(model),
        "images": _content(images),
        "packages": dict(environment.get("packages") or {}),
        "hardware": hardware(environment),
        "code": git.get("commit"),
    }


def differences(
    before: Mapping[str, Any], now: Mapping[str, Any], *, same_machine: bool = True
) -> list[str]:
    """Every way ``now`` differs from ``before``, as sentences; unknown (None) on either
    side is no difference (a run from before a field existed cannot be checked on it)."""
    out: list[str] = []
    for name in ("model", "images"):
        was, new = before.get(name), now.get(name)
        if was and new and was.get("sha256") != new.get("sha256"):
            out.append(
                f"--{name} {new.get('path')} has other content than when the run started"
                f" (sha256 {str(was.get('sha256'))[:12]}... then, {str(new.get('sha256'))[:12]}..."
                " now)"
            )
    out += _changed("package", before.get("packages"), now.get("packages"))
    if same_machine:
        out += _changed("hardware", before.get("hardware"), now.get("hardware"))
    if before.get("code") and now.get("code") and before["code"] != now["code"]:
        out.append(
            f"the harness code is at commit {now['code']}, the run started at {before['code']}"
        )
    return out


def _changed(kind: str, was: Any, now: Any) -> list[str]:
    if not isinstance(was, Mapping) or not isinstance(now, Mapping) or not was:
        return []
    keys = sorted(set(was) | set(now))
    return [
        f"{kind} {key}: {was.get(key, 'absent')} then, {now.get(key, 'absent')} now"
        for key in keys
        if was.get(key) != now.get(key)
    ]
