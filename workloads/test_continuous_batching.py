"""Continuous (iteration-level) batching vs a static-batching baseline, same engine.

One seeded open-loop request stream (Poisson arrivals, output lengths that vary) is
served two ways through the same engine: ``continuous`` sends every request when it is
due and lets the engine batch at each iteration; ``static`` admits requests in groups of
``max_num_seqs``: a group starts when it is full and the previous group has finished,
so short requests wait for the longest one. Across ``max_num_seqs`` (an engine setting:
each value is its own engine instance).
"""

from __future__ import annotations

import asyncio

import pytest

from engines import transformers_server
from engines.vllm_server import SERVER_DEFAULTS
from harness.api import Cell, Driver, MonotonicClock, OpenEngine, OpenLoop, ReportSpec, RunSettings
from workloads.lib import reporting
from workloads.lib.generative import (
    engine_counters,
    finish,
    make_requests,
    model_dir,
    open_generative,
    read_counters,
    vocab_size,
)

PROMPT = (64, 16, 256)
OUTPUT = (32, 4, 128)  # wide spread: what static batching pays for
RATE = 8.0  # about half of what one 2-core CPU serves: load, not overload
GRID = [("continuous", 16), ("static", 16), ("continuous", 4), ("static", 4)]

# The offered stream is fixed; the batching mode and max_num_seqs are what is chosen.
REPORT = ReportSpec(
    throughput=reporting.REQUESTS,
    tokens=reporting.TOKENS,
    timing_floor=reporting.LAG_P99,
    latencies=reporting.STREAMED,
    plots=(reporting.TTFT_CDF, reporting.E2E_CDF),
)


@pytest.mark.requires(family="generative", native_batching="continuous")
@pytest.mark.report_spec(REPORT)
@pytest.mark.engine_setting("max_num_seqs")
@pytest.mark.parametrize(("mode", "max_num_seqs"), GRID, ids=[f"{m}-seqs{s}" for m, s in GRID])
def test_continuous_batching(
    request: pytest.FixtureRequest,
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    aio: asyncio.Runner,
    mode: str,
    max_num_seqs: int,
) -> None:
    if cell.engine == "openai":
        _skip_unless_served(harness_settings, cell, max_num_seqs)
    options = {"max_num_seqs": str(max_num_seqs)}
    model = model_dir(harness_settings)
    engine = open_generative(request, open_engine, cell, model, options)
    seed = harness_settings.seed + 2000
    n = harness_settings.profile.gen_requests
    reqs = make_requests(n, seed, vocab_size(model), PROMPT, OUTPUT)
    offsets = OpenLoop(rate=RATE, duration=n / RATE).schedule(seed)[:n]
    reqs = reqs[: len(offsets)]
    driver = Driver(engine, MonotonicClock(), harness_settings.reliability.request_timeout_s)
    # warm-up as wide as a batch: also opens the client connections a burst will need
    warm = make_requests(max_num_seqs, seed + 1, vocab_size(model), PROMPT, OUTPUT)
    aio.run(driver.closed_loop(warm, max_num_seqs))
    before = read_counters(engine)
    if mode == "continuous":
        records = aio.run(driver.open_loop(reqs, offsets))
    else:
        records = aio.run(driver.static_batches(reqs, offsets, max_num_seqs))
    counters = engine_counters(before, read_counters(engine))
    finish(
        cell,
        harness_settings,
        records,
        offered_rate=len(offsets) / (n / RATE),
        seed=seed,
        extra={
            "batching": {"mode": mode, "max_num_seqs": max_num_seqs, "rate": RATE},
            "engine_counters": counters,
        },
    )


def _skip_unless_served(settings: RunSettings, cell: Cell, max_num_seqs: int) -> None:
    """Through a server, max_num_seqs is the server's setting: one server serves the
    run's cells, so only the cells of its value run (``--engine-grid
    openai.max_num_seqs=4,16`` starts a server for each)."""
    fixed = settings.options_for("openai", cell.params)
    if fixed.get("server") == "transformers" and "base_url" not in fixed:
        pytest.skip(transformers_server.CANNOT_SET["max_num_seqs"])
    served = int(fixed.get("max_num_seqs", SERVER_DEFAULTS["max_num_seqs"]))
    if served != max_num_seqs:
        pytest.skip(
            f"max_num_seqs is a server setting; this run's harness-started server uses"
            f" {served} (--engine-grid openai.max_num_seqs=... starts one per value)"
        )
