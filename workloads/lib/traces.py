"""Timestamped request traces from production LLM services, replayed open loop.

A trace gives, per request, its arrival time and its input and output token counts (and,
for Mooncake, the ids of its prefix blocks). ``load_trace`` reads one file into a
``Trace``: requests sorted by arrival (a stable sort: the files need not be sorted, and
requests with equal times keep their file order), times re-based so the first request is
at 0, and every row that cannot be used counted under its reason in ``rejected``, never
dropped silently. ``replay`` turns a trace into an open-loop schedule like
``OpenLoop.schedule``'s: offsets in seconds from the window start, the first at 0, sent
at exactly those times (no jitter); a window of trace time, a speed-up or a target mean
rate, and a request limit are applied in that order and recorded in ``Replay.scaling``.
``synthesize_prompts`` makes token-id prompts of the traced lengths; Mooncake's hash ids
become shared token blocks, so requests that shared a prefix in production share it here.

Formats (``detect_format`` looks at the first non-blank line: a JSON object is Mooncake; a
CSV header is Azure or BurstGPT by its column names, which differ in case; the file
suffix is not used):

* ``mooncake``: JSON lines with ``timestamp`` (milliseconds since the first request),
  ``input_length``, ``output_length`` and ``hash_ids`` (remapped prefix-block hashes,
  ``MOONCAKE_BLOCK`` = 512 tokens each; the last block of a request is partial). Read:
  github.com/kvcache-ai/Mooncake at 3b5a5941, ``FAST25-release/README.md`` ("Trace
  Format": units, and "The block size is 512 tokens"), and its
  ``traces/conversation_trace.jsonl`` (12,031 rows) and ``traces/synthetic_trace.jsonl``
  (3,993 rows): in every row ``len(hash_ids) == ceil(input_length / 512)``, timestamps are
  integers, non-decreasing. ``hash_ids`` may be absent here (no prefix information).
* ``azure``: the Azure LLM inference traces, CSV ``TIMESTAMP,ContextTokens,
  GeneratedTokens``. Read: github.com/Azure/AzurePublicDataset at b469a113,
  ``AzureLLMInferenceDataset2023.md`` and ``...2024.md`` (schema),
  ``data/AzureLLMInferenceTrace_{code,conv}.csv`` (2023: "2023-11-16 18:15:46.6805900",
  7 fractional digits in all 28,185 rows, no zone) and
  ``analysis/AzureLLMInferenceDataset2024.ipynb`` (2024: "2024-05-12 00:00:00.001163+00:00"
  and, without a fraction, "2024-05-12 00:00:00+00:00"). ``TIMESTAMP`` is parsed by hand,
  not by ``datetime.strptime`` (whose ``%f`` takes at most 6 digits): date and time with
  ``" "`` or ``"T"``, an optional fraction of 1 to 9 digits kept exactly (integer
  nanoseconds), an optional zone (``Z``, ``+HH:MM``, ``+HHMM``); a time without a zone
  is UTC, so no daylight-saving jump can enter the gaps.
* ``burstgpt``: CSV ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log
  Type`` (newer releases add ``Session ID`` and ``Elapsed time``; only ``Timestamp``
  (seconds), ``Request tokens`` and ``Response tokens`` are read). Read:
  github.com/HPMLL/BurstGPT at e92f533b, ``README.md`` ("Schema"; "Data": the files with
  failures have ``Response tokens`` 0, the ``*_without_fails_*`` files leave them out) and
  ``example/profile_server/server.py`` (replays ``Timestamp`` divided by a scale). Its
  ``data/BurstGPT_1.csv`` was not in the snapshot; the column order agrees with vLLM's
  positional reading below. Rows of every model and log type are kept.

Rejected rows (reasons are ``"not UTF-8"``, ``"bad JSON"``, ``"bad CSV"``, ``"too many
columns"``, ``"missing C"``, ``"non-numeric C"``, ``"non-integer C"``, ``"bad datetime C"``,
``"negative C"``, ``"zero C"``, ``"bad hash_ids"``, with C the file's column name): token
counts must be whole numbers >= 1, so a request that asks for no output is rejected in
every format; in BurstGPT those are its failed requests, counted as ``"zero Response
tokens (failed request)"`` (vLLM drops them too), so a replay of a file with failures
leaves their arrivals out, and ``rejected`` says how many. Blank lines are not rows. A
file with no usable request, an unreadable file, or an unknown format is a
``TraceError``. The whole file is read in memory: slice very large traces before.

How peers replay, for comparison: vLLM (github.com/vllm-project/vllm,
``vllm/benchmarks/serve.py`` at 009e6d4a, ``get_request``) sends a self-timed request
at its start plus the request's ``timestamp``; its random arrivals are rescaled so the
last falls at ``count / rate``; its ``vllm/benchmarks/datasets/burstgpt.py`` (at
237145ea) keeps GPT-4 rows with ``Response tokens > 0`` and ignores ``Timestamp``. Here
a rate means one over the mean gap, ``(count - 1) / span``, the rate of an ``OpenLoop``
with the same mean gap, and latency counts from the scheduled offsets like every
open-loop schedule of the harness.

``harness.api`` exports no usage-error type, so errors are ``TraceError(ValueError)``.
"""

