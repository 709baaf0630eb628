"""What traffic generative workloads send: the user's dataset, a timestamped trace to
replay, and how long replies may be; validated once, at configuration time.

The harness checks what it can without knowing a file format (the file exists and is a
file, the named format is one the workloads read, the scaling makes sense); the dataset
and trace workloads read the files (workloads/lib/datasets.py, workloads/lib/traces.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness.exceptions import UsageError

OutputMode = Literal["fixed", "reference", "natural"]
OUTPUT_MODES: tuple[OutputMode, ...] = ("fixed", "reference", "natural")
DATASET_FORMATS = ("auto", "sharegpt", "jsonl", "json", "csv", "parquet")
TRACE_FORMATS = ("auto", "mooncake", "azure", "burstgpt")


SPEC_KEYS = {
    "turns": "user turns per session",
    "user": "words per user message",
    "reply": "tokens asked per reply",
    "think": "median think time between an answer and the next question, seconds",
    "rate": "sessions arriving per second",
}


@dataclass(frozen=True)
class SessionSpec:
    """Synthetic multi-turn sessions (``--session-spec``): every session ``turns`` user
    messages of ``user`` words, each answered with ``reply`` tokens, a log-normal think
    time of median ``think`` seconds between an answer and the next question; sessions
    arrive at ``rate`` per second (Poisson)."""

    turns: int = 3
    user: int = 32
    reply: int = 32
    think: float = 0.2
    rate: float = 4.0

    def __post_init__(self) -> None:
        if min(self.turns, self.user, self.reply) < 1:
            raise ValueError("turns, user and reply must be >= 1")
        if not (math.isfinite(self.think) and self.think >= 0):
            raise ValueError("think must be >= 0 seconds")
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError("rate must be > 0 sessions/s")

    @property
    def label(self) -> str:
        """The cell's dataset parameter: the spec in a form ids and file names take."""
        return (
            f"spec-t{self.turns}-u{self.user}-r{self.reply}-think{self.think:g}-rate{self.rate:g}"
        )

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SPEC_KEYS}


@dataclass(frozen=True)
class Traffic:
    """``dataset``/``trace``: the user's files (None: the workloads' generated defaults).
    ``output_mode``: fixed lengths with ``ignore_eos`` (as the token-id workloads), the
    dataset's reference lengths, or natural end of sequence capped at ``output_cap``.
    ``trace_speed`` divides the trace's inter-arrival times; ``trace_rate`` instead scales
    them to a mean rate; ``trace_slice`` keeps trace seconds [start, end)."""

    dataset: Path | None = None
    dataset_format: str = "auto"
    output_mode: OutputMode = "reference"
    output_cap: int = 128
    trace: Path | None = None
    trace_format: str = "auto"
    trace_speed: float | None = None
    trace_rate: float | None = None
    trace_slice: tuple[float, float | None] | None = None
    trace_limit: int | None = None
    session_spec: SessionSpec | None = None

    def __post_init__(self) -> None:
        if self.trace_speed is not None and self.trace_rate is not None:
            raise ValueError("trace_speed and trace_rate exclude each other")
        if self.output_cap < 1:
            raise ValueError("output_cap must be >= 1")

    def to_json(self) -> dict[str, Any]:
        # no session spec: no key, so runs made before the option resume and compare as equal
        spec = {"session_spec": self.session_spec.to_json()} if self.session_spec else {}
        return spec | {
            "dataset": str(self.dataset) if self.dataset else None,
            "dataset_format": self.dataset_format,
            "output_mode": self.output_mode,
            "output_cap": self.output_cap,
            "trace": str(self.trace) if self.trace else None,
            "trace_format": self.trace_format,
            "trace_speed": self.trace_speed,
            "trace_rate": self.trace_rate,
            "trace_slice": list(self.trace_slice) if self.trace_slice else None,
            "trace_limit": self.trace_limit,
        }


DEFAULT_JSON = Traffic().to_json()
"""What a run made before these options measured with."""


