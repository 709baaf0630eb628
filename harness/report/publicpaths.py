"""Paths as published: a report names no absolute path of the machine that built it.

Records keep every path as measured (a rerun or a diagnosis needs them); what a report
writes rewrites them, so a published page, matrix or recommendation says nothing about
the file system of the machine that built it:

- under the project root (the git checkout of the current directory, else the current
  directory): relative to it, so a command reads as typed from the checkout
  (``.tox/bench/bin/pytest workloads ...``);
- under the user's home: ``~/...``;
- under a temporary directory: ``$TMPDIR/<name>``, only the last name kept, because the
  random directory names ``mktemp`` makes would change the bytes of every rebuild;
- under a system directory every Linux machine has (``/usr``, ``/proc``, ...): as is,
  since those name the software, not the machine;
- anywhere else: ``.../<name>``, but for an HTTP route of the servers measured
  (``/v1/chat/completions``), which is not a file.

Beyond the builder's own three folders the rules read the text only, never what exists
on the builder's disk, so a record from another machine (a Ray node, a copied run) is
published alike by every builder with the same root, home and temporary directory.

The most specific of root, home and temporary directory wins. The placeholders hold no
``<``, ``&``, ``|`` or quote, so they need no escaping in HTML, SVG, Markdown, CSV or
JSON and the rewrite can run over the finished text of each of them.

The hostname is kept: it is not a path, and like the CPU model it is evidence of which
machine measured a cell (on a Ray run, which node), which a reader of merged runs needs.
"""

from __future__ import annotations

import os
import posixpath
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

TEMP = "$TMPDIR"
ELSEWHERE = "..."
SYSTEM_DIRS = ("/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/proc", "/sys", "/dev")
"""Kept as they are; ``/dev/shm`` is a temporary directory and rewritten as one."""
TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # noqa: S108  (recognized in text, never written)

_ROUTE = re.compile(r"v\d+")
"""The first folder of an OpenAI-compatible server's routes (``/v1/models``)."""
_ESCAPE = re.compile(r"\\(.)")
# Markdown's backslash escapes (``john\_doe``) are part of a name: a path cut at one would
# leave the rest of it behind, and the escape is put back on what replaces it.
_NAME = r"(?:[\w.+@%=~-]|\\[\\`*_|\[\]])+"
# An absolute path in free text: a slash that starts a word, a quoted string (``&#34;/x``
# in HTML), an option's value (``--out=/x``), a list item (``a,/x``, ``a:/x``) or an
# element's text (``>/x``); never one inside a word (``req/s``), a URL (``https://``) or a
# closing tag (``</td>``).
_ABSOLUTE = re.compile(rf"(?<![^\s\"'`=(\[{{,;:>|])/{_NAME}(?:/{_NAME})*/?")


def project_root(start: Path | None = None) -> Path:
    """The git checkout ``start`` (default: the current directory) is in, else itself."""
    here = (start or Path.cwd()).absolute()
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            return folder
    return here


def _variants(path: str | Path) -> set[PurePosixPath]:
    """The path as given and with its links resolved (``/tmp`` may be ``/private/tmp``)."""
    given = PurePosixPath(posixpath.normpath(os.fspath(path)))
    return {given, PurePosixPath(os.path.realpath(given))}


@dataclass(frozen=True)
class PathStyle:
    """How one builder rewrites paths: each anchor directory with what replaces it."""

    anchors: tuple[tuple[PurePosixPath, str], ...]
    """(directory, kind) with kind "root", "home" or "temp"; the longest match wins."""

    @classmethod
    def of(cls, root: Path | None, home: Path | None, temp: tuple[Path, ...] = ()) -> PathStyle:
        found: dict[PurePosixPath, str] = {}
        for kind, dirs in (("temp", temp), ("root", (root,)), ("home", (home,))):
            for folder in dirs:
                for variant in _variants(folder) if folder is not None else ():
                    # "/" as the root or home would claim every path on the machine
                    if len(variant.parts) > 1:
                        found[variant] = kind  # home over root over temp for the same folder
        ordered = sorted(found.items(), key=lambda item: -len(item[0].parts))
        return cls(tuple(ordered))

    @classmethod
    def here(cls) -> PathStyle:
        """This process's: the project root of the current directory, ``$HOME`` and the
        temporary directories."""
        temp = (Path(tempfile.gettempdir()), *(Path(t) for t in TEMP_DIRS))
        return cls.of(project_root(), Path.home(), temp)

    def path(self, path: str | os.PathLike[str]) -> str:
        """One path as published; a relative path is left as it is."""
        text = os.fspath(path)
        if not text.startswith("/"):
            return text
        pure = PurePosixPath(posixpath.normpath(text))
        for anchor, kind in self.anchors:
            if pure.parts[: len(anchor.parts)] == anchor.parts:
                rest = pure.parts[len(anchor.parts) :]
                return _anchored(kind, rest, pure.name)
        if not pure.name or _ROUTE.fullmatch(pure.parts[1]):
            return text
        if any(pure.is_relative_to(d) for d in SYSTEM_DIRS):
            return text
        return f"{ELSEWHERE}/{pure.name}"

    def text(self, text: str) -> str:
        """``text`` with every absolute path in it as published."""
        return _ABSOLUTE.sub(self._token, text)

    def _token(self, match: re.Match[str]) -> str:
        token = match.group()
        trail = len(token) - len(token.rstrip("."))  # a full stop ends the sentence
        token, dots = token[: len(token) - trail], token[len(token) - trail :]
        escaped = set(_ESCAPE.findall(token))
        raw = _ESCAPE.sub(r"\1", token)
        # a lone "/word" is as likely prose ("per /s") as a path: only known folders move
        if raw.rstrip("/").count("/") == 1 and not self._is_anchor(raw):
            return match.group()
        shown = self.path(raw)
        if escaped:
            shown = re.sub(f"([{re.escape(''.join(sorted(escaped)))}])", r"\\\1", shown)
        return shown + dots

    def _is_anchor(self, token: str) -> bool:
        pure = PurePosixPath(token)
        return any(pure == anchor for anchor, _ in self.anchors)


def _anchored(kind: str, rest: tuple[str, ...], name: str) -> str:
    if kind == "root":
        return "/".join(rest) or "."
    if kind == "home":
        return "/".join(("~", *rest))
    return f"{TEMP}/{name}" if rest else TEMP