from __future__ import annotations

import calendar
import codecs
import csv
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.api import UsageError

FORMATS = ("mooncake", "azure", "burstgpt")
MOONCAKE_BLOCK = 512  # tokens per hash id: Mooncake FAST25-release/README.md, "Trace Format"

IdArray = npt.NDArray[np.int64]


class TraceError(UsageError):
    """A trace that cannot be used or replay options that cannot hold; says which and why."""


@dataclass(frozen=True)
class TraceRequest:
    t_s: float  # arrival, seconds from the trace's first request
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Trace:
    format: str
    path: Path
    sha256: str  # of the file's bytes
    requests: tuple[TraceRequest, ...]  # sorted by t_s, first at 0
    rejected: dict[str, int]  # reason -> count of malformed rows
    block_size: int | None  # tokens per hash id (None: the trace has none)

    def to_json(self) -> dict[str, Any]:
        """What a record keeps of the trace: its identity and a summary, not every request
        (the sha256 pins the file's bytes)."""
        span = self.requests[-1].t_s
        return {
            "format": self.format,
            "path": str(self.path),
            "sha256": self.sha256,
            "requests": len(self.requests),
            "rejected": dict(sorted(self.rejected.items())),
            "block_size": self.block_size,
            "span_s": span,
            "mean_rate": _mean_rate(len(self.requests), span),
            "input_tokens": sum(r.input_tokens for r in self.requests),
            "output_tokens": sum(r.output_tokens for r in self.requests),
            "distinct_hash_ids": len({h for r in self.requests for h in r.hash_ids}),
        }


@dataclass(frozen=True)
class Replay:
    offsets: npt.NDArray[np.float64]  # send times, seconds from the window start, sorted
    requests: tuple[TraceRequest, ...]  # the requests in that order
    scaling: dict[str, Any]  # slice, speed or rate, factor, count, span_s, mean_rate


# -- reading ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    time: str
    input: str
    output: str
    unit: int  # raw time units per second
    failed: str = ""  # what a zero output count means in this trace


_SPECS = {
    "mooncake": _Spec("timestamp", "input_length", "output_length", 1000),
    "azure": _Spec("TIMESTAMP", "ContextTokens", "GeneratedTokens", 10**9),
    "burstgpt": _Spec("Timestamp", "Request tokens", "Response tokens", 1, " (failed request)"),
}
_DATETIME = re.compile(
    r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?\s*(Z|[+-]\d{2}:?\d{2})?"
)


