"""Per-request timing of streamed generation and the metrics docs/methodology.md defines for it.

A request is stamped at the client: ``t_sched`` (when it was due), ``t_send`` (when the
generator actually sent it) and the arrival time of every chunk with the number of
output tokens it carried. From those alone:

* ``ttft`` = t_first - t_sched (and ``ttft_send`` = t_first - t_send), where t_first is
  the first chunk carrying at least one token (role-only or empty chunks do not count);
* ``tpot`` = (t_last - t_first) / (n_out - 1);
* ``itl``: each gap between successive token-carrying chunks, spread evenly over the k
  tokens of the later chunk (k samples of gap/k); ``icl`` keeps the raw chunk gaps;
* ``e2e`` = t_last - t_sched, ``service`` = t_last - t_send, ``queue`` = t_send - t_sched.

A reasoning model's stream may say which tokens are reasoning (its thinking) and which
are the answer (``Chunk.reasoning_tokens``): ``ttft`` stays the time to the first token
of any kind, ``ttft_answer`` = t_first_answer - t_sched is the time to the first answer
token, and the ``reasoning`` section splits the tokens; both appear only in cells where
some request had reasoning, so other cells' records are unchanged.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal

from harness.metrics import failures, stats

InputSource = Literal["engine", "prompt ids", "tokenizer", "unknown"]
"""Where a request's input-token count came from (harness.load.streamdriver)."""


