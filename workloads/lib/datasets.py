"""Generative requests from the user's dataset files, and a default dataset made here.

``load_dataset`` reads a file into ``Entry`` objects (a conversation up to its last user
turn, with the reference reply where the file has one), ``select`` draws a seeded sample
of them, and ``to_requests`` turns them into ``GenerationRequest`` objects with an output
length policy (``OutputMode``). ``default_dataset`` makes a synthetic multi-turn chat
dataset from the seed, so a run needs no download. The file formats (``FORMATS``) and
how a row's turns are read: ``workloads.lib.dataset_rows``.

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

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from harness.api import GenerationRequest, ImageInput, Message
from workloads.lib import dataset_images
from workloads.lib.dataset_rows import (
    FORMATS,
    MISSING_FIELD,
    NO_USER_TURN,
    NOT_JSON,
    NOT_UTF8,
    UNKNOWN_ROLE,
    WRONG_TYPE,
    DatasetError,
    Rejected,
    detect_format,
    file_sha256,
    output_tokens,
    read_rows,
    reference_reply,
    split_turns,
    turns_of,
)

OutputMode = Literal["fixed", "reference", "natural"]
LengthUnit = Literal["tokens", "words"]
DEFAULT_NAME = "synthetic-chat"
"""The generated default dataset's name (a cell parameter of the dataset workload)."""
# Why an entry could not be used: the keys of Dataset.rejected (a row's reasons are
# dataset_rows's; these are the entry's).
NOT_OBJECT = "not an object"
EMPTY_TURN = "empty turn"
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


Measure = Callable[[str], int]


# -- turning a row into an entry ------------------------------------------------------------


def _entry(row: object, measure: Measure) -> Entry:
    if not isinstance(row, Mapping):
        raise Rejected(NOT_OBJECT)
    turns, plain = turns_of(row)
    history, reply = split_turns(turns)
    reference = reference_reply(row, reply)
    out_tokens = output_tokens(row)
    texts = [text for _, text in history] + ([] if reference is None else [reference])
    if any(not text.strip() for text in texts):
        raise Rejected(EMPTY_TURN)
    if out_tokens is None and reference is not None:
        out_tokens = measure(reference)
    entry = Entry(tuple(Message(r, c) for r, c in history), reference, out_tokens, plain)
    entry = dataclasses.replace(entry, images=dataset_images.images_of(row))
    return dataclasses.replace(entry, input_tokens=measure(entry.prompt_text))


def _words(text: str) -> int:
    return len(text.split())


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
    rows, data = read_rows(path, fmt)
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
        sha256=file_sha256(path, data),
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


def _verdict(row: object, measure: Measure, limit: int | None) -> Entry | Rejected:
    if isinstance(row, Rejected):  # rejected while reading: undecodable bytes, bad JSON
        return row
    try:
        entry = _entry(row, measure)
    except Rejected as rejection:
        return rejection
    if limit is not None and (entry.input_tokens or 0) > limit:
        return Rejected(TOO_LONG)
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
