"""Generative requests from the user's dataset files, and a default dataset made here.

``load_dataset`` reads a file into ``Entry`` objects (a conversation up to its last user
turn, with the reference reply where the file has one), ``select`` draws a seeded sample
of them, and ``to_requests`` turns them into ``GenerationRequest`` objects with an output
length policy (``OutputMode``). ``default_dataset`` makes a synthetic multi-turn chat
dataset from the seed, so a run needs no download.

Formats (``FORMATS``): ``sharegpt`` (a JSON list of ``{"conversations": [{"from",
"value"}, ...]}``; ``role``/``content`` keys and ``user``/``assistant`` roles are accepted
too), ``jsonl`` (one object a line with ``prompt`` text, ``messages`` or
``conversations``, optional ``output_tokens`` and reference ``output``/``completion``),
and ``json``/``csv``/``parquet`` with the same columns, read through the Hugging Face
``datasets`` library (the ``datasets`` extra; ``messages`` may be a JSON string in csv).

ShareGPT turns. vLLM's ShareGPT dataset (``vllm/benchmarks/datasets/sharegpt.py``) keeps
conversations of two turns or more, takes turn 0 as the prompt and turn 1 as the
completion whatever their roles and whatever follows, drops pairs with a prompt or a
completion under 4 tokens, a prompt over 1024 or both over 2048, and sends
``max_tokens`` = the completion's token count (``ignore_eos`` only with
``--ignore-eos``). Here a conversation keeps its history: its ``Entry`` is every turn up
to the LAST user turn that an assistant turn answers, and that answer is the reference
(a conversation no assistant turn answers keeps every turn up to its last user turn and
has no reference). So a multi-turn conversation costs the engine its whole prefill, as
a chat client resending the history does. Roles are checked (``unknown role``), and no
length bound is applied unless the caller gives one (``max_input_tokens``; ``select``'s
ranges).

Nothing is dropped silently: every entry that cannot be used is counted under its
reason in ``Dataset.rejected`` (``REASONS``), and a file with no usable entry is a
``DatasetError`` naming the file and the counts. Lengths are tokens when the caller
gives a tokenizer's ``count_tokens``, otherwise whitespace-separated words
(``Dataset.length_unit``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from harness.api import GenerationRequest, ImageInput, Message, UsageError
from workloads.lib import dataset_images

OutputMode = Literal["fixed", "reference", "natural"]
LengthUnit = Literal["tokens", "words"]
FORMATS = ("sharegpt", "jsonl", "json", "csv", "parquet")
DEFAULT_NAME = "synthetic-chat"
"""The generated default dataset's name (a cell parameter of the dataset workload)."""
HF_FORMATS = ("json", "csv", "parquet")  # read through the Hugging Face datasets library
INSTALL_HINT = "pip install 'inference-harness[datasets]'"

# Why an entry could not be used: the keys of Dataset.rejected.
NOT_JSON = "not valid JSON"
NOT_UTF8 = "not UTF-8"
NOT_OBJECT = "not an object"
MISSING_FIELD = "missing field"
WRONG_TYPE = "field of the wrong type"
EMPTY_TURN = "empty turn"
UNKNOWN_ROLE = "unknown role"
NO_USER_TURN = "no user turn"
TOO_LONG = "longer than the model's context"
REASONS = (
    NOT_JSON,
    NOT_UTF8,
    NOT_OBJECT,
    MISSING_FIELD,
    WRONG_TYPE,
    EMPTY_TURN,
    UNKNOWN_ROLE,
    NO_USER_TURN,
    TOO_LONG,
)
# Why select() left an entry out: the keys of Selection.excluded.
INPUT_OUT_OF_RANGE = "input length out of range"
OUTPUT_OUT_OF_RANGE = "reference output length out of range"
NO_REFERENCE = "no reference output length"

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


@dataclass(frozen=True)
class Entry:
    """One usable dataset entry: what is sent, and what the dataset says comes back."""

    messages: tuple[Message, ...]  # up to and including the last user turn
    reference_output: str | None  # the reference reply, when the file has one
    reference_output_tokens: int | None  # its length in the dataset's length_unit
    plain: bool  # a plain prompt in the file: sent as text unless chat is forced
    input_tokens: int | None = None  # prompt_text's length in the dataset's length_unit
    images: tuple[ImageInput, ...] = ()  # sent with the last user turn (dataset_images)

    @property
    def prompt_text(self) -> str:
        """The messages as one text, for completions APIs and text requests."""
        if len(self.messages) == 1 and self.messages[0].role == "user":
            return self.messages[0].content
        turns = "\n\n".join(f"{m.role.capitalize()}: {m.content}" for m in self.messages)
        return f"{turns}\n\nAssistant:"  # the cue a completions model continues from


