"""Keep secrets out of everything the harness writes: records, manifests, logs, matrices.

A secret is the value of an environment variable whose name says it holds one (API keys,
tokens, passwords), plus anything that looks like a bearer token or a ``key=value``
credential in text an engine produced (a URL with ``api_key=``, a logged header).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

MASK = "[REDACTED]"
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE", re.IGNORECASE)
MIN_SECRET_LEN = 6  # shorter values ("1", "true") are flags, and masking them garbles text
_INLINE = re.compile(
    r"(?i)((?:bearer|basic)\s+"
    r"|(?:api[_-]?key|token|secret|password|authorization)[\"']?\s*[=:]\s*[\"']?"
    r"(?:(?:bearer|basic)\s+)?)"
    r"([^\s\"'&,;]{4,})"
)


def secrets_in(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Values of secret-named variables, longest first (a prefix must not hide a longer one)."""
    found = {
        value
        for name, value in environ.items()
        if SECRET_NAME.search(name) and len(value) >= MIN_SECRET_LEN
    }
    return tuple(sorted(found, key=len, reverse=True))


def redact_text(text: str, secrets: tuple[str, ...] | None = None) -> str:
    for value in secrets_in(os.environ) if secrets is None else secrets:
        text = text.replace(value, MASK)
    return _INLINE.sub(lambda m: m.group(1) + MASK, text)


def redact(data: Any, secrets: tuple[str, ...] | None = None) -> Any:
    """Every string in a JSON-like structure (keys too), redacted."""
    found = secrets_in(os.environ) if secrets is None else secrets
    if isinstance(data, str):
        return redact_text(data, found)
    if isinstance(data, dict):
        return {redact(k, found): redact(v, found) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [redact(v, found) for v in data]
    return data
