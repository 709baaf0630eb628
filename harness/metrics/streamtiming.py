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

SLOs (harness.metrics.slo) hold each request to its ``ttft``, ``tpot``, ``e2e`` and
largest ITL gap (``STREAM_LATENCIES``); the run's SLOs on other latencies are other
workloads' and leave a stream's goodput and verdicts as they are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal

from harness.metrics import failures, stats
from harness.metrics.slo import BUILT_IN, SLO, parse_slos, slo_verdicts, within

__all__ = [
    "SLO",
    "STREAM_LATENCIES",
    "InputSource",
    "RequestRecord",
    "StreamMetrics",
    "meets",
    "parse_slos",
]

STREAM_LATENCIES = BUILT_IN
"""The latencies a streamed request is held to, per request (``meets``) and per cell (all
of the harness's own): what the generative workloads declare (``ReportSpec.latencies``)."""

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


def meets(rec: RequestRecord, slos: Sequence[SLO]) -> bool:
    """Per-request SLO check for goodput; a failed request never meets an SLO."""
    return rec.ok and bool(within(_held_to([rec]), slos).all())


def _held_to(ok: Sequence[RequestRecord]) -> dict[str, list[float]]:
    """What each successful request is held to: its TTFT, TPOT, E2E and largest ITL gap."""
    return {
        "ttft": [r.t_first - r.t_sched for r in ok],
        "tpot": [r.tpot or 0.0 for r in ok],
        "e2e": [r.t_last - r.t_sched for r in ok],
        "itl": [max(r.itl(), default=0.0) for r in ok],
    }


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
        good = int(within(_held_to(ok), self.slos).sum())
        out["throughput"] = {
            "requests_per_s": len(ok) / self.window_s,
            "requests_per_s_ci95": list(stats.rate_ci(len(ok), self.window_s)),
            "output_tokens_per_s": n_out / self.window_s,
            "goodput_requests_per_s": good / self.window_s,
        }
        out["tokens"] = self._token_accounting()
        out["slo"] = slo_verdicts(out, self.slos, STREAM_LATENCIES)
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