@dataclass(frozen=True)
class Dataset:
    """The usable entries of one dataset, and what was read to get them."""

    name: str
    path: Path | None
    sha256: str | None
    format: str
    entries: tuple[Entry, ...]
    total: int  # entries read, before rejection
    rejected: dict[str, int]  # reason -> count
    length_unit: LengthUnit
    max_input_tokens: int | None = None  # the context bound checked; None: not checked

    def to_json(self, used: int) -> dict[str, Any]:
        """What the cell record says of the dataset; ``used``: entries the cell sent."""
        checked = self.max_input_tokens is not None
        return {
            "name": self.name,
            "path": None if self.path is None else str(self.path),
            "sha256": self.sha256,
            "format": self.format,
            "total": self.total,
            "usable": len(self.entries),
            "used": used,
            "rejected": dict(sorted(self.rejected.items())),
            "length_unit": self.length_unit,
            "context_checked": checked,
            "max_input_tokens": self.max_input_tokens,
            "context_check": (
                f"prompts over {self.max_input_tokens} tokens rejected"
                if checked
                else "not checked: needs count_tokens and max_input_tokens"
            ),
        }


class Selection(list[Entry]):
    """The entries ``select`` drew, with what its filters left out, for the record."""

    def __init__(self, entries: Iterable[Entry], eligible: int, excluded: dict[str, int]) -> None:
        super().__init__(entries)
        self.eligible = eligible  # entries that passed the filters
        self.excluded = excluded  # reason -> entries the filters left out

    def to_json(self) -> dict[str, Any]:
        return {"selected": len(self), "eligible": self.eligible, "excluded": self.excluded}


class _Rejected(Exception):  # caught in _verdict: never leaves this module
    """An entry that cannot be used, and why (one of ``REASONS``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


Turns = list[tuple[str, str]]  # (chat role, content)
Measure = Callable[[str], int]


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
    return [_Rejected(NOT_UTF8) if _undecodable(row) else row for row in top]


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
        return _Rejected(NOT_UTF8)
    try:
        return json.loads(text)
    except ValueError:
        return _Rejected(NOT_JSON)


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


# -- turning a row into an entry ------------------------------------------------------------


def _present(row: Mapping[str, Any], *keys: str) -> Any:
    """The first of ``keys`` with a value: csv and parquet hold a missing one as None."""
    for key in keys:
        value = row.get(key)
        if value is not None:
            return value
    return None


def _turns_of(row: Mapping[str, Any]) -> tuple[Turns, bool]:
    """The row's turns, and whether it was a plain prompt."""
    conversation = _present(row, "conversations", "messages")
    if conversation is not None:
        return _turn_list(conversation), False
    prompt = _present(row, "prompt")
    if prompt is None:
        raise _Rejected(MISSING_FIELD)
    if not isinstance(prompt, str):
        raise _Rejected(WRONG_TYPE)
    return [("user", prompt)], True


def _turn_list(value: object) -> Turns:
    if isinstance(value, str):  # csv holds messages as a JSON string
        try:
            value = json.loads(value)
        except ValueError:
            raise _Rejected(NOT_JSON) from None
    if not isinstance(value, list):
        raise _Rejected(WRONG_TYPE)
    return [_turn(item) for item in value]


def _turn(item: object) -> tuple[str, str]:
    if not isinstance(item, Mapping):
        raise _Rejected(WRONG_TYPE)
    role, content = _present(item, "from", "role"), _present(item, "value", "content")
    if role is None or content is None:
        raise _Rejected(MISSING_FIELD)
    if not isinstance(role, str) or not isinstance(content, str):
        raise _Rejected(WRONG_TYPE)
    if role.strip().lower() not in ROLES:
        raise _Rejected(UNKNOWN_ROLE)
    return ROLES[role.strip().lower()], content


