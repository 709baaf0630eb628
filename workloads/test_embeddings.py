"""Embeddings, scores and reranking: latency per request, inputs/s and tokens/s.

Each request carries ``batch`` inputs: an ``/v1/embeddings`` call with an ``input`` list
(``embed``), or one query against ``batch`` documents (``score``: ``/v1/score``;
``rerank``: ``/v1/rerank``); in process, the same through the engine's ``pool``
(engines/vllm_pooling.py). Closed loop (users that send their next request when the last
ends, over the profile's shortest valid window and at least its request count) and open
loop (Poisson arrivals at a request rate, latency from each request's scheduled time);
inputs from the generated text or the user's ``--dataset`` (workloads/lib/embedding.py).

Latency is the whole request's (``e2e``; ``--slo e2e_p99=...`` holds it). Throughput is
counted in requests, inputs and prompt tokens per second of the window; ``recommend``
ranks by inputs/s. Token counts are the engine's (vLLM's ``prompt_token_ids``, the
server's ``usage.prompt_tokens``): for score and rerank on an embedding model, the
query's tokens once and each document's, as vLLM's server counts them. Every failed
request is counted with its error.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from harness.api import (
    Cell,
    Headline,
    MonotonicClock,
    OpenEngine,
    OpenLoop,
    Rate,
    ReportSpec,
    RunSettings,
    settings_of,
    slo_verdicts,
)
from workloads.lib import embedding, reporting
from workloads.lib.loadgen import PoolDriver, PoolTrace, summarize_pooling

KINDS = ("embed", "score", "rerank")
BATCHES = (1, 16)
LOADS = [("closed", 1.0), ("closed", 4.0), ("open", 16.0)]
"""Closed loop with 1 and 4 users; open loop at 16 requests/s (of 16 inputs, a third of
what the tiny model takes in process on one core)."""
WARMUP_REQUESTS = 8
WINDOW_MARGIN = 1.2
"""A closed loop runs past the profile's shortest valid window by this much."""

INPUTS = Rate(
    metric="throughput.inputs_per_s",
    unit="inputs/s",
    counts="inputs",
    ci="throughput.inputs_per_s_ci95",
)
REPORT = ReportSpec(
    throughput=INPUTS,
    # the traffic, the request's kind and size and the load pose the question
    scenario=("dataset", "kind", "batch", "load", "level"),
    timing_floor=reporting.LAG_P99,
    latencies=reporting.SERVED,  # e2e, a sample per request
    plots=(reporting.E2E_CDF,),
)
HEADLINE = [
    Headline(label="p50", metric="e2e.p50", unit="ms", scale=1e3, ci="e2e.ci95.p50"),
    Headline(label="p99", metric="e2e.p99", unit="ms", scale=1e3, ci="e2e.ci95.p99"),
    Headline(label="inputs", metric="throughput.inputs_per_s", unit="inputs/s"),
    Headline(label="tokens", metric="throughput.tokens_per_s", unit="tok/s"),
    Headline(label="tput", metric="throughput.requests_per_s", unit="req/s"),
]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The inputs' source is a parameter of the cell: cells of different datasets are
    never compared or ranked together."""
    if "dataset" in metafunc.fixturenames:
        metafunc.parametrize("dataset", [embedding.dataset_label(settings_of(metafunc.config))])


@pytest.mark.report_spec(REPORT)
@pytest.mark.parametrize(("load", "level"), LOADS, ids=[f"{a}-{b:g}" for a, b in LOADS])
@pytest.mark.parametrize("batch", BATCHES, ids=[f"{b}-input{'s' * (b > 1)}" for b in BATCHES])
# an engine that serves no such requests (Capabilities.pooling) skips, saying which
@pytest.mark.parametrize(
    "kind", [pytest.param(k, marks=pytest.mark.requires(pooling=k)) for k in KINDS]
)
def test_embeddings(
    request: pytest.FixtureRequest,
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    aio: asyncio.Runner,
    dataset: str,
    kind: str,
    batch: int,
    load: str,
    level: float,
) -> None:
    engine, _ = embedding.open_pooling(request, open_engine, cell, harness_settings)
    texts = embedding.texts(harness_settings)
    seed = harness_settings.seed + 4000
    profile = harness_settings.profile
    driver = PoolDriver(engine, MonotonicClock(), harness_settings.reliability.request_timeout_s)
    warm = texts.requests(kind, WARMUP_REQUESTS, batch, seed + 1)
    aio.run(driver.closed_loop(warm, 2))
    min_window = profile.policy.min_window_s * WINDOW_MARGIN
    if load == "closed":
        reqs = texts.requests(kind, profile.gen_requests, batch, seed)
        run = aio.run(driver.closed_loop(reqs, int(level), min_window, profile.gen_requests))
        offered = None
    else:
        n = max(profile.gen_requests, math.ceil(level * min_window))
        # twice the mean span, cut at n: a Poisson count over n / level falls short of n
        offsets = OpenLoop(rate=level, duration=2 * n / level).schedule(seed)[:n]
        reqs = texts.requests(kind, len(offsets), batch, seed)
        run = aio.run(driver.open_loop(reqs, offsets))
        # judged against the rate the seeded schedule realized, not the nominal one
        offered = (len(offsets) - 1) / float(offsets[-1])
    # one user: one request in flight, each sample one request's own time
    single = "e2e" if (load, level) == ("closed", 1.0) else None
    _finish(cell, harness_settings, run, offered, seed, texts.info, single)


def _finish(
    cell: Cell,
    settings: RunSettings,
    run: PoolTrace,
    offered: float | None,
    seed: int,
    inputs: dict[str, object],
    single_stream: str | None,
) -> None:
    summary = summarize_pooling(run, offered, settings.slos)
    metrics = summary.metrics | {"dataset": inputs, "example": _example(run)}
    metrics["slo"] = slo_verdicts(metrics, settings.slos, REPORT.latency_names())
    cell.finish(
        metrics=metrics,
        evidence=summary.evidence,
        headline=HEADLINE,
        samples=summary.samples,
        window={"duration_s": summary.evidence.window_s, "requests": len(run.outcomes)},
        seeds={"requests": seed, "model": settings.seed},
        slow=summary.slow,
        single_stream=single_stream,
    )


def _example(run: PoolTrace) -> dict[str, object]:
    """What the first request looked like (its first input's start) and what came back
    (its first scores), for the record's reader and for comparing engines."""
    req, result = run.requests[0], run.outcomes[0].result
    first = req.inputs[0]
    return {
        "kind": req.kind,
        "inputs": len(req.inputs),
        "first_input": first[:80] if isinstance(first, str) else list(first[:16]),
        "query": req.query[:80],
        "scores": [round(x, 4) for x in result.scores[:4]] if result else None,
        "dims": result.dims if result else None,
    }
