"""Trace replay: the arrivals and lengths production saw, open loop, on any generative engine.

``--trace-file FILE`` (Mooncake JSONL, Azure LLM inference CSV, BurstGPT CSV; without it a
generated Mooncake-format trace, workloads/lib/tracegen.py) is replayed open loop: each
request is due at the trace's own timestamp, scaled by ``--trace-speed`` or to
``--trace-rate``, optionally sliced (``--trace-slice``, ``--trace-limit``); latency counts
from the scheduled time and the generator's lag is checked like every open loop. Prompts
are token ids synthesized to the traced lengths: a ``hash_ids`` block (512 tokens in
Mooncake) is the same tokens wherever it appears, so requests that shared a prefix in
production share it here and a prefix cache sees the reuse it saw. Replies have the
traced lengths (``ignore_eos``). A request longer than the model's context is clipped to
it and counted, never dropped.

The record keeps the trace's content hash, the slice and the scaling, the scheduled time
of every request (``samples["scheduled"]``, to check against the scaled trace) and the
traffic carried; a server's own counters (prefix-cache queries and hits) beside it. The
engine's prefix cache is on (``prefix_cache=on``: vLLM's ``enable_prefix_caching``, and
the server the harness starts for ``openai``), as production serves such traffic.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from harness.api import (
    Cell,
    GenerationRequest,
    OpenEngine,
    ReportSpec,
    RequestRecord,
    RunSettings,
    settings_of,
)
from workloads.lib import reporting, traces
from workloads.lib.generative import (
    engine_counters,
    finish,
    load_source,
    read_counters,
    traffic_samples,
    vocab_size,
    watch_server,
)
from workloads.lib.prompts import NO_LOCAL_MODEL, engine_context, server_model, traffic_label
from workloads.lib.tracegen import default_trace

REPORT = ReportSpec(
    throughput=reporting.REQUESTS,
    tokens=reporting.TOKENS,
    scenario=("trace",),
    timing_floor=reporting.LAG_P99,
    latencies=reporting.STREAMED,
    plots=(reporting.TTFT_CDF, reporting.E2E_CDF, *reporting.TRAFFIC_PLOTS),
)


def load_user_trace(settings: RunSettings) -> traces.Trace:
    traffic = settings.traffic
    path = traffic.trace or default_trace(settings.seed)
    fmt = None if traffic.trace_format == "auto" else traffic.trace_format
    return traces.load_trace(path, fmt)


def replay_of(settings: RunSettings, trace: traces.Trace) -> traces.Replay:
    """The user's scaling; the default trace and a run without --trace-limit replay the
    profile's number of generative requests."""
    traffic = settings.traffic
    return traces.replay(
        trace,
        speed=traffic.trace_speed,
        rate=traffic.trace_rate,
        window=_window(traffic.trace_slice),
        limit=traffic.trace_limit or settings.profile.gen_requests,
    )


def _window(cut: tuple[float, float | None] | None) -> tuple[float, float] | None:
    """``--trace-slice START:`` runs to the trace's end."""
    if cut is None:
        return None
    return cut[0], math.inf if cut[1] is None else cut[1]


def requests_of(
    replay: traces.Replay, prompts: list[tuple[int, ...]], context: int
) -> tuple[list[GenerationRequest], int]:
    """The traced lengths, each clipped to the model's context (input first: the reply
    keeps its traced length); how many were clipped."""
    out, clipped = [], 0
    for i, (req, prompt) in enumerate(zip(replay.requests, prompts, strict=True)):
        output = max(1, min(req.output_tokens, context // 2))
        room = context - output - 1
        if len(prompt) > room or output < req.output_tokens:
            clipped += 1
        out.append(GenerationRequest(prompt=prompt[:room], max_tokens=output, request_id=f"t{i}"))
    return out, clipped


def scheduled(records: list[RequestRecord], first_offset: float) -> list[float]:
    """When each request was due, from the window start (records are in request order)."""
    start = records[0].t_sched - first_offset
    return [round(r.t_sched - start, 7) for r in records]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The trace is a parameter of the cell: cells of another trace are never compared
    or ranked with it."""
    if "trace" in metafunc.fixturenames:
        label = traffic_label(settings_of(metafunc.config).traffic.trace, "synthetic-mooncake")
        metafunc.parametrize("trace", [label], ids=[label])


@pytest.mark.requires(family="generative", streaming=True)
@pytest.mark.report_spec(REPORT)
@pytest.mark.engine_setting("prefix_cache")
@pytest.mark.parametrize("prefix_cache", ["on"])
def test_trace(
    request: pytest.FixtureRequest,
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    aio: asyncio.Runner,
    trace: str,
    prefix_cache: str,
) -> None:
    settings = harness_settings
    model = server_model(settings, cell.engine)
    if model == NO_LOCAL_MODEL:
        pytest.skip(
            "trace replay synthesizes token-id prompts from the model's vocabulary: give"
            " --model DIR (a local copy of the server model's tokenizer and config)"
        )
    log = load_user_trace(settings)
    replay = replay_of(settings, log)
    seed = settings.seed + 4000
    prompts = traces.synthesize_prompts(
        replay.requests, vocab=vocab_size(model), seed=seed, block_size=log.block_size
    )
    # production serves with the prefix cache on: the trace's shared prefixes hit it
    on = prefix_cache == "on"
    engine, source = load_source(request, open_engine, cell, model, aio, prefix_caching=on)
    reqs, clipped = requests_of(replay, prompts, engine_context(engine, model) or 2048)
    source.warm_up(_warmup(vocab_size(model), seed), 2)
    before = read_counters(engine)
    server = watch_server(request, engine)  # the server's own view, until finish
    sent = source.open_loop(reqs, replay.offsets)
    counters = engine_counters(before, read_counters(engine))
    info: dict[str, Any] = log.to_json() | {"scaling": replay.scaling, "clipped": clipped}
    samples = traffic_samples(sent.records, replay.offsets)
    samples["scheduled"] = scheduled(sent.records, float(replay.offsets[0]))
    finish(
        cell,
        settings,
        sent.records,
        offered_rate=float(replay.scaling["mean_rate"]),
        seed=seed,
        server=server,
        extra={"engine_counters": counters, "trace": info} | sent.extra,
        samples=samples,
    )


def _warmup(vocab: int, seed: int) -> list[GenerationRequest]:
    """Two requests of their own tokens: warm, without priming the trace's prefixes."""
    return [
        GenerationRequest(
            prompt=tuple(4 + (seed + i * 7 + k) % (vocab - 4) for k in range(64)),
            max_tokens=8,
            request_id=f"warm-{i}",
        )
        for i in range(2)
    ]
