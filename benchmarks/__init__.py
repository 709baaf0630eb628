"""The harness's own benchmarks: each writes its JSON (every point, the machine's
fingerprint, the command) and prints a Markdown summary (``publish``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def publish(doc: dict[str, Any], text: str, out: Path | None, md: Path | None) -> None:
    """``doc`` as JSON to ``out`` and the summary ``text`` to ``md``, where given; the
    summary printed."""
    if out:
        out.write_text(json.dumps(doc, indent=2, default=str))
    if md:
        md.write_text(text + "\n")
    print(text)
