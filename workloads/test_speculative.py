"""Speculative decoding off and on: what it buys in tokens per second and inter-token latency.

Requests whose replies can repeat their prompts (a prompt is a short phrase of its own
repeated, then a unique tail; replies of fixed length with ``ignore_eos``) go, closed
loop, to the engine with speculative decoding off, then on (n-gram prompt lookup: no
draft model; ``workloads.lib.features.SPECULATIVE_ON``). ``speculative`` off and on are the
contenders, the same requests in the same order. The engine's own counters give, for the
``on`` cell, the acceptance rate (draft tokens accepted / proposed) and the tokens a
request gains per decoding step (1 + accepted / drafts, vLLM's mean acceptance length):
``metrics.speculative``. On an engine that cannot speculate the ``on`` cell is skipped.

The prompts are token ids, so they need the model's vocabulary (a local model directory).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from engines import vllm_speculative
from harness.api import Cell, GenerationRequest, Headline, OpenEngine, ReportSpec, RunSettings
from workloads.lib import features, reporting
from workloads.lib.generative import (
    FIRST_ID,
    HEADLINE,
    engine_counters,
    finish,
    load_source,
    read_counters,
    vocab_size,
    watch_server,
)
from workloads.lib.prompts import NO_LOCAL_MODEL, server_model

PHRASE = 12  # tokens of the phrase a prompt repeats
REPEATS = 6
TAIL = 8
OUTPUT = 48
USERS = 2

REPORT = ReportSpec(
    throughput=reporting.REQUESTS,
    tokens=reporting.TOKENS,
    scenario=("users",),
    contender=("speculative",),
    latencies=reporting.STREAMED,
    plots=(reporting.TTFT_CDF, reporting.E2E_CDF),
)


def repetitive_requests(n: int, seed: int, vocab: int) -> list[GenerationRequest]:
    """``n`` prompts, each a phrase of its own repeated ``REPEATS`` times and a unique tail:
    text a prompt-lookup proposer can find continuations in."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        phrase = tuple(int(t) for t in rng.integers(FIRST_ID, vocab, size=PHRASE))
        tail = tuple(int(t) for t in rng.integers(FIRST_ID, vocab, size=TAIL))
        out.append(GenerationRequest(phrase * REPEATS + tail, OUTPUT, request_id=f"s{seed}-{i}"))
    return out


@pytest.mark.requires(family="generative", streaming=True)
@pytest.mark.report_spec(REPORT)
@pytest.mark.parametrize("users", [USERS])
@pytest.mark.engine_setting("speculative")
@pytest.mark.parametrize("speculative", ["off", "on"])
def test_speculative(
    request: pytest.FixtureRequest,
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    aio: asyncio.Runner,
    users: int,
    speculative: str,
) -> None:
    settings = harness_settings
    model = server_model(settings, cell.engine)
    if model == NO_LOCAL_MODEL:
        pytest.skip("the prompts are token ids: give the served model's directory (--model)")
    on = speculative == "on"
    options = features.speculative_setting(cell.engine, settings, on=on)
    engine, source = load_source(request, open_engine, cell, model, aio, options=options)
    seed = settings.seed + 7000
    vocab = vocab_size(model)
    reqs = repetitive_requests(settings.profile.gen_requests, seed, vocab)
    source.warm_up(repetitive_requests(4, seed + 1, vocab), users)
    before = read_counters(engine)
    server = watch_server(request, engine)  # the server's own view, until finish
    sent, _, _ = source.at_level("closed", float(users), reqs, seed)
    counters = engine_counters(before, read_counters(engine))
    account = vllm_speculative.acceptance(counters)
    headline: tuple[Headline, ...] = HEADLINE
    if account.get("accepted_tokens_per_step") is not None:
        headline = (
            *HEADLINE,
            Headline(label="accepted", metric="speculative.acceptance_rate", unit=""),
            Headline(label="tok/step", metric="speculative.accepted_tokens_per_step", unit=""),
        )
    finish(
        cell,
        settings,
        sent.records,
        offered_rate=None,
        seed=seed,
        server=server,
        headline=headline,
        extra={
            "engine_counters": counters,
            "speculative": account | {"setting": options.get("speculative", "off")},
        }
        | sent.extra,
    )