def _split(turns: Turns) -> tuple[Turns, str | None]:
    """History up to the last answered user turn, and its answer (module docstring)."""
    users = [i for i, (role, _) in enumerate(turns) if role == "user"]
    if not users:
        raise _Rejected(NO_USER_TURN)
    answered = [i for i in users if i + 1 < len(turns) and turns[i + 1][0] == "assistant"]
    if answered:
        return turns[: answered[-1] + 1], turns[answered[-1] + 1][1]
    return turns[: users[-1] + 1], None


def _output_tokens(row: Mapping[str, Any]) -> int | None:
    value = _present(row, "output_tokens")
    # csv columns with gaps come back as floats: 12.0 is 12
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise _Rejected(WRONG_TYPE)


def _reference(row: Mapping[str, Any], reply: str | None) -> str | None:
    """The row's own ``output``/``completion`` field, else the conversation's reply."""
    field = _present(row, "output", "completion")
    if field is not None and not isinstance(field, str):
        raise _Rejected(WRONG_TYPE)
    return reply if field is None else field


def _entry(row: object, measure: Measure) -> Entry:
    if not isinstance(row, Mapping):
        raise _Rejected(NOT_OBJECT)
    turns, plain = _turns_of(row)
    history, reply = _split(turns)
    reference = _reference(row, reply)
    out_tokens = _output_tokens(row)
    texts = [text for _, text in history] + ([] if reference is None else [reference])
    if any(not text.strip() for text in texts):
        raise _Rejected(EMPTY_TURN)
    if out_tokens is None and reference is not None:
        out_tokens = measure(reference)
    entry = Entry(tuple(Message(r, c) for r, c in history), reference, out_tokens, plain)
    entry = dataclasses.replace(entry, images=dataset_images.images_of(row))
    return dataclasses.replace(entry, input_tokens=measure(entry.prompt_text))


def _words(text: str) -> int:
    return len(text.split())


def _sha256(path: Path, data: bytes | None) -> str:
    return hashlib.sha256(_read(path) if data is None else data).hexdigest()


def _counts(rejected: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in sorted(rejected.items())) or "none"


def load_dataset(
    path: Path,
    fmt: str | None = None,
    *,
    count_tokens: Callable[[str], int] | None = None,
    max_input_tokens: int | None = None,
) -> Dataset:
    """Every usable entry of ``path``, with every unusable one counted under its reason.

    With ``count_tokens`` (a tokenizer's, e.g. ``lambda s: len(tok.encode(s))``) lengths
    are tokens, and with ``max_input_tokens`` too a prompt longer than that is rejected;
    without it lengths are words and the context is not checked.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset file {path} does not exist or is not a file")
    if max_input_tokens is not None and max_input_tokens < 1:
        raise DatasetError(f"max_input_tokens must be >= 1, not {max_input_tokens}")
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise DatasetError(f"unknown dataset format {fmt!r} for {path}: one of {FORMATS}")
    data = None if fmt in HF_FORMATS else _read(path)
    if data is None:
        rows = _hf_rows(path, fmt)
    elif fmt == "sharegpt":
        rows = _sharegpt_rows(path, data)
    else:
        rows = _jsonl_rows(data)
    rows = dataset_images.extract(rows, path, fmt)  # image references: read and checked
    limit = max_input_tokens if count_tokens is not None else None
    entries, rejected = _collect(rows, count_tokens or _words, limit)
    if not entries:
        raise DatasetError(
            f"{path} ({fmt}) has no usable entry: {len(rows)} read, rejected: {_counts(rejected)}"
        )
    return Dataset(
        name=path.name,
        path=path,
        sha256=_sha256(path, data),
        format=fmt,
        entries=tuple(entries),
        total=len(rows),
        rejected=dict(rejected),
        length_unit="words" if count_tokens is None else "tokens",
        max_input_tokens=limit,
    )


def _collect(
    rows: Iterable[object], measure: Measure, limit: int | None
) -> tuple[list[Entry], Counter[str]]:
    entries: list[Entry] = []
    rejected: Counter[str] = Counter()
    for row in rows:
        verdict = _verdict(row, measure, limit)
        if isinstance(verdict, Entry):
            entries.append(verdict)
        else:
            rejected[verdict.reason] += 1
    return entries, rejected


def _verdict(row: object, measure: Measure, limit: int | None) -> Entry | _Rejected:
    if isinstance(row, _Rejected):  # rejected while reading: undecodable bytes, bad JSON
        return row
    try:
        entry = _entry(row, measure)
    except _Rejected as rejection:
        return rejection
    if limit is not None and (entry.input_tokens or 0) > limit:
        return _Rejected(TOO_LONG)
    return entry


# -- the default dataset --------------------------------------------------------------------


@dataclass(frozen=True)
class _Spread:
    """A log-normal length in words: most turns short, a long tail, clipped."""

    median: float
    sigma: float
    low: int
    high: int

    def draw(self, rng: np.random.Generator) -> int:
        words = round(rng.lognormal(math.log(self.median), self.sigma))
        return int(min(max(words, self.low), self.high))


# Chat-like proportions: user turns a median 40 words with a tail to a few hundred,
# replies a median 30 with a tail to ~200; a system prompt in 30 % of conversations.
USER_TURN = _Spread(median=40, sigma=0.9, low=2, high=500)
REPLY = _Spread(median=30, sigma=0.8, low=2, high=240)
SYSTEM_PROMPT = _Spread(median=25, sigma=0.5, low=5, high=120)
SYSTEM_SHARE = 0.3
USER_TURNS = (1, 2, 3, 4)
USER_TURN_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
_VOCABULARY_SEED = 20_240_601  # the words are the same whatever the run's seed


@cache
def _vocabulary() -> tuple[tuple[str, ...], npt.NDArray[np.float64]]:
    """Pseudo-words from syllables, shortest most frequent (a Zipf-Mandelbrot law)."""
    rng = np.random.default_rng(_VOCABULARY_SEED)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    drawn = {"".join(rng.choice(syllables, size=rng.integers(1, 4))) for _ in range(3000)}
    words = tuple(sorted(drawn, key=lambda w: (len(w), w)))
    weights = 1.0 / (np.arange(len(words)) + 2.7)
    return words, weights / weights.sum()


def synthetic_text(rng: np.random.Generator, n_words: int) -> str:
    """``n_words`` of the generated conversations' pseudo-words, in sentences."""
    return _text(rng, n_words)


