"""Keep secrets out of everything the harness writes or prints: records, manifests, logs,
matrices, reports and the terminal.

A secret is
* the value of an environment variable whose name says it holds one (API keys, tokens,
  passwords);
* a value the user passed in an option: an engine option whose name says it is one
  (``openai.api_key=...``), and the password and credential-like query parameters of
  any URL given as an option value (``remember_options``);
* anything that looks like one in text an engine produced: the user information of a URL
  (``http://user:pass@host``), a credential query parameter (``?api_key=...``), a bearer
  token or a ``key=value`` credential in a logged header.

Identifiers (run and cell ids, node ids, cell parameters) are never rewritten: masking
one would turn a record into a file that no longer names its own cell.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

MASK = "[REDACTED]"
SECRET_WORDS = frozenset(
    {"secret", "password", "passwd", "credential", "credentials", "auth", "authorization"}
    | {"cookie", "apikey"}
)
"""A name with one of these words anywhere holds a secret (``AWS_SECRET_ACCESS_KEY``)."""
SECRET_ENDINGS = frozenset({"key", "token", "pat"})
"""A name ending in one of these words holds a secret (``HF_TOKEN``, ``api_key``); not one
where the word is only part of it (``token_time_s``, ``max_num_batched_tokens``): their
values are measurements, and masking them rewrote every equal number in the results.
(Not ``pwd``: ``PWD`` is the shell's working directory, which every path would lose.)"""


def is_secret_name(name: str) -> bool:
    """Whether a variable or option called ``name`` holds a secret, by its words."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    return bool(words) and (words[-1] in SECRET_ENDINGS or not SECRET_WORDS.isdisjoint(words))


MIN_SECRET_LEN = 6  # shorter values ("1", "true") are flags, and masking them garbles text
_INLINE = re.compile(
    r"(?i)((?:bearer|basic)\s+"
    r"|(?:api[_-]?key|token|secret|password|authorization)[\"']?\s*[=:]\s*[\"']?"
    r"(?:(?:bearer|basic)\s+)?)"
    r"([^\s\"'&,;]{4,})"
)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@\"'<>]+@")
"""``scheme://user:password@`` (or a bare token as the user): all of it is masked."""
_QUERY_CREDENTIAL = re.compile(
    r"(?i)([?&;](?:api[_-]?key|apikey|key|token|access[_-]?token|auth|secret|client[_-]?secret"
    r"|password|passwd|pwd|sig|signature|x-amz-signature|code)=)([^&#\s\"'<>]+)"
)
"""A credential in a URL's query, masked whatever its length (``?api_key=Q`` too)."""
KEEP = frozenset({"run_id", "cell_id", "nodeid", "workload", "engine", "params", "statuses"})
"""Fields of results files that identify a cell: left as they are (see the module doc)."""

_remembered: set[str] = set()


def remember(values: Iterable[str]) -> None:
    """Treat ``values`` as secrets from now on, in this process (never shorter ones than
    ``MIN_SECRET_LEN``: masking every "1" would garble numbers)."""
    _remembered.update(v for v in values if len(v) >= MIN_SECRET_LEN)


def secrets_in_value(name: str, value: str) -> list[str]:
    """The secrets inside one option value: all of it when its name says it is one, the
    password and credential query values of a URL."""
    found = [value] if is_secret_name(name) else []
    try:
        parts = urlsplit(value)
    except ValueError:
        return found
    if parts.password:
        found += [parts.password, unquote(parts.password)]
    if parts.username and parts.password is None:
        found.append(parts.username)  # often a bare token given as the user (https://T@host)
    for key, val in parse_qsl(parts.query, keep_blank_values=False):
        if _QUERY_CREDENTIAL.match(f"?{key}=x"):
            found.append(val)
    return found


def remember_options(options: Mapping[str, Mapping[str, str]]) -> None:
    """Remember the secrets in engine options (``{engine: {key: value}}``)."""
    remember(
        s for opts in options.values() for k, v in opts.items() for s in secrets_in_value(k, v)
    )


def secrets_in(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Values of secret-named variables and remembered secrets, longest first (a prefix
    must not hide a longer one)."""
    found = {
        value
        for name, value in environ.items()
        if is_secret_name(name) and len(value) >= MIN_SECRET_LEN
    }
    found |= _remembered
    return tuple(sorted(found, key=len, reverse=True))


def known_secrets() -> tuple[str, ...]:
    return secrets_in(os.environ)


def redact_text(text: str, secrets: tuple[str, ...] | None = None) -> str:
    for value in known_secrets() if secrets is None else secrets:
        text = text.replace(value, MASK)
    text = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
    text = _QUERY_CREDENTIAL.sub(lambda m: m.group(1) + MASK, text)
    return _INLINE.sub(lambda m: m.group(1) + MASK, text)


def redact(data: Any, secrets: tuple[str, ...] | None = None) -> Any:
    """Every string in a JSON-like structure (keys too), redacted; the identifying fields
    of ``KEEP`` are kept as they are."""
    found = known_secrets() if secrets is None else secrets
    if isinstance(data, str):
        return redact_text(data, found)
    if isinstance(data, dict):
        return {redact(k, found): v if k in KEEP else redact(v, found) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [redact(v, found) for v in data]
    return data
