"""The same cell's TTFT, ITL, TPOT and E2E under the definitions of other tools, so that a
figure from ``vllm bench serve``, NVIDIA AIPerf or GuideLLM can be reconciled with the
harness's own. Pure computation on the client's ``RequestRecord``s; successful requests
only.

Each tool's definition, as its source has it (read, not copied):

* **vllm-bench-serve**: vllm-project/vllm,
  ``vllm/benchmarks/lib/endpoint_request_func.py`` at
  02cfb534df5674737558730b10f23d1b7aef9b7c (``async_request_openai_completions``,
  ``async_request_openai_chat_completions``) and ``vllm/benchmarks/serve.py`` at
  def9ce85ba1079af970a58ed3d42dd861ae35d58 (``calculate_metrics``). The clock starts
  (``st = time.perf_counter()``) just before ``session.post``, after the client's own
  concurrency wait. Every SSE message whose ``choices`` is non-empty is a "token",
  whatever its text: the first sets ``ttft``, each later one appends one ``itl`` gap (one
  per chunk, not per token); the usage-only message moves neither, and ``latency`` ends at
  the last message with choices. ``output_len`` is the usage ``completion_tokens`` when
  truthy, else the client tokenizer's count of the text; ``tpot = (latency - ttft) /
  (output_len - 1)`` per request when ``output_len > 1``. ITL is pooled over requests;
  statistics are ``np.mean`` / ``np.percentile`` (interpolating).
* **aiperf**: ai-dynamo/aiperf at db4f6397d11ee2d4cfbb41f70b2327315163dcf0:
  ``aiperf/metrics/types/ttft_metric.py`` (``TTFTMetric``),
  ``request_latency_metric.py`` (``RequestLatencyMetric``),
  ``inter_token_latency_metric.py`` (``InterTokenLatencyMetric``),
  ``inter_chunk_latency_metric.py``, ``output_sequence_length_metric.py``;
  ``aiperf/parsers/openai_parsers.py`` (``_parse_chat_common`` drops chunks with neither
  content nor reasoning), ``aiperf/parsers/inference_result_parser.py``
  (``process_valid_record``: OSL is the client tokenizer's count of the joined text),
  ``aiperf/clients/http/aiohttp_client.py`` (``AioHttpClientMixin._request``:
  ``start_perf_ns`` just before ``session.request``). TTFT = first content response -
  start; request latency = last content response - start; ITL = (request latency -
  TTFT) / (OSL - 1), one value per request, none when OSL < 2. AIPerf has no TPOT: its
  ITL is vLLM's TPOT formula; per-chunk gaps are its ``inter_chunk_latency``. Later
  versions (``src/aiperf/metrics/types/inter_token_latency_metric.py`` at
  58dd5dea729ceece71b0afbea12994030bf70d8b) divide by OSL minus the first chunk's tokens
  only under ``--per-chunk-usage``; the default stays OSL - 1, which is used here.
* **guidellm**: vllm-project/guidellm at ee7a77457ba668b4b5ccb40f110518829893b36a:
  ``src/guidellm/schemas/request_stats.py`` (``GenerativeRequestStats``:
  ``time_to_first_token_ms``, ``inter_token_latency_ms``, ``time_per_output_token_ms``,
  ``request_latency``, ``output_tokens``), ``src/guidellm/backends/openai/http.py``
  (``OpenAIHTTPBackend._resolve_streaming``: ``request_start`` just before the stream
  opens; ``first_token_iteration`` / ``last_token_iteration`` at lines whose handler
  found content; ``request_end`` when the stream is done), ``.../request_handlers.py``
  (``add_streaming_line`` returns 1 only for content), ``src/guidellm/benchmark/schemas/
  metrics.py`` (``GenerativeMetrics.compile``: ITL weighted by output_tokens - 1, TPOT by
  output_tokens) and ``src/guidellm/schemas/statistics.py``
  (``DistributionSummary.from_values``: weighted mean, weighted nearest-rank percentiles).
  TTFT = first token - start; ITL = (last - first token) / (output_tokens - 1); TPOT =
  (last token - start) / output_tokens, the first token included; output_tokens is the
  usage count, else the number of content iterations (one token each).
* **harness**: ``harness.metrics.streamtiming`` (docs/methodology.md, "Metric
  definitions"): TTFT and E2E from the scheduled time ``t_sched``.

What a record cannot tell apart: a zero-token chunk with choices (a role-only or empty
delta) from a usage-only one. Zero-token chunks before or between token-carrying chunks
are taken as chunks with choices (a role chunk is first, the usage summary last); those
after the last token-carrying chunk as the usage summary and the end of stream, which
vLLM does not count. A peer's tokenizer count is ``n_out_retokenized`` where the client
re-tokenized, else ``n_out``. GuideLLM's ``request_end`` is read as ``t_end``.

Every column here uses the harness's nearest-rank percentile, so columns differ by
definition only; GuideLLM's token weights are applied by repeating a request's value
once per unit of weight, which nearest rank then reads exactly as GuideLLM's weighted
percentile does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from harness.metrics import stats
from harness.metrics.streamtiming import RequestRecord

TOOLS: tuple[str, ...] = ("harness", "vllm-bench-serve", "aiperf", "guidellm")
METRICS: tuple[str, ...] = ("ttft", "itl", "tpot", "e2e")

_VLLM_SRC = (
    "vllm-project/vllm@02cfb534df5674737558730b10f23d1b7aef9b7c "
    "vllm/benchmarks/lib/endpoint_request_func.py async_request_openai_chat_completions; "
    "@def9ce85ba1079af970a58ed3d42dd861ae35d58 vllm/benchmarks/serve.py calculate_metrics"
)
_AIPERF_SRC = "ai-dynamo/aiperf@db4f6397d11ee2d4cfbb41f70b2327315163dcf0 aiperf/metrics/types/"
_GUIDELLM_SRC = (
    "vllm-project/guidellm@ee7a77457ba668b4b5ccb40f110518829893b36a "
    "src/guidellm/schemas/request_stats.py GenerativeRequestStats"
)
_HARNESS_SRC = "harness/metrics/streamtiming.py RequestRecord, StreamMetrics.samples"


@dataclass(frozen=True)
class Definition:
    """One tool's definition of one metric: a one-line ``how`` and where it was read."""

    tool: str
    metric: str
    how: str
    source: str
    defined: bool = True