def _text(rng: np.random.Generator, n_words: int) -> str:
    """``n_words`` words in sentences of 4 to 15, so the text splits into exactly that."""
    words, p = _vocabulary()
    picks = [words[i] for i in rng.choice(len(words), size=n_words, p=p)]
    sentences = []
    while picks:
        size = int(rng.integers(4, 16))
        sentences.append(" ".join(picks[:size]).capitalize() + ".")
        picks = picks[size:]
    return " ".join(sentences)


def _conversation(rng: np.random.Generator) -> Entry:
    messages = []
    if rng.random() < SYSTEM_SHARE:
        messages.append(Message("system", _text(rng, SYSTEM_PROMPT.draw(rng))))
    for turn in range(int(rng.choice(USER_TURNS, p=USER_TURN_WEIGHTS))):
        if turn:
            messages.append(Message("assistant", _text(rng, REPLY.draw(rng))))
        messages.append(Message("user", _text(rng, USER_TURN.draw(rng))))
    length = REPLY.draw(rng)
    entry = Entry(tuple(messages), _text(rng, length), length, plain=False)
    return dataclasses.replace(entry, input_tokens=_words(entry.prompt_text))


def default_dataset(seed: int, n: int = 512) -> Dataset:
    """``n`` synthetic multi-turn chat conversations, the same for the same seed.

    Made here from a fixed pseudo-word vocabulary (nothing downloaded); lengths are
    words, the reference reply's included.
    """
    if n < 1:
        raise DatasetError(f"the synthetic dataset needs n >= 1 conversations, not {n}")
    rng = np.random.default_rng(seed)
    entries = tuple(_conversation(rng) for _ in range(n))
    return Dataset(
        name=DEFAULT_NAME,
        path=None,
        sha256=None,
        format="synthetic",
        entries=entries,
        total=n,
        rejected={},
        length_unit="words",
    )


# -- drawing entries and making requests ----------------------------------------------------


def _check_range(name: str, bounds: tuple[int, int] | None) -> None:
    if bounds is not None and not 0 <= bounds[0] <= bounds[1]:
        raise DatasetError(f"{name} {bounds} is not a range: give (low, high), 0 <= low <= high")


def _screen(
    entry: Entry, input_range: tuple[int, int] | None, output_range: tuple[int, int] | None
) -> str | None:
    """Why the filters leave ``entry`` out, None if they keep it (bounds inclusive)."""
    if input_range is not None:
        length = entry.input_tokens
        length = _words(entry.prompt_text) if length is None else length
        if not input_range[0] <= length <= input_range[1]:
            return INPUT_OUT_OF_RANGE
    if output_range is None:
        return None
    if entry.reference_output_tokens is None:
        return NO_REFERENCE
    inside = output_range[0] <= entry.reference_output_tokens <= output_range[1]
    return None if inside else OUTPUT_OUT_OF_RANGE


