"""The user's traffic: TTFT, TPOT, E2E and goodput on the user's dataset.

The requests are the prompts or conversations of ``--dataset FILE`` (ShareGPT JSON, JSONL
with ``prompt`` or ``messages``, json/csv/parquet through Hugging Face ``datasets``) or,
without it, the generated synthetic conversations (workloads/lib/datasets.py): text and chat
go through the model's tokenizer and chat template in process, or to ``/v1/completions``
and ``/v1/chat/completions`` over HTTP. Reply lengths follow ``--output-mode``: fixed
(``ignore_eos``), the dataset's reference lengths, or natural end of sequence capped by
``--output-cap``; the mode is a cell parameter, so the matrix shows it.

Closed loop at two concurrencies and open loop (Poisson) at one rate, as the streaming
workload does, seeded sampling of the dataset (with replacement when the dataset is
smaller than the run), and the traffic actually carried kept per request (input, asked
and output tokens, inter-arrival times) for the report's traffic plots.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from harness.api import Cell, OpenEngine, ReportSpec, RunSettings, settings_of
from workloads.lib import datasets, reporting
from workloads.lib.generative import (
    engine_counters,
    finish,
    load_source,
    read_counters,
    traffic_samples,
    watch_server,
)
from workloads.lib.prompts import (
    engine_context,
    input_counter,
    server_model,
    traffic_label,
    user_dataset,
)

LOADS = [("closed", 1.0), ("closed", 4.0), ("open", 4.0)]

REPORT = ReportSpec(
    throughput=reporting.REQUESTS,
    tokens=reporting.TOKENS,
    scenario=("dataset", "load", "level", "output"),
    timing_floor=reporting.LAG_P99,
    latencies=reporting.STREAMED,
    plots=(reporting.TTFT_CDF, reporting.E2E_CDF, *reporting.TRAFFIC_PLOTS),
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The dataset and the reply-length mode are parameters of the cell: its id and the
    matrix show them, and cells of another dataset are never compared or ranked with it."""
    if "output" in metafunc.fixturenames:
        traffic = settings_of(metafunc.config).traffic
        label = traffic_label(traffic.dataset, datasets.DEFAULT_NAME)
        metafunc.parametrize(
            ("dataset", "output"),
            [(label, traffic.output_mode)],
            ids=[f"{label}-output-{traffic.output_mode}"],
        )


@pytest.mark.requires(family="generative", streaming=True)
@pytest.mark.report_spec(REPORT)
@pytest.mark.parametrize(("load", "level"), LOADS, ids=[f"{a}-{b:g}" for a, b in LOADS])
def test_dataset(
    request: pytest.FixtureRequest,
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    aio: asyncio.Runner,
    load: str,
    level: float,
    dataset: str,
    output: str,
) -> None:
    settings = harness_settings
    model = server_model(settings, cell.engine)
    engine, source = load_source(request, open_engine, cell, model, aio)
    counter = input_counter(model)
    source.driver = replace(source.driver, count_input=counter)
    data = user_dataset(settings, counter, engine_context(engine, model))
    seed = settings.seed + 3000
    n = settings.profile.gen_requests
    reqs, used = data.requests(n, seed, settings.traffic)
    warm, _ = data.requests(4, seed + 1, settings.traffic)
    source.warm_up(warm, 4)
    before = read_counters(engine)
    server = watch_server(request, engine)  # the server's own view, until finish
    sent, offered, offsets = source.at_level(load, level, reqs, seed)
    counters = engine_counters(before, read_counters(engine))
    finish(
        cell,
        settings,
        sent.records,
        offered_rate=offered,
        seed=seed,
        server=server,
        extra={"engine_counters": counters, "dataset": used} | sent.extra,
        samples=traffic_samples(sent.records, offsets),
    )