DEFINITIONS: tuple[Definition, ...] = (
    Definition(
        "harness",
        "ttft",
        "first token-carrying chunk - t_sched (the scheduled time)",
        _HARNESS_SRC,
    ),
    Definition(
        "harness",
        "itl",
        "each gap between token-carrying chunks spread over the k tokens of the later "
        "chunk (k samples of gap/k), pooled over requests",
        _HARNESS_SRC,
    ),
    Definition(
        "harness",
        "tpot",
        "(t_last - t_first) / (tokens counted in the stream - 1) per request",
        _HARNESS_SRC,
    ),
    Definition("harness", "e2e", "last token-carrying chunk - t_sched", _HARNESS_SRC),
    Definition(
        "vllm-bench-serve",
        "ttft",
        "first chunk with choices (a role-only or empty one too) - send",
        _VLLM_SRC,
    ),
    Definition(
        "vllm-bench-serve",
        "itl",
        "each gap between successive chunks with choices: one sample per chunk, not per "
        "token, pooled over requests",
        _VLLM_SRC,
    ),
    Definition(
        "vllm-bench-serve",
        "tpot",
        "(latency - ttft) / (output_len - 1) per request, output_len = usage "
        "completion_tokens else the client tokenizer's count; only output_len > 1",
        _VLLM_SRC,
    ),
    Definition(
        "vllm-bench-serve",
        "e2e",
        "latency: last chunk with choices (not the usage-only one) - send",
        _VLLM_SRC,
    ),
    Definition(
        "aiperf",
        "ttft",
        "first response with content - request start (just before the HTTP request)",
        _AIPERF_SRC + "ttft_metric.py TTFTMetric",
    ),
    Definition(
        "aiperf",
        "itl",
        "(request_latency - ttft) / (OSL - 1), one value per request; OSL = client "
        "tokenizer count; only OSL >= 2",
        _AIPERF_SRC + "inter_token_latency_metric.py InterTokenLatencyMetric",
    ),
    Definition(
        "aiperf",
        "tpot",
        "not defined: AIPerf has no TPOT; its ITL is vLLM's TPOT formula",
        _AIPERF_SRC,
        defined=False,
    ),
    Definition(
        "aiperf",
        "e2e",
        "request_latency: last response with content - request start",
        _AIPERF_SRC + "request_latency_metric.py RequestLatencyMetric",
    ),
    Definition(
        "guidellm",
        "ttft",
        "first_token_iteration (first line with content) - request_start",
        _GUIDELLM_SRC + ".time_to_first_token_ms",
    ),
    Definition(
        "guidellm",
        "itl",
        "(last - first token) / (output_tokens - 1) per request, weighted by "
        "output_tokens - 1; output_tokens = usage else content iterations",
        _GUIDELLM_SRC + ".inter_token_latency_ms",
    ),
    Definition(
        "guidellm",
        "tpot",
        "(last token - request_start) / output_tokens per request, first token "
        "included, weighted by output_tokens",
        _GUIDELLM_SRC + ".time_per_output_token_ms",
    ),
    Definition(
        "guidellm",
        "e2e",
        "request_latency: request_end (stream closed) - request_start; here t_end - t_send",
        _GUIDELLM_SRC + ".request_latency",
    ),
)