class _Reject(Exception):
    """A row that cannot be used, and why; never leaves this module."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class _Row:
    raw_t: int | float  # in the format's time unit
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


def _decode(line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        raise _Reject("not UTF-8") from None


def _number(value: object, name: str) -> int | float:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise _Reject(f"missing {name}")
    num: int | float
    if isinstance(value, int | float) and not isinstance(value, bool):
        num = value
    elif isinstance(value, str):
        try:
            num = int(value)
        except ValueError:
            num = _float(value, name)
    else:
        raise _Reject(f"non-numeric {name}")
    if not math.isfinite(num):
        raise _Reject(f"non-numeric {name}")
    return num


def _float(text: str, name: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise _Reject(f"non-numeric {name}") from None


def _tokens(value: object, name: str, failed: str = "") -> int:
    num = _number(value, name)
    if num != int(num):
        raise _Reject(f"non-integer {name}")
    if num < 0:
        raise _Reject(f"negative {name}")
    if num == 0:
        raise _Reject(f"zero {name}{failed}")
    return int(num)


def _datetime_ns(value: object, name: str) -> int:
    """Nanoseconds since the epoch, exact to the text's digits; no zone means UTC."""
    text = value.strip() if isinstance(value, str) else ""
    if not text:
        raise _Reject(f"missing {name}")
    match = _DATETIME.fullmatch(text)
    if match is None:
        raise _Reject(f"bad datetime {name}")
    date, clock, fraction, zone = match.groups()
    zone = "+00:00" if zone in (None, "Z") else zone
    try:
        moment = datetime.fromisoformat(f"{date}T{clock}{zone}")
    except ValueError:
        raise _Reject(f"bad datetime {name}") from None
    seconds = calendar.timegm(moment.utctimetuple())
    return seconds * 10**9 + int((fraction or "").ljust(9, "0"))


def _hash_ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in value
    ):
        raise _Reject("bad hash_ids")
    return tuple(value)


def _fields_row(fields: Mapping[str, object], fmt: str) -> _Row:
    spec = _SPECS[fmt]
    when = _datetime_ns if fmt == "azure" else _number
    return _Row(
        raw_t=when(fields.get(spec.time), spec.time),
        input_tokens=_tokens(fields.get(spec.input), spec.input),
        output_tokens=_tokens(fields.get(spec.output), spec.output, spec.failed),
        hash_ids=_hash_ids(fields.get("hash_ids")) if fmt == "mooncake" else (),
    )


def _mooncake_row(line: bytes) -> _Row:
    try:
        obj = json.loads(_decode(line))
    except json.JSONDecodeError:
        raise _Reject("bad JSON") from None
    if not isinstance(obj, dict):
        raise _Reject("bad JSON")
    return _fields_row(obj, "mooncake")


def _csv_cells(text: str) -> list[str]:
    try:
        return next(csv.reader([text]), [])
    except csv.Error:
        raise _Reject("bad CSV") from None


def _csv_row(line: bytes, header: list[str], fmt: str) -> _Row:
    cells = _csv_cells(_decode(line))
    if len(cells) > len(header):
        raise _Reject("too many columns")
    fields = dict(zip(header, cells, strict=False))  # a short row misses its last columns
    return _fields_row(fields, fmt)


def _attempt(parse: Callable[..., _Row], *args: Any) -> _Row | str:
    try:
        return parse(*args)
    except _Reject as exc:
        return exc.reason


def _header(line: bytes, path: Path) -> list[str]:
    try:
        return [name.strip() for name in _csv_cells(_decode(line))]
    except _Reject as exc:
        raise TraceError(f"trace {path}: its first line is {exc.reason}") from None


def _required(spec: _Spec) -> set[str]:
    return {spec.time, spec.input, spec.output}


def _format_of(first: bytes, path: Path) -> str:
    if first.lstrip().startswith(b"{"):
        return "mooncake"
    header = set(_header(first, path))
    for fmt in ("azure", "burstgpt"):
        if _required(_SPECS[fmt]) <= header:
            return fmt
    expected = "; ".join(
        f"{fmt}: {', '.join(sorted(_required(spec)))}" for fmt, spec in _SPECS.items()
    )
    raise TraceError(
        f"trace {path}: unknown format; its first line is neither a JSON object (mooncake)"
        f" nor a CSV header with the columns of one of ({expected}); it has {sorted(header)}"
    )


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None


def _lines(data: bytes) -> list[bytes]:
    body = data.removeprefix(codecs.BOM_UTF8)
    return [line for line in body.splitlines() if line.strip()]


def detect_format(path: Path) -> str:
    """The trace's format, one of ``FORMATS``, from its first non-blank line."""
    try:
        with path.open("rb") as f:
            lines = (
                line.removeprefix(codecs.BOM_UTF8) if i == 0 else line for i, line in enumerate(f)
            )
            first = next((line for line in lines if line.strip()), None)
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    if first is None:
        raise TraceError(f"trace {path} is empty")
    return _format_of(first, path)


