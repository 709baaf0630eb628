"""Batching in front of a tensor engine: none vs static vs dynamic at the same offered load.

Open loop: Poisson arrivals at ``rate`` requests/s, one item per request, latency from
each request's scheduled arrival (a busy engine or a waiting batch counts against the
system). ``static`` waits until ``batch`` requests are queued; ``dynamic`` closes a batch
at ``batch`` requests or after ``delay_ms``, whichever comes first.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from harness.api import (
    Cell,
    Headline,
    HistogramPlot,
    MonotonicClock,
    OpenEngine,
    OpenLoop,
    PolicyCurvePlot,
    ProfileName,
    ReportSpec,
    RunSettings,
    settings_of,
    stats,
)
from workloads.lib import inputs, reporting
from workloads.lib.load import timed_batch
from workloads.lib.loadgen import (
    BatchPolicy,
    DynamicBatching,
    NoBatching,
    StaticBatching,
    serve_open_loop,
    summarize_trace,
)
from workloads.lib.usermodel import open_model

DISTINCT_INPUTS = 64
MODEL = "tiny-cnn"

# (rate req/s, mode, batch, delay_ms). Low and high load: at low load a static batch
# waits to fill; at high load running requests one by one queues up.
GRIDS: dict[ProfileName, list[tuple[float, str, int, float | None]]] = {
    ProfileName.QUICK: [
        (r, m, b, d)
        for r in (100.0, 3500.0)
        for m, b, d in (("none", 1, None), ("static", 8, None), ("dynamic", 8, 2.0))
    ],
    ProfileName.FULL: [
        (r, m, b, d)
        for r in (100.0, 500.0, 1000.0, 2000.0, 3000.0)
        for m, b, d in (
            ("none", 1, None),
            *(("static", b, None) for b in (4, 8, 16)),
            *(("dynamic", b, d) for b in (4, 8, 16) for d in (1.0, 5.0)),
        )
    ],
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function.__name__ == "test_batching":
        settings = settings_of(metafunc.config)
        grid = GRIDS[settings.profile.name]
        ids = [
            f"rate{r:g}-{m}-b{b}" + (f"-d{d:g}ms" if d is not None else "") for r, m, b, d in grid
        ]
        metafunc.parametrize(("rate", "mode", "batch", "delay_ms"), grid, ids=ids)


def make_policy(mode: str, batch: int, delay_ms: float | None) -> BatchPolicy:
    if mode == "none":
        return NoBatching()
    if mode == "static":
        return StaticBatching(batch)
    if mode == "dynamic" and delay_ms is not None:
        return DynamicBatching(batch, delay_ms / 1e3)
    raise ValueError(f"unknown batching mode {mode!r} (delay_ms={delay_ms})")


REPORT = ReportSpec(
    throughput=reporting.REQUESTS,
    scenario=("rate",),  # the offered load is given; the batching policy is chosen
    timing_floor=reporting.LAG_P99,
    latencies=reporting.SERVED,
    plots=(
        PolicyCurvePlot(
            over="rate",
            per="policy",
            caption="One line per batching policy; each point one offered rate of the"
            " batching grid.",
        ),
        reporting.E2E_CDF,
        HistogramPlot(
            histogram="batch_size",
            name="batch-sizes",
            section="Batch sizes",
            title="batch-size histograms",
            caption="Share of dispatched batches of each size: a static batch waits to fill,"
            " a dynamic one closes early at low load.",
            xlabel="batch size",
            ylabel="share of batches",
        ),
    ),
)


@pytest.mark.requires(family="tensor")
@pytest.mark.report_spec(REPORT)
def test_batching(
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    rate: float,
    mode: str,
    batch: int,
    delay_ms: float | None,
) -> None:
    seed = harness_settings.seed
    policy = make_policy(mode, batch, delay_ms)
    served = range(1, policy.max_batch + 1)  # static flushes a partial last batch
    engine = open_model(open_engine, cell, harness_settings, MODEL, batches=served)
    specs = engine.input_specs()
    rng = np.random.default_rng(seed)
    pool = [inputs.synthesize(specs, harness_settings.dims, rng) for _ in range(DISTINCT_INPUTS)]
    for size in sorted({1, policy.max_batch}):
        engine.warmup(inputs.collate(pool[:size]), harness_settings.profile.warmup_iterations)

    clock = MonotonicClock()

    def run_batch(indices: Any) -> dict[str, float]:
        return timed_batch(engine, pool, indices, clock)

    load = OpenLoop(rate=rate, duration=harness_settings.profile.window_s)
    offsets = load.schedule(seed)
    timeout = harness_settings.reliability.request_timeout_s
    trace = serve_open_loop(offsets, policy, run_batch, clock, timeout)
    # The seeded Poisson schedule realizes a rate near, not at, the nominal one; the
    # system is judged against the load it was actually offered.
    offered = offsets.size / load.duration
    summary = summarize_trace(trace, offered, harness_settings.slos)
    batch_latency = np.asarray(trace.batch_latency)
    batch_infer = np.asarray(trace.batch_infer)
    batch_infer = batch_infer[np.isfinite(batch_infer)]  # failed batches have no infer time
    sizes = np.asarray(trace.batch_sizes)
    metrics = summary.metrics | {
        # per batch: `latency` from dispatch to done (collate + infer), `infer` the engine alone
        "latency": stats.to_json(stats.summarize(batch_latency)),
        "infer": stats.to_json(stats.summarize(batch_infer)),
        "item_latency": stats.to_json(stats.summarize(batch_latency / np.maximum(sizes, 1))),
        "load": {
            "offered_rate": rate,
            "scheduled_requests": int(offsets.size),
            "scheduled_rate": offered,
        },
        "batches": {
            "count": int(sizes.size),
            "mean_size": float(sizes.mean()) if sizes.size else 0.0,
            "flushed_partial": trace.flushed_batches,
        },
    }
    cell.finish(
        metrics=metrics,
        evidence=summary.evidence,
        headline=[
            Headline(label="p50", metric="e2e.p50", unit="ms", scale=1e3, ci="e2e.ci95.p50"),
            Headline(label="p99", metric="e2e.p99", unit="ms", scale=1e3, ci="e2e.ci95.p99"),
            Headline(label="queue p50", metric="queue.p50", unit="ms", scale=1e3),
            Headline(label="tput", metric="throughput.requests_per_s", unit="req/s"),
            Headline(label="batch", metric="batches.mean_size", unit="avg"),
        ],
        samples=summary.samples
        | {
            "batch_latency": stats.as_samples(batch_latency),
            "batch_infer": stats.as_samples(batch_infer),
        },
        histograms={"batch_size": stats.histogram(trace.batch_sizes)},
        window={
            "duration_s": trace.window,
            "requests": int(offsets.size),
            "warmup_iterations": harness_settings.profile.warmup_iterations,
        },
        seeds={"arrivals": seed, "inputs": seed, "model": seed},
        slow=summary.slow,
    )
    assert trace.batch_sizes, "no batch ran"
    assert max(trace.batch_sizes) <= policy.max_batch