SINGLE_TOKEN: Mapping[str, str] = {
    "harness": "no ITL or TPOT sample; TTFT and E2E counted",
    "vllm-bench-serve": "output_len <= 1: no TPOT sample (0 for goodput only); ITL gaps "
    "only where more than one chunk had choices (a role chunk then the token gives one)",
    "aiperf": "OSL < 2: no ITL (NoMetricValue); TTFT and request latency counted",
    "guidellm": "ITL None, weight 0, dropped; TPOT kept as (t_first - start) / 1, its TTFT, "
    "with weight 1",
}

DIFFERENCES: tuple[str, ...] = (
    "Clock start: the harness's TTFT and E2E count from the scheduled time, every peer's "
    "from the send: queueing in the client and generator lag are in the harness's figure "
    "only (its ttft_send is the peers' view).",
    # (not "First token: vLLM's ...": the results files' secret masking reads "token: X"
    # as a credential and masked the word after it)
    "Where TTFT stops: vLLM's at the first chunk with choices, even a role-only or empty "
    "one (chat servers send the role first); AIPerf, GuideLLM and the harness wait for "
    "content.",
    "ITL: vLLM's is one sample per chunk gap (a k-token chunk is one long gap); the "
    "harness spreads each gap over its k tokens; AIPerf's and GuideLLM's are one average "
    "per request, (decode time) / (tokens - 1), which is vLLM's TPOT formula.",
    "TPOT: vLLM's and the harness's exclude the first token; GuideLLM's "
    "time_per_output_token includes TTFT, (last token - start) / tokens; AIPerf has none.",
    "Token counts: vLLM takes usage, else its tokenizer; AIPerf its own tokenizer; "
    "GuideLLM usage, else one token per content chunk; the harness's TPOT counts the "
    "stream's tokens.",
    "Weighting: GuideLLM weights ITL by tokens - 1 and TPOT by tokens, so long replies "
    "dominate; vLLM's TPOT and AIPerf's ITL count each request once; vLLM's ITL pools "
    "chunk gaps.",
    "E2E ends at the last token for the harness, vLLM and AIPerf; GuideLLM's "
    "request_latency runs to the end of the stream (usage chunk, [DONE]).",
    "Percentiles: every column here is nearest rank; vLLM and AIPerf interpolate "
    "(numpy.percentile) and GuideLLM takes a weighted nearest rank, so their own p99 on "
    "few samples can differ from these.",
)

Samples = dict[str, list[float] | None]
"""Per metric, the samples a tool's statistics run over; None: the tool has no such metric."""


def _token_chunks(r: RequestRecord) -> list[tuple[float, int]]:
    return [(t, k) for t, k in zip(r.chunk_times, r.chunk_tokens, strict=True) if k > 0]


def _choice_times(r: RequestRecord) -> list[float]:
    """Chunks vLLM's client counts: every one up to the last token-carrying chunk (a
    leading role chunk and empty deltas included; the trailing usage summary not)."""
    last = max(i for i, k in enumerate(r.chunk_tokens) if k > 0)
    return list(r.chunk_times[: last + 1])


def _tokenizer_count(r: RequestRecord) -> int:
    # AIPerf and vLLM's fallback count the text with a tokenizer, as the client's
    # re-tokenization does; without one, the harness's own count stands in
    return r.n_out_retokenized if r.n_out_retokenized is not None else r.n_out


def _harness(ok: Sequence[RequestRecord]) -> Samples:
    # the harness's own figures, read from its own definitions so the two cannot drift
    return {
        "ttft": [r.t_first - r.t_sched for r in ok],
        "itl": [g for r in ok for g in r.itl()],
        "tpot": [t for r in ok if (t := r.tpot) is not None],
        "e2e": [r.t_last - r.t_sched for r in ok],
    }