def _rows(lines: list[bytes], fmt: str, path: Path) -> Iterator[_Row | str]:
    if fmt == "mooncake":
        yield from (_attempt(_mooncake_row, line) for line in lines)
        return
    spec = _SPECS[fmt]
    header = _header(lines[0], path)
    lacking = _required(spec) - set(header)
    if lacking:
        raise TraceError(
            f"trace {path} is not a {fmt} trace: its header lacks {sorted(lacking)}"
            f" (it has {header})"
        )
    yield from (_attempt(_csv_row, line, header, fmt) for line in lines[1:])


def _collect(results: Iterable[_Row | str]) -> tuple[list[_Row], dict[str, int]]:
    rows: list[_Row] = []
    rejected: dict[str, int] = {}
    for result in results:
        if isinstance(result, str):
            rejected[result] = rejected.get(result, 0) + 1
        else:
            rows.append(result)
    return rows, rejected


def load_trace(path: Path, fmt: str | None = None) -> Trace:
    """Read a trace file; ``fmt`` None detects the format (see ``detect_format``)."""
    path = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")
    data = _read(path)
    lines = _lines(data)
    if not lines:
        raise TraceError(f"trace {path} is empty (no request)")
    fmt = fmt or _format_of(lines[0], path)
    rows, rejected = _collect(_rows(lines, fmt, path))
    if not rows:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(rejected.items())) or "no rows"
        raise TraceError(f"trace {path} ({fmt}) has no usable request ({reasons})")
    rows.sort(key=lambda r: r.raw_t)  # stable: equal times keep the file's order
    start, unit = rows[0].raw_t, _SPECS[fmt].unit
    requests = tuple(
        TraceRequest((r.raw_t - start) / unit, r.input_tokens, r.output_tokens, r.hash_ids)
        for r in rows
    )
    has_ids = any(r.hash_ids for r in requests)
    return Trace(
        format=fmt,
        path=path,
        sha256=hashlib.sha256(data).hexdigest(),
        requests=requests,
        rejected=rejected,
        block_size=MOONCAKE_BLOCK if has_ids else None,
    )


# -- replay -------------------------------------------------------------------------------


def _mean_rate(count: int, span_s: float) -> float | None:
    """One over the mean gap; None when there is no gap to average."""
    return (count - 1) / span_s if count > 1 and span_s > 0 else None


