"""A shared system prompt, with the engine's prefix cache off and on.

Every request starts with one of ``prompts`` system prompts of ``length`` tokens (drawn
uniformly, seeded), followed by a user message of its own (unique token ids) and asks
for a short reply; requests arrive open loop (Poisson). It is the common production
case a prefix cache is for: the same instructions before every question. ``prefix_cache``
off and on are the two contenders, the same requests in the same order, so the TTFT
difference is what the cache buys; the engine's own count of prompt tokens looked up and
found in its cache gives the hit rate, beside the share of prompt tokens a prefix seen
before covers (``reusable_share``: the most any cache could find; the engine's block size
rounds it down, evictions lower it).

The prompts are token ids, so the prefix is exactly ``length`` tokens whatever the
tokenizer: it needs the model's vocabulary (a local model directory).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from harness.api import Cell, GenerationRequest, OpenEngine, ReportSpec, RunSettings
from workloads.lib import reporting
from workloads.lib.generative import (
    FIRST_ID,
    engine_counters,
    finish,
    load_source,
    make_requests,
    prefix_cache_account,
    read_counters,
    traffic_samples,
    vocab_size,
    watch_server,
)
from workloads.lib.inputs import lengths
from workloads.lib.prompts import NO_LOCAL_MODEL, engine_context, server_model

SHARED = [(4, 512)]  # (system prompts, tokens each)
USER = (32, 8, 96)  # median, min, max tokens of the user's own part
OUTPUT = (16, 4, 32)
RATE = 8.0  # requests/s, Poisson

REPORT = ReportSpec(
    throughput=reporting.REQUESTS,
    tokens=reporting.TOKENS,
    scenario=("prompts", "length"),
    contender=("prefix_cache",),
    timing_floor=reporting.LAG_P99,
    latencies=reporting.STREAMED,
    plots=(reporting.TTFT_CDF, reporting.E2E_CDF, *reporting.TRAFFIC_PLOTS),
)


def shared_requests(
    n: int, seed: int, vocab: int, prompts: int, length: int
) -> tuple[list[GenerationRequest], float]:
    """``n`` requests, each one of ``prompts`` shared prefixes of ``length`` ids plus a
    user part of its own; and the share of all prompt tokens that a prefix already sent
    covers (``reusable_share``)."""
    rng = np.random.default_rng(seed)
    systems = [
        tuple(int(t) for t in rng.integers(FIRST_ID, vocab, size=length)) for _ in range(prompts)
    ]
    which = rng.integers(0, prompts, size=n)
    user_lens, out_lens = lengths(rng, n, *USER), lengths(rng, n, *OUTPUT)
    requests: list[GenerationRequest] = []
    seen: set[int] = set()
    reusable = total = 0
    for i, (k, u, o) in enumerate(zip(which, user_lens, out_lens, strict=True)):
        user = tuple(int(t) for t in rng.integers(FIRST_ID, vocab, size=u))
        prompt = systems[int(k)] + user
        requests.append(GenerationRequest(prompt, int(o), request_id=f"p{seed}-{i}"))
        reusable += length if int(k) in seen else 0
        total += len(prompt)
        seen.add(int(k))
    return requests, reusable / total


@pytest.mark.requires(family="generative", streaming=True)
@pytest.mark.report_spec(REPORT)
@pytest.mark.parametrize(("prompts", "length"), SHARED, ids=[f"n{n}-len{t}" for n, t in SHARED])
@pytest.mark.engine_setting("prefix_cache")
@pytest.mark.parametrize("prefix_cache", ["off", "on"])
def test_shared_prefix(
    request: pytest.FixtureRequest,
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    aio: asyncio.Runner,
    prompts: int,
    length: int,
    prefix_cache: str,
) -> None:
    settings = harness_settings
    model = server_model(settings, cell.engine)
    if model == NO_LOCAL_MODEL:
        pytest.skip("shared prefixes are token ids: give the served model's directory (--model)")
    engine, source = load_source(
        request, open_engine, cell, model, aio, prefix_caching=prefix_cache == "on"
    )
    context = engine_context(engine, model)
    if context is not None and length + USER[2] + OUTPUT[2] > context:
        pytest.skip(
            f"{length}-token prefixes and their requests exceed the {context}-token context"
        )
    seed = settings.seed + 6000
    vocab = vocab_size(model)
    n = settings.profile.gen_requests
    reqs, reusable = shared_requests(n, seed, vocab, prompts, length)
    # warm-up on prompts of their own: the measured requests find the cache cold
    source.warm_up(make_requests(4, seed + 1, vocab, USER, OUTPUT), 4)
    before = read_counters(engine)
    server = watch_server(request, engine)  # the server's own view, until finish
    sent, offered, offsets = source.at_level("open", RATE, reqs, seed)
    counters = engine_counters(before, read_counters(engine))
    account = prefix_cache_account(counters)
    finish(
        cell,
        settings,
        sent.records,
        offered_rate=offered,
        seed=seed,
        server=server,
        extra={
            "engine_counters": counters,
            "prefix_cache": account | {"reusable_share": reusable},
            "shared_prefix": {"prompts": prompts, "length": length, "rate_per_s": RATE},
        }
        | sent.extra,
        samples=traffic_samples(sent.records, offsets),
    )
