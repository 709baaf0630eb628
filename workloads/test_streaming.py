"""Streaming generation: TTFT, ITL, TPOT, E2E, output tokens/s and goodput.

Closed loop at several concurrencies and open loop (Poisson) at several request rates;
prompt and output lengths from seeded log-normal distributions, unique prompts per
request, ``ignore_eos`` so every request produces exactly the tokens it asked for.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from harness.api import Cell, GenerationRequest, OpenEngine, ReportSpec, RunSettings
from workloads.lib import reporting
from workloads.lib.generative import (
    engine_counters,
    finish,
    load_source,
    make_requests,
    read_counters,
    vocab_size,
    watch_server,
)
from workloads.lib.prompts import NO_LOCAL_MODEL, server_model, text_requests

PROMPT = (64, 16, 256)  # median, min, max tokens
OUTPUT = (32, 8, 64)
LOADS = [("closed", 1.0), ("closed", 4.0), ("open", 4.0), ("open", 12.0)]
# One user in a closed loop keeps one request in flight: its e2e samples are single-stream
# request latencies (t_sched equals t_send there), which pytest-benchmark can compare.
SINGLE_STREAM = ("closed", 1.0)

REPORT = ReportSpec(
    throughput=reporting.REQUESTS,
    tokens=reporting.TOKENS,
    scenario=("load", "level"),  # the loop and its concurrency or rate pose the question
    timing_floor=reporting.LAG_P99,
    latencies=reporting.STREAMED,
    plots=(reporting.TTFT_CDF, reporting.E2E_CDF),
)


@pytest.mark.requires(family="generative", streaming=True)
@pytest.mark.report_spec(REPORT)
@pytest.mark.parametrize(("load", "level"), LOADS, ids=[f"{a}-{b:g}" for a, b in LOADS])
def test_streaming(
    request: pytest.FixtureRequest,
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    aio: asyncio.Runner,
    load: str,
    level: float,
) -> None:
    model = server_model(harness_settings, cell.engine)
    # with --clients N, N client processes share the load (the engine here reports)
    engine, source = load_source(request, open_engine, cell, model, aio)
    seed = harness_settings.seed + 1000
    n = harness_settings.profile.gen_requests
    reqs, warm, prompts = _requests(model, n, seed)
    source.warm_up(warm, 4)
    before = read_counters(engine)
    server = watch_server(request, engine)  # the server's own view, until finish
    sent, offered, _ = source.at_level(load, level, reqs, seed)
    counters = engine_counters(before, read_counters(engine))
    finish(
        cell,
        harness_settings,
        sent.records,
        offered_rate=offered,
        seed=seed,
        server=server,
        extra={"engine_counters": counters, "prompts": prompts} | sent.extra,
        single_stream="e2e" if (load, level) == SINGLE_STREAM else None,
    )


def _requests(
    model: Path, n: int, seed: int
) -> tuple[list[GenerationRequest], list[GenerationRequest], str]:
    """Unique token-id prompts from the model's vocabulary; for a server the user runs
    without a local model, text prompts whose tokens the server counts."""
    if model == NO_LOCAL_MODEL:
        warm = text_requests(4, seed + 1, OUTPUT)
        return text_requests(n, seed, OUTPUT), warm, "text (generated; the server counts tokens)"
    vocab = vocab_size(model)
    reqs = make_requests(n, seed, vocab, PROMPT, OUTPUT)
    return reqs, make_requests(4, seed + 1, vocab, PROMPT, OUTPUT), "token ids"
