"""A dataset file's rows, and the chat turns each row holds: what ``datasets.load_dataset``
makes its entries from.

Formats (``FORMATS``): ``sharegpt`` (a JSON list of ``{"conversations": [{"from",
"value"}, ...]}``; ``role``/``content`` keys and ``user``/``assistant`` roles are accepted
too), ``jsonl`` (one object a line with ``prompt`` text, ``messages`` or
``conversations``, optional ``output_tokens`` and reference ``output``/``completion``),
and ``json``/``csv``/``parquet`` with the same columns, read through the Hugging Face
``datasets`` library (the ``datasets`` extra; ``messages`` may be a JSON string in csv).

A row that cannot be used costs that row only: it is a ``Rejected`` with its reason
(undecodable bytes, a line that is not JSON, a missing or mistyped field, an unknown
role, no user turn), which ``datasets`` counts. A file that cannot be read at all is a
``DatasetError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.api import UsageError

FORMATS = ("sharegpt", "jsonl", "json", "csv", "parquet")
HF_FORMATS = ("json", "csv", "parquet")  # read through the Hugging Face datasets library
INSTALL_HINT = "pip install 'inference-harness[datasets]'"
# Why a row could not be used (keys of datasets.Dataset.rejected, with the entry's own).
NOT_JSON = "not valid JSON"
NOT_UTF8 = "not UTF-8"
MISSING_FIELD = "missing field"
WRONG_TYPE = "field of the wrong type"
UNKNOWN_ROLE = "unknown role"
NO_USER_TURN = "no user turn"

# Role names found in ShareGPT dumps and chat exports, mapped onto the chat API's.
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}
_PEEK_BYTES = 1 << 16


class DatasetError(UsageError):
    """A dataset file or a request for entries the user can fix; the message says how.

    ``harness.api`` exports no usage-error type, so this derives from ``ValueError``,
    which the harness reports as bad input.
    """


class Rejected(Exception):  # datasets counts it under its reason (datasets._verdict)
    """An entry that cannot be used, and why (one of ``datasets.REASONS``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


Turns = list[tuple[str, str]]  # (chat role, content)


# -- detecting the format -----------------------------------------------------------------


def detect_format(path: Path) -> str:
    """The format of ``path`` from its suffix and, for ``.json``, a peek at its start."""
    suffix = path.suffix.lower()
    by_suffix = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}
    if suffix in by_suffix:
        return by_suffix[suffix]
    if suffix == ".json":
        return _peek_json(path)
    raise DatasetError(
        f"cannot tell the format of {path} from its suffix {suffix!r}: name it .json, "
        f".jsonl, .csv or .parquet, or give the format (one of {', '.join(FORMATS)})"
    )


def _peek_json(path: Path) -> str:
    """sharegpt for a list of objects with "conversations", jsonl for an object a line."""
    try:
        with path.open("rb") as f:
            head = f.read(_PEEK_BYTES).decode("utf-8", "replace").lstrip("\ufeff \t\r\n")
    except OSError as exc:
        raise DatasetError(f"cannot read dataset file {path}: {exc.strerror or exc}") from exc
    if head.startswith("["):
        return "sharegpt" if _first_has_conversations(head) else "json"
    first_line = head.split("\n", 1)[0]
    with contextlib.suppress(ValueError):
        if isinstance(json.loads(first_line), dict):
            return "jsonl"  # a whole object on the first line: JSON lines
    return "json"


def _first_has_conversations(head: str) -> bool:
    start = len(head) - len(head[1:].lstrip()) if len(head) > 1 else 1
    try:
        first, _ = json.JSONDecoder().raw_decode(head, start)
    except ValueError:  # the first object runs past the peek: look for the key
        return '"conversations"' in head
    return isinstance(first, dict) and "conversations" in first


# -- reading rows ---------------------------------------------------------------------------


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read dataset file {path}: {exc.strerror or exc}") from exc


def _sharegpt_rows(path: Path, data: bytes) -> list[object]:
    # Undecodable bytes become lone surrogates, so one bad conversation costs itself only.
    text = data.decode("utf-8", "surrogateescape").lstrip("\ufeff")
    try:
        top = json.loads(text)
    except ValueError as exc:
        raise DatasetError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(top, list):
        raise DatasetError(f"{path}: a ShareGPT file is a JSON list of conversations")
    return [Rejected(NOT_UTF8) if _undecodable(row) else row for row in top]


def _undecodable(value: object) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_undecodable(k) or _undecodable(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_undecodable(v) for v in value)
    return False


def _jsonl_rows(data: bytes) -> list[object]:
    return [_jsonl_row(line) for line in data.split(b"\n") if line.strip()]