def parse_traffic(
    *,
    dataset: str | None,
    dataset_format: str,
    output_mode: str,
    output_cap: int,
    trace: str | None,
    trace_format: str,
    trace_speed: float | None,
    trace_rate: float | None,
    trace_slice: str | None,
    trace_limit: int | None,
    session_spec: str | None = None,
) -> Traffic:
    speed = _positive("--trace-speed", trace_speed)
    rate = _positive("--trace-rate", trace_rate)
    if speed is not None and rate is not None:
        raise UsageError(
            "--trace-speed and --trace-rate both scale the trace: give one (speed divides its"
            " inter-arrival times, rate sets its mean request rate)"
        )
    if trace is None and (speed or rate or trace_slice or trace_limit):
        raise UsageError(
            "--trace-speed, --trace-rate, --trace-slice and --trace-limit need --trace-file"
        )
    if trace_limit is not None and trace_limit < 1:
        raise UsageError(f"--trace-limit must be >= 1, got {trace_limit}")
    if output_cap < 1:
        raise UsageError(f"--output-cap must be >= 1 token, got {output_cap}")
    return Traffic(
        dataset=_file("--dataset", dataset),
        dataset_format=_choice("--dataset-format", dataset_format, DATASET_FORMATS),
        output_mode=_mode(output_mode),
        output_cap=output_cap,
        trace=_file("--trace-file", trace),
        trace_format=_choice("--trace-format", trace_format, TRACE_FORMATS),
        trace_speed=speed,
        trace_rate=rate,
        trace_slice=_slice(trace_slice),
        trace_limit=trace_limit,
        session_spec=parse_session_spec(session_spec),
    )


def parse_session_spec(value: str | None) -> SessionSpec | None:
    """``turns=4,user=64,reply=48,think=1,rate=2``: any of the keys, the rest default."""
    if value is None:
        return None
    given: dict[str, float] = {}
    for part in (p.strip() for p in value.split(",") if p.strip()):
        key, sep, number = part.partition("=")
        if not sep or key.strip() not in SPEC_KEYS:
            raise UsageError(
                f"--session-spec {value!r}: {part!r} is not KEY=VALUE with KEY one"
                f" of {', '.join(SPEC_KEYS)}"
            )
        try:
            given[key.strip()] = float(number)
        except ValueError:
            raise UsageError(f"--session-spec {value!r}: {key.strip()} must be a number") from None
        if not math.isfinite(given[key.strip()]):
            raise UsageError(f"--session-spec {value!r}: {key.strip()} must be finite")
    if any(given.get(k, 1) != int(given.get(k, 1)) for k in ("turns", "user", "reply")):
        raise UsageError(f"--session-spec {value!r}: turns, user and reply are whole numbers")
    base = SessionSpec()
    try:
        return SessionSpec(
            turns=int(given.get("turns", base.turns)),
            user=int(given.get("user", base.user)),
            reply=int(given.get("reply", base.reply)),
            think=given.get("think", base.think),
            rate=given.get("rate", base.rate),
        )
    except ValueError as err:
        raise UsageError(f"--session-spec {value!r}: {err}") from None


def _file(option: str, value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise UsageError(f"{option} {value!r} {what}; give a local file")
    return path.resolve()


def _choice(option: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise UsageError(f"{option} {value!r}: choose one of {', '.join(choices)}")
    return value


def _mode(value: str) -> OutputMode:
    for mode in OUTPUT_MODES:
        if value == mode:
            return mode
    raise UsageError(
        f"--output-mode {value!r}: choose fixed (ignore_eos, a fixed length), reference (the"
        " dataset's reply lengths) or natural (end of sequence, capped by --output-cap)"
    )


def _positive(option: str, value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise UsageError(f"{option} must be a positive number, got {value}")
    return value


def _slice(text: str | None) -> tuple[float, float | None] | None:
    """``START:END`` in trace seconds; either side may be empty (from the start, to the
    end: None)."""
    if text is None:
        return None
    start, sep, end = text.partition(":")
    try:
        lo = float(start) if start.strip() else 0.0
        hi = float(end) if end.strip() else None
    except ValueError:
        lo, hi = math.nan, math.nan
    if not sep or not (math.isfinite(lo) and 0.0 <= lo < (math.inf if hi is None else hi)):
        raise UsageError(
            f"--trace-slice {text!r}: expected START:END in trace seconds with 0 <= START < END"
            " (e.g. 0:600, or 300: for from 300 s to the end)"
        )
    return lo, hi