def _vllm_tpot(r: RequestRecord) -> float | None:
    times = _choice_times(r)
    output_len = r.n_out_reported or _tokenizer_count(r)  # usage 0 falls back, as in vLLM
    if output_len <= 1:
        return None
    return (times[-1] - times[0]) / (output_len - 1)


def _vllm(ok: Sequence[RequestRecord]) -> Samples:
    chunks = [_choice_times(r) for r in ok]
    return {
        "ttft": [c[0] - r.t_send for r, c in zip(ok, chunks, strict=True)],
        "itl": [b - a for c in chunks for a, b in pairwise(c)],
        "tpot": [t for r in ok if (t := _vllm_tpot(r)) is not None],
        "e2e": [c[-1] - r.t_send for r, c in zip(ok, chunks, strict=True)],
    }


def _aiperf_itl(r: RequestRecord) -> float | None:
    osl = _tokenizer_count(r)
    if osl < 2:
        return None
    return (r.t_last - r.t_first) / (osl - 1)


def _aiperf(ok: Sequence[RequestRecord]) -> Samples:
    return {
        "ttft": [r.t_first - r.t_send for r in ok],
        "itl": [t for r in ok if (t := _aiperf_itl(r)) is not None],
        "tpot": None,
        "e2e": [r.t_last - r.t_send for r in ok],
    }


def _guidellm_tokens(r: RequestRecord) -> int:
    # without usage GuideLLM assumes one token per content iteration
    return r.n_out_reported if r.n_out_reported is not None else len(_token_chunks(r))


def _weighted(pairs: Sequence[tuple[float, int]]) -> list[float]:
    """Each value once per unit of weight: the mean and nearest rank of the result are
    GuideLLM's weighted mean and weighted percentile."""
    out: list[float] = []
    for value, weight in pairs:
        out.extend([value] * weight)
    return out


def _guidellm(ok: Sequence[RequestRecord]) -> Samples:
    n = [_guidellm_tokens(r) for r in ok]
    itl = [((r.t_last - r.t_first) / (k - 1), k - 1) for r, k in zip(ok, n, strict=True) if k > 1]
    tpot = [((r.t_last - r.t_send) / k, k) for r, k in zip(ok, n, strict=True) if k > 0]
    return {
        "ttft": [r.t_first - r.t_send for r in ok],
        "itl": _weighted(itl),
        "tpot": _weighted(tpot),
        "e2e": [r.t_end - r.t_send for r in ok],
    }


SAMPLERS: Mapping[str, Callable[[Sequence[RequestRecord]], Samples]] = {
    "harness": _harness,
    "vllm-bench-serve": _vllm,
    "aiperf": _aiperf,
    "guidellm": _guidellm,
}


def definition(tool: str, metric: str) -> Definition:
    for d in DEFINITIONS:
        if d.tool == tool and d.metric == metric:
            return d
    raise KeyError(f"no definition of {metric!r} for {tool!r}")


def _summary(values: list[float] | None, d: Definition) -> dict[str, Any]:
    out: dict[str, Any] = {"p50": None, "p99": None, "mean": None, "count": 0}
    if values:
        arr = np.asarray(values, dtype=np.float64)
        out = {
            "p50": stats.nearest_rank(arr, 50.0),
            "p99": stats.nearest_rank(arr, 99.0),
            "mean": float(arr.mean()),
            "count": int(arr.size),
        }
    # below 100 samples nearest-rank p99 is the maximum (stats.min_samples_for)
    out["p99_is_max"] = out["count"] < stats.min_samples_for(99.0)
    return out | {"defined": d.defined, "how": d.how, "source": d.source}


def samples(records: Sequence[RequestRecord]) -> dict[str, Samples]:
    """Per tool, per metric, the samples each tool's statistics would run over (seconds)."""
    ok = [r for r in records if r.ok]
    return {tool: SAMPLERS[tool](ok) for tool in TOOLS}


def reconcile(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """One cell's TTFT, ITL, TPOT and E2E under each tool's definition (seconds), with how
    each is computed, how each tool treats one-token replies, and the differences that
    matter. JSON-able."""
    per_tool = samples(records)
    return {
        "unit": "s",
        "requests": {"total": len(records), "ok": sum(r.ok for r in records)},
        "tools": {
            tool: {m: _summary(per_tool[tool][m], definition(tool, m)) for m in METRICS}
            for tool in TOOLS
        },
        "single_token": dict(SINGLE_TOKEN),
        "differences": list(DIFFERENCES),
    }