def select(
    dataset: Dataset,
    n: int,
    seed: int,
    *,
    replace: bool = False,
    input_range: tuple[int, int] | None = None,
    output_range: tuple[int, int] | None = None,
) -> Selection:
    """``n`` entries drawn with ``seed`` among those the length filters keep.

    Ranges are inclusive, in the dataset's ``length_unit``; the input's is
    ``prompt_text``'s. Without ``replace`` each entry is drawn at most once, and asking
    for more than there are is a ``DatasetError``. The result is a list that also says
    what the filters left out (``Selection.excluded``), for the record.
    """
    _check_range("input_range", input_range)
    _check_range("output_range", output_range)
    if n < 0:
        raise DatasetError(f"cannot select {n} entries")
    kept: list[Entry] = []
    excluded: Counter[str] = Counter()
    for entry in dataset.entries:
        reason = _screen(entry, input_range, output_range)
        if reason is None:
            kept.append(entry)
        else:
            excluded[reason] += 1
    _check_enough(dataset, n, len(kept), replace, excluded)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(kept), size=n) if replace else rng.permutation(len(kept))[:n]
    return Selection((kept[int(i)] for i in picks), len(kept), dict(sorted(excluded.items())))


def _check_enough(
    dataset: Dataset, n: int, kept: int, replace: bool, excluded: Mapping[str, int]
) -> None:
    if (kept >= n or replace) and (kept > 0 or n == 0):
        return
    filtered = f" after the length filters left out {_counts(excluded)}" if excluded else ""
    hint = "" if replace else "; ask for fewer, or sample with replacement"
    raise DatasetError(
        f"asked for {n} entries of {dataset.name}, which has {kept} usable{filtered}{hint}"
    )


def _budget(entry: Entry, mode: OutputMode, fixed_output: int, cap: int) -> tuple[int, bool]:
    """(max_tokens, ignore_eos) for ``entry`` under ``mode``."""
    if mode == "fixed":
        return fixed_output, True
    if mode == "reference":  # exactly the reference's length, as vLLM's max_tokens asks
        reference = entry.reference_output_tokens
        return (fixed_output if reference is None else max(reference, 1)), True
    return cap, False  # natural: the model ends the reply, the cap bounds it


def without_reference(entries: Iterable[Entry]) -> int:
    """How many of ``entries`` have no reference length: "reference" mode asks
    ``fixed_output`` tokens of each (say so in the record)."""
    return sum(entry.reference_output_tokens is None for entry in entries)


def to_requests(
    entries: Sequence[Entry],
    mode: OutputMode,
    *,
    seed: int,
    fixed_output: int = 32,
    cap: int = 128,
    chat: bool | None = None,
    id_prefix: str = "d",
) -> list[GenerationRequest]:
    """A request per entry, in order, with ids ``f"{id_prefix}{seed}-{i}"``.

    ``mode``: "fixed" asks exactly ``fixed_output`` tokens of each; "reference" exactly
    the entry's reference length (``fixed_output`` when it has none: see
    ``without_reference``; a words-counted dataset's lengths are words); "natural" lets
    the model end its reply, capped at ``cap``. ``chat=None`` sends an entry as a chat
    conversation unless it was a plain prompt (then as text); True or False forces it.
    """
    if mode not in get_args(OutputMode):
        raise DatasetError(f"unknown output mode {mode!r}: one of {get_args(OutputMode)}")
    if fixed_output < 1 or cap < 1:
        raise DatasetError(f"fixed_output ({fixed_output}) and cap ({cap}) must be >= 1")
    requests = []
    for i, entry in enumerate(entries):
        max_tokens, ignore_eos = _budget(entry, mode, fixed_output, cap)
        as_chat = not entry.plain or bool(entry.images) if chat is None else chat
        requests.append(
            GenerationRequest(
                prompt="" if as_chat else entry.prompt_text,
                max_tokens=max_tokens,
                ignore_eos=ignore_eos,
                request_id=f"{id_prefix}{seed}-{i}",
                messages=entry.messages if as_chat else (),
                images=entry.images,
            )
        )
    return requests