@dataclass(frozen=True)
class RequestRecord:
    """What the client observed for one request. ``error`` set: the request failed."""

    t_sched: float
    t_send: float
    t_end: float
    chunk_times: tuple[float, ...]
    chunk_tokens: tuple[int, ...]
    n_in: int
    n_asked: int
    n_out_reported: int | None = None
    error: str | None = None
    engine_stats: Mapping[str, float] | None = None
    n_out_retokenized: int | None = None
    client_stats: Mapping[str, float] | None = None
    n_in_source: InputSource = "prompt ids"
    lag: float = 0.0
    """The generator's own lateness: actual send minus when it meant to send (open loop:
    t_sched; static batches: when the batch was released). Queueing is not lag."""
    chunk_reasoning: tuple[int, ...] = ()
    """Of each chunk's tokens, how many were reasoning (``Chunk.reasoning_tokens``);
    empty: no chunk had any (every token is answer)."""

    def __post_init__(self) -> None:
        if len(self.chunk_times) != len(self.chunk_tokens):
            raise ValueError("one token count per chunk")
        if self.chunk_reasoning:
            if len(self.chunk_reasoning) != len(self.chunk_tokens):
                raise ValueError("one reasoning token count per chunk (or none)")
            pairs = zip(self.chunk_reasoning, self.chunk_tokens, strict=True)
            if any(not 0 <= r <= k for r, k in pairs):
                raise ValueError("a chunk's reasoning tokens must be between 0 and its tokens")
        if self.t_send < self.t_sched - 1e-3 or self.t_end < self.t_send:
            raise ValueError("timestamps out of order")

    @property
    def n_out(self) -> int:
        """Server-reported count when offered (engine counts first), else counted."""
        return self.n_out_reported if self.n_out_reported is not None else self.n_counted

    @property
    def n_counted(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def ok(self) -> bool:
        return self.error is None and self.n_counted > 0

    @property
    def n_reasoning(self) -> int:
        """Reasoning tokens counted in the stream (0: none, or not separated)."""
        return sum(self.chunk_reasoning)

    @property
    def n_answer(self) -> int:
        """Answer tokens counted in the stream: every counted token that is not reasoning."""
        return self.n_counted - self.n_reasoning

    @property
    def has_reasoning(self) -> bool:
        return self.n_reasoning > 0

    def _token_times(self) -> list[tuple[float, int]]:
        return [(t, k) for t, k in zip(self.chunk_times, self.chunk_tokens, strict=True) if k > 0]

    @property
    def t_first(self) -> float:
        """The first token of any kind, reasoning or answer."""
        return self._token_times()[0][0]

    @property
    def ttft(self) -> float:
        """Scheduled time to the first token of any kind."""
        return self.t_first - self.t_sched

    @property
    def t_first_answer(self) -> float | None:
        """The first answer token (None: the stream had none, all of it reasoning)."""
        reasoning = self.chunk_reasoning or (0,) * len(self.chunk_tokens)
        for t, k, r in zip(self.chunk_times, self.chunk_tokens, reasoning, strict=True):
            if k > r:
                return t
        return None

    @property
    def ttft_answer(self) -> float | None:
        """Scheduled time to the first answer token; without reasoning, ``ttft``."""
        t = self.t_first_answer
        return None if t is None else t - self.t_sched

    @property
    def t_last(self) -> float:
        return self._token_times()[-1][0]

    @property
    def tpot(self) -> float | None:
        n = self.n_counted
        return (self.t_last - self.t_first) / (n - 1) if n > 1 else None

    def itl(self) -> list[float]:
        times = self._token_times()
        out: list[float] = []
        for (t0, _), (t1, k) in pairwise(times):
            out.extend([(t1 - t0) / k] * k)
        return out

    def icl(self) -> list[float]:
        times = [t for t, _ in self._token_times()]
        return [b - a for a, b in pairwise(times)]


@dataclass(frozen=True)
class SLO:
    """``metric`` p``percentile`` must be <= ``threshold_s``; per request, metric <= threshold."""

    metric: str
    percentile: float
    threshold_s: float

    METRICS = ("ttft", "tpot", "e2e", "itl")

    def __post_init__(self) -> None:
        if self.metric not in self.METRICS:
            raise ValueError(
                f"SLO metric must be one of {', '.join(self.METRICS)}, got {self.metric!r}"
            )
        if not 0 < self.percentile < 100:
            raise ValueError("SLO percentile must be in (0, 100)")
        if not (math.isfinite(self.threshold_s) and self.threshold_s > 0):
            raise ValueError("SLO threshold must be a positive duration")

    @property
    def key(self) -> str:
        return f"{self.metric}_p{self.percentile:g}"


def parse_slos(text: str) -> tuple[SLO, ...]:
    """``"ttft_p99=200ms,tpot_p99=50ms"`` -> SLOs (units: s, ms, us; bare numbers are s).

    Every flaw is a ``ValueError`` that names the item: a metric given twice is one (which
    of two thresholds was meant cannot be guessed)."""
    slos: dict[str, SLO] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        slo = _slo(item)
        if slo.key in slos:
            raise ValueError(f"{slo.key} is given twice; give each metric and percentile once")
        slos[slo.key] = slo
    return tuple(slos.values())


def _slo(item: str) -> SLO:
    key, sep, value = item.partition("=")
    metric, _, pct = key.strip().rpartition("_p")
    if not sep or not metric or not pct:
        raise ValueError(f"SLO {item!r}: expected METRIC_pNN=DURATION, e.g. ttft_p99=200ms")
    try:
        percentile = float(pct)
    except ValueError:
        raise ValueError(f"SLO {item!r}: p{pct} is not a percentile; e.g. p99 or p99.9") from None
    try:
        return SLO(metric.strip(), percentile, _duration(value.strip()))
    except ValueError as exc:
        raise ValueError(f"SLO {item!r}: {exc}") from None


def _duration(text: str) -> float:
    number, scale = text, 1.0
    for suffix, factor in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if text.endswith(suffix):
            number, scale = text[: -len(suffix)], factor
            break
    try:
        return float(number) * scale
    except ValueError:
        raise ValueError(
            f"{text!r} is not a duration; give a number with s, ms or us, e.g. 200ms"
        ) from None


def meets(rec: RequestRecord, slos: Sequence[SLO]) -> bool:
    """Per-request SLO check for goodput; a failed request never meets an SLO."""
    if not rec.ok:
        return False
    values = {
        "ttft": rec.t_first - rec.t_sched,
        "tpot": rec.tpot or 0.0,
        "e2e": rec.t_last - rec.t_sched,
        "itl": max(rec.itl(), default=0.0),
    }
    return all(values[s.metric] <= s.threshold_s for s in slos)


@dataclass
class StreamMetrics:
    """Cell-level metrics over a set of requests; ``to_json`` is what records store."""

    records: Sequence[RequestRecord]
    slos: Sequence[SLO] = ()
    window_s: float = field(init=False)

    def __post_init__(self) -> None:
        if not self.records:
            raise ValueError("no requests")
        start = min(r.t_sched for r in self.records)
        self.window_s = max(r.t_end for r in self.records) - start

    @property
    def ok(self) -> list[RequestRecord]:
        return [r for r in self.records if r.ok]

    @property
    def failed(self) -> int:
        return len(self.records) - len(self.ok)

    def samples(self) -> dict[str, list[float]]:
        ok = self.ok
        # only where some request reasoned (other cells' records stay as they were); a
        # request without reasoning answers at its first token, one that never reached
        # its answer (all reasoning) has no sample
        answer = (
            {"ttft_answer": [t for r in ok if (t := r.ttft_answer) is not None]}
            if any(r.has_reasoning for r in ok)
            else {}
        )
        return {
            "ttft": [r.ttft for r in ok],
            "ttft_send": [r.t_first - r.t_send for r in ok],
            **answer,
            "tpot": [t for r in ok if (t := r.tpot) is not None],
            "itl": [g for r in ok for g in r.itl()],
            "icl": [g for r in ok for g in r.icl()],
            "e2e": [r.t_last - r.t_sched for r in ok],
            "service": [r.t_last - r.t_send for r in ok],
            "queue": [r.t_send - r.t_sched for r in self.records],
        }

    def to_json(self) -> dict[str, object]:
        s = self.samples()
        failed = self.failed
        out: dict[str, object] = {}
        for name, values in s.items():
            # every failed request counts in the error-adjusted percentiles of each latency
            fails = failed if name not in ("queue", "icl") else 0
            if name == "ttft_answer":  # and so does a request that never reached its answer
                fails += sum(r.t_first_answer is None for r in self.ok)
            out[name] = stats.to_json(stats.summarize(values, fails))
        ok = self.ok
        n_out = sum(r.n_out for r in ok)
        good = sum(meets(r, self.slos) for r in self.records)
        out["throughput"] = {
            "requests_per_s": len(ok) / self.window_s,
            "requests_per_s_ci95": list(stats.rate_ci(len(ok), self.window_s)),
            "output_tokens_per_s": n_out / self.window_s,
            "goodput_requests_per_s": good / self.window_s,
        }
        out["tokens"] = self._token_accounting()
        out["slo"] = slo_verdicts(out, self.slos)
        out["requests"] = {
            "total": len(self.records),
            "ok": len(ok),
            "failed": failed,
            "met_slo": good,
        }
        out["errors"] = failures.tally(r.error for r in self.records if r.error is not None)
        out["engine_side"] = self._engine_side()
        if any(r.has_reasoning for r in ok):
            out["reasoning"] = self._reasoning()
        return out

    def _reasoning(self) -> dict[str, object]:
        """The reasoning/answer split of the tokens counted in the stream (ok requests)."""
        ok = self.ok
        reasoning = sum(r.n_reasoning for r in ok)
        answer = sum(r.n_answer for r in ok)
        return {
            "requests": sum(r.has_reasoning for r in ok),
            "without_answer": sum(r.t_first_answer is None for r in ok),
            "reasoning_tokens": reasoning,
            "answer_tokens": answer,
            "reasoning_share": reasoning / (reasoning + answer),
        }

    def _engine_side(self) -> dict[str, object]:
        """The engine's own per-request timings, beside the client-side ones, where offered."""
        stats_by_key: dict[str, list[float]] = {}
        for r in self.ok:
            for key, value in (r.engine_stats or {}).items():
                stats_by_key.setdefault(key, []).append(value)
        return {key: stats.to_json(stats.summarize(v)) for key, v in sorted(stats_by_key.items())}

    def _token_accounting(self) -> dict[str, object]:
        ok = self.ok
        reported = [r for r in ok if r.n_out_reported is not None]
        retok = [r for r in ok if r.n_out_retokenized is not None]
        return {
            "input": sum(r.n_in for r in ok),
            "input_source": dict(sorted(Counter(r.n_in_source for r in ok).items())),
            "output": sum(r.n_out for r in ok),
            "asked": sum(r.n_asked for r in ok),
            "short_of_asked": sum(r.n_out < r.n_asked for r in ok),
            "reported_vs_counted_mismatch": sum(r.n_out_reported != r.n_counted for r in reported),
            "server_reported": len(reported),
            # the client re-tokenizing the text: decoding then encoding need not give the
            # same ids, so disagreement is recorded, not corrected
            "retokenized": sum(r.n_out_retokenized or 0 for r in retok),
            "retokenized_requests": len(retok),
            "retokenized_mismatch": sum(r.n_out_retokenized != r.n_out for r in retok),
        }


def slo_verdicts(metrics: Mapping[str, object], slos: Sequence[SLO]) -> dict[str, object]:
    """Each SLO judged on the error-adjusted percentile of its metric's summary in
    ``metrics`` (a failed request counts as infinite latency); no value, not met."""
    verdicts: dict[str, object] = {}
    for slo in slos:
        summary = metrics.get(slo.metric)
        adjusted = summary.get("adjusted", {}) if isinstance(summary, dict) else {}
        value = adjusted.get(stats.percentile_key(slo.percentile))
        verdicts[slo.key] = {
            "threshold_s": slo.threshold_s,
            "value_s": value,
            "met": value is not None and value <= slo.threshold_s,
        }
    return verdicts