def _jsonl_row(line: bytes) -> object:
    # Each line decoded by itself, so a bad line costs that line only.
    try:
        text = line.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError:
        return Rejected(NOT_UTF8)
    try:
        return json.loads(text)
    except ValueError:
        return Rejected(NOT_JSON)


def _hf_rows(path: Path, fmt: str) -> list[object]:
    try:
        import datasets as hf  # noqa: PLC0415  (an optional extra, and slow to import)
    except ImportError as exc:
        raise DatasetError(
            f"reading {path} as {fmt} needs the Hugging Face datasets library: {INSTALL_HINT}"
        ) from exc
    bars = hf.is_progress_bar_enabled()
    hf.disable_progress_bars()
    # A throwaway cache: a benchmark must read the file as it is now, not a stale copy.
    try:
        with tempfile.TemporaryDirectory(prefix="harness-datasets-") as cache_dir:
            table = hf.load_dataset(
                fmt, data_files=str(path), split="train", cache_dir=cache_dir, keep_in_memory=True
            )
            return list(table.to_list())
    except Exception as exc:  # the library's errors name no common base
        raise DatasetError(f"the datasets library cannot read {path} as {fmt}: {exc}") from exc
    finally:
        if bars:
            hf.enable_progress_bars()


def read_rows(path: Path, fmt: str) -> tuple[list[object], bytes | None]:
    """The rows of ``path`` read as ``fmt``, and the file's bytes where they were read
    whole (not through the Hugging Face library), for its hash."""
    data = None if fmt in HF_FORMATS else _read(path)
    if data is None:
        return _hf_rows(path, fmt), None
    if fmt == "sharegpt":
        return _sharegpt_rows(path, data), data
    return _jsonl_rows(data), data


def file_sha256(path: Path, data: bytes | None) -> str:
    """The file's hash, from ``data`` when it was read whole already."""
    return hashlib.sha256(_read(path) if data is None else data).hexdigest()


# -- the turns of a row ---------------------------------------------------------------------


def _present(row: Mapping[str, Any], *keys: str) -> Any:
    """The first of ``keys`` with a value: csv and parquet hold a missing one as None."""
    for key in keys:
        value = row.get(key)
        if value is not None:
            return value
    return None


def turns_of(row: Mapping[str, Any]) -> tuple[Turns, bool]:
    """The row's turns, and whether it was a plain prompt."""
    conversation = _present(row, "conversations", "messages")
    if conversation is not None:
        return _turn_list(conversation), False
    prompt = _present(row, "prompt")
    if prompt is None:
        raise Rejected(MISSING_FIELD)
    if not isinstance(prompt, str):
        raise Rejected(WRONG_TYPE)
    return [("user", prompt)], True


def _turn_list(value: object) -> Turns:
    if isinstance(value, str):  # csv holds messages as a JSON string
        try:
            value = json.loads(value)
        except ValueError:
            raise Rejected(NOT_JSON) from None
    if not isinstance(value, list):
        raise Rejected(WRONG_TYPE)
    return [_turn(item) for item in value]


def _turn(item: object) -> tuple[str, str]:
    if not isinstance(item, Mapping):
        raise Rejected(WRONG_TYPE)
    role, content = _present(item, "from", "role"), _present(item, "value", "content")
    if role is None or content is None:
        raise Rejected(MISSING_FIELD)
    if not isinstance(role, str) or not isinstance(content, str):
        raise Rejected(WRONG_TYPE)
    if role.strip().lower() not in ROLES:
        raise Rejected(UNKNOWN_ROLE)
    return ROLES[role.strip().lower()], content


def split_turns(turns: Turns) -> tuple[Turns, str | None]:
    """History up to the last answered user turn, and its answer (module docstring)."""
    users = [i for i, (role, _) in enumerate(turns) if role == "user"]
    if not users:
        raise Rejected(NO_USER_TURN)
    answered = [i for i in users if i + 1 < len(turns) and turns[i + 1][0] == "assistant"]
    if answered:
        return turns[: answered[-1] + 1], turns[answered[-1] + 1][1]
    return turns[: users[-1] + 1], None


def output_tokens(row: Mapping[str, Any]) -> int | None:
    value = _present(row, "output_tokens")
    # csv columns with gaps come back as floats: 12.0 is 12
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise Rejected(WRONG_TYPE)


def reference_reply(row: Mapping[str, Any], reply: str | None) -> str | None:
    """The row's own ``output``/``completion`` field, else the conversation's reply."""
    field = _present(row, "output", "completion")
    if field is not None and not isinstance(field, str):
        raise Rejected(WRONG_TYPE)
    return reply if field is None else field