def _positive(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise TraceError(f"replay {name} must be a finite number > 0, got {value!r}")


def _check_options(
    speed: float | None,
    rate: float | None,
    window: tuple[float, float] | None,
    limit: int | None,
) -> None:
    if speed is not None and rate is not None:
        raise TraceError("replay speed and rate are mutually exclusive: give one or neither")
    _positive("speed", speed)
    _positive("rate", rate)
    if window is not None:
        start, end = window
        if not (math.isfinite(start) and start >= 0 and end > start):
            raise TraceError(
                f"replay window must be (start_s, end_s) with 0 <= start_s < end_s, got {window}"
            )
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise TraceError(f"replay limit must be a whole number >= 1, got {limit!r}")


def _slice(
    trace: Trace, window: tuple[float, float] | None, limit: int | None
) -> tuple[TraceRequest, ...]:
    kept = trace.requests
    if window is not None:
        kept = tuple(r for r in kept if window[0] <= r.t_s < window[1])
    if not kept:
        raise TraceError(
            f"replay window {window} holds no request of trace {trace.path}"
            f" (its requests span 0 to {trace.requests[-1].t_s} s)"
        )
    return kept[:limit]


def _factor(speed: float | None, rate: float | None, native: float | None) -> float:
    if speed is not None:
        return float(speed)
    if rate is None:
        return 1.0
    if native is None:
        raise TraceError("replay rate needs at least two requests at different times in the slice")
    return rate / native


def replay(
    trace: Trace,
    *,
    speed: float | None = None,
    rate: float | None = None,
    window: tuple[float, float] | None = None,
    limit: int | None = None,
) -> Replay:
    """The trace as an open-loop schedule: offsets ``(t_s - first_s) / factor``.

    ``window=(start_s, end_s)`` keeps the requests with ``start_s <= t_s < end_s``
    (``end_s`` may be ``math.inf``), then ``limit`` keeps the first N of those: that is
    the slice, re-based so its first request is due at 0. ``speed`` divides the gaps
    (2.0: twice as fast); ``rate`` (req/s, exclusive with ``speed``) picks the factor that
    makes the slice's mean rate, ``(count - 1) / span_s``, equal to it.
    """
    _check_options(speed, rate, window, limit)
    kept = _slice(trace, window, limit)
    times = np.array([r.t_s for r in kept], dtype=np.float64)
    first = float(times[0])
    native_span = float(times[-1] - first)
    native_rate = _mean_rate(len(kept), native_span)
    factor = _factor(speed, rate, native_rate)
    offsets: npt.NDArray[np.float64] = (times - first) / factor
    offsets.flags.writeable = False
    span = float(offsets[-1])
    end = None if window is None or math.isinf(window[1]) else float(window[1])
    scaling: dict[str, Any] = {
        "slice": {
            "start_s": None if window is None else float(window[0]),
            "end_s": end,
            "limit": limit,
            "first_s": first,
        },
        "speed": speed,
        "rate": rate,
        "factor": factor,
        "count": len(kept),
        "span_s": span,
        "mean_rate": _mean_rate(len(kept), span),
        "trace_span_s": native_span,
        "trace_mean_rate": native_rate,
    }
    return Replay(offsets=offsets, requests=kept, scaling=scaling)


# -- prompts ------------------------------------------------------------------------------


@dataclass
class _Tokens:
    vocab: int
    seed: int
    first_id: int
    block_size: int | None
    blocks: dict[int, IdArray] = field(default_factory=dict)

    def _draw(self, key: Sequence[int], n: int) -> IdArray:
        rng = np.random.default_rng(np.random.SeedSequence(list(key)))
        ids: IdArray = rng.integers(self.first_id, self.vocab, size=n, dtype=np.int64)
        return ids

    def block(self, hash_id: int, size: int) -> IdArray:
        if hash_id < 0:
            raise TraceError(f"hash ids must be >= 0, got {hash_id}")
        if hash_id not in self.blocks:
            self.blocks[hash_id] = self._draw((self.seed, 0, hash_id), size)
        return self.blocks[hash_id]

    def prompt(self, index: int, request: TraceRequest) -> tuple[int, ...]:
        n = request.input_tokens
        size = self.block_size
        ids: IdArray = np.empty(0, dtype=np.int64)
        if size and request.hash_ids:
            used = request.hash_ids[: -(-n // size)]  # ceil: the blocks the length covers
            ids = np.concatenate([self.block(h, size) for h in used])[:n]
        if len(ids) < n:
            ids = np.concatenate([ids, self._draw((self.seed, 1, index), n - len(ids))])
        return tuple(ids.tolist())


def _check_prompt_options(vocab: int, seed: int, block_size: int | None, first_id: int) -> None:
    if not 0 <= first_id < vocab:
        raise TraceError(f"token ids need 0 <= first_id < vocab, got {first_id} and {vocab}")
    if seed < 0:
        raise TraceError(f"seed must be >= 0, got {seed}")
    if block_size is not None and block_size < 1:
        raise TraceError(f"block_size must be >= 1 or None, got {block_size}")


def synthesize_prompts(
    requests: Sequence[TraceRequest],
    *,
    vocab: int,
    seed: int,
    block_size: int | None,
    first_id: int = 4,
) -> list[tuple[int, ...]]:
    """A token-id prompt of ``input_tokens`` ids in ``[first_id, vocab)`` per request.

    With ``block_size`` and hash ids, hash id h is always the same ``block_size`` ids
    (seeded by ``(seed, h)``); the prompt is its blocks concatenated, cut to the input
    length, and padded with ids seeded by ``(seed, index of the request)`` where the
    blocks are too few. Requests whose hash ids share a prefix share exactly that token
    prefix. Without either, each request's ids are seeded by its index: unique prompts.
    Deterministic: the same arguments give the same prompts.
    """
    _check_prompt_options(vocab, seed, block_size, first_id)
    tokens = _Tokens(vocab=vocab, seed=seed, first_id=first_id, block_size=block_size)
    return [tokens.prompt(i, r) for i, r in enumerate(requests)]
