"""Run directories with every kind of record a report draws, built from seeded numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np

from harness.metrics import stats
from harness.results import store
from harness.results.records import (
    CellRecord,
    Headline,
    Manifest,
    PlannedCell,
    Status,
    ValidityInfo,
)
from harness.results.reportspec import CdfPlot, Rate, ReportSpec

MACHINE = {
    "cpu": {"model": "Test CPU 9000", "logical_cores": 8, "affinity": 8},
    "memory_bytes": 32 * 2**30,
    "packages": {"numpy": "2.0"},
    "git": {"commit": "abc", "dirty": False},
    "hostname": "box",
}
OTHER_MACHINE = {**MACHINE, "cpu": {"model": "Other CPU 1", "logical_cores": 4, "affinity": 4}}

LATENCY = (
    Headline(label="p50", metric="e2e.p50", unit="ms", scale=1e3, ci="e2e.ci95.p50"),
    Headline(label="p99", metric="e2e.p99", unit="ms", scale=1e3),
    Headline(label="tput", metric="throughput.requests_per_s", unit="req/s"),
)


def _latency_metrics(samples: np.ndarray[Any, Any], window_s: float) -> dict[str, Any]:
    summary = stats.to_json(stats.summarize(samples))
    return {"e2e": summary, "throughput": {"requests_per_s": samples.size / window_s}}


def _telemetry(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    t = [round(0.5 * i, 3) for i in range(9)]
    return {
        "interval_s": 0.5,
        "series": {
            "t": t,
            "rss_bytes": [float(2**27 + 2**20 * i) for i in range(9)],
            "cpu_user_pct": [round(float(x), 2) for x in rng.uniform(50, 90, 8)],
            "cpu_system_pct": [round(float(x), 2) for x in rng.uniform(1, 9, 8)],
        },
        "summary": {"cpu_user_pct_mean": 70.0},
    }


def _record(engine: str, cell: str, workload: str, params: dict[str, Any], **f: Any) -> CellRecord:
    fields: dict[str, Any] = {
        "run_id": f.pop("run_id"),
        "cell_id": cell,
        "workload": workload,
        "engine": engine,
        "params": params,
        "status": Status.OK,
        "started_at": f.pop("started_at", "2026-01-01T00:00:00.000Z"),
        "finished_at": "2026-01-01T00:00:05.000Z",
        "duration_s": 5.0,
        "engine_info": {"engine": engine, "version": "1.0-test"},
        "environment": f.pop("environment"),
        "validity": ValidityInfo(verdict="valid", warnings=tuple(f.pop("warnings", ()))),
    }
    fields.update(f)
    return CellRecord(**fields)


def batching(  # noqa: PLR0917  (a test builder: every argument varies)
    engine: str, run_id: str, env: dict[str, Any], rate: float, mode: str, scale: float
) -> CellRecord:
    rng = np.random.default_rng(int(rate) + len(mode) + len(engine))
    samples = rng.lognormal(np.log(0.002 * scale), 0.3, 400)
    sizes = {"1": 10, "4": 30, "8": 60} if mode != "none" else {"1": 100}
    cell = f"batching.{engine}.rate={rate:g}.mode={mode}"
    return _record(
        engine,
        cell,
        "batching",
        {"rate": rate, "mode": mode},
        run_id=run_id,
        environment=env,
        metrics=_latency_metrics(samples, 400 / rate),
        samples={"e2e": stats.as_samples(samples)},
        histograms={"batch_size": sizes},
        telemetry=_telemetry(int(rate)),
        headline=LATENCY,
        started_at=f"2026-01-01T00:00:{int(rate) % 60:02d}.000Z",
    )


def sweep(engine: str, run_id: str, env: dict[str, Any], scale: float) -> CellRecord:
    points = [
        {"load": load, "throughput": load * 0.99, "latency_p99_s": 0.001 * scale * (1 + i**2)}
        for i, load in enumerate((100.0, 200.0, 400.0, 800.0))
    ]
    metrics = {"sweep": {"points": points}, "knee": {"load": 400.0, "throughput": 396.0}}
    return _record(
        engine,
        f"rate_sweep.{engine}",
        "rate_sweep",
        {},
        run_id=run_id,
        environment=env,
        metrics=metrics,
        headline=(Headline(label="knee", metric="knee.load", unit="req/s"),),
    )


def capacity(engine: str, run_id: str, env: dict[str, Any]) -> CellRecord:
    points = [{"load": 100.0, "throughput": 99.0, "latency_p99_s": 0.004}]
    return _record(
        engine,
        f"capacity.{engine}.objective=e2e_p99=10ms",
        "capacity",
        {"objective": "e2e_p99=10ms"},
        run_id=run_id,
        environment=env,
        metrics={
            "objective": "e2e_p99=10ms",
            "search": {"points": points},
            "capacity": {"load": 100.0},
        },
        headline=(Headline(label="capacity", metric="capacity.load", unit="req/s"),),
    )


def server_view(rng: np.random.Generator, n: int) -> dict[str, Any]:
    """``metrics.server`` of a 30 s cell: scrapes every 0.25 s from before its first
    request, a queue that builds up and drains, and each request's scheduled time."""
    t = [round(-0.25 + 0.25 * i, 4) for i in range(124)]
    load = [max(0.0, 8 * np.sin(np.pi * x / 30)) for x in t]
    return {
        "series": {
            "t": t,
            "requests_running": [float(min(4, round(x))) for x in load],
            "requests_waiting": [float(max(0, round(x) - 4)) for x in load],
            "kv_cache_usage": [round(0.05 * min(4, x), 4) for x in load],
        },
        "scheduled": [round(float(x), 4) for x in np.sort(rng.uniform(0, 30, n))],
        "scrapes": len(t),
        "failed": 0,
        "client_vs_server": {"gap": {"ttft_s": 0.0012, "e2e_s": 0.0015}},
    }


def streaming(engine: str, run_id: str, env: dict[str, Any], server: bool = False) -> CellRecord:
    """``server``: with the server's view over time (``metrics.server``)."""
    rng = np.random.default_rng(7)
    ttft = rng.lognormal(np.log(0.05), 0.4, 120)
    e2e = ttft + rng.uniform(0.2, 0.4, 120)
    metrics = {
        "ttft": stats.to_json(stats.summarize(ttft)),
        "e2e": stats.to_json(stats.summarize(e2e)),
    }
    if server:
        metrics["server"] = server_view(rng, 120)
    return _record(
        engine,
        f"streaming.{engine}.concurrency=4",
        "streaming",
        {"concurrency": 4},
        run_id=run_id,
        environment=env,
        metrics=metrics,
        samples={"ttft": stats.as_samples(ttft), "e2e": stats.as_samples(e2e)},
        headline=(Headline(label="ttft p99", metric="ttft.p99", unit="ms", scale=1e3),),
        warnings=("run-to-run spread of p99 is 31 %",),
    )


def preprocessing(engine: str, run_id: str, env: dict[str, Any], backend: str) -> CellRecord:
    times = {"decode": 0.004, "resize": 0.001, "normalize": 0.0005}
    if backend == "opencv":
        times = {k: v * 0.7 for k, v in times.items()}
    return _record(
        engine,
        f"preprocessing.{engine}.backend={backend}",
        "preprocessing",
        {"backend": backend},
        run_id=run_id,
        environment=env,
        metrics={"stage_times": {k: {"per_image_s": v} for k, v in times.items()}},
        headline=(
            Headline(label="decode", metric="stage_times.decode.per_image_s", unit="ms", scale=1e3),
        ),
    )


def not_ok(engine: str, run_id: str, env: dict[str, Any], status: Status) -> CellRecord:
    cell = f"batching.{engine}.rate=50.mode=none"
    return CellRecord(
        run_id=run_id,
        cell_id=cell,
        workload="batching",
        engine=engine,
        params={"rate": 50.0, "mode": "none"},
        status=status,
        reasons=(f"{engine} <b>exploded</b> | badly",),
        started_at="2026-01-01T00:00:00.000Z",
        finished_at="2026-01-01T00:00:01.000Z",
        duration_s=1.0,
        environment=env,
    )


def write_run(
    root: Path,
    engine: str,
    *,
    env: dict[str, Any] = MACHINE,
    scale: float = 1.0,
    created_at: str = "2026-01-01T00:00:00.000Z",
    planned_extra: tuple[str, ...] = (),
) -> Path:
    """One complete run of ``engine`` with a record of every kind; ``scale`` multiplies its
    latencies; ``planned_extra`` cell ids are planned but never recorded."""
    run = store.new_run_dir(root)
    rid = run.name
    records = [
        batching(engine, rid, env, 100.0, "none", scale),
        batching(engine, rid, env, 100.0, "dynamic", scale),
        batching(engine, rid, env, 800.0, "dynamic", scale),
        not_ok(engine, rid, env, Status.FAILED),
        sweep(engine, rid, env, scale),
        capacity(engine, rid, env),
        streaming(engine, rid, env, server=True),
        preprocessing(engine, rid, env, "pil"),
        preprocessing(engine, rid, env, "opencv"),
    ]
    planned = [planned_of(r) for r in records] + [
        PlannedCell(
            cell_id=c, workload="batching", engine=engine, params={"rate": 1.0}, nodeid=f"w::{c}"
        )
        for c in planned_extra
    ]
    state: Literal["complete", "incomplete"] = "incomplete" if planned_extra else "complete"
    store.write_manifest(
        run,
        Manifest(
            run_id=rid,
            state=state,
            created_at=created_at,
            finished_at=created_at,
            command=("pytest", "workloads", f"--engine={engine}"),
            settings={"engines": [engine], "profile": "quick"},
            environment=env,
            planned=tuple(planned),
        ),
    )
    for r in records:
        store.write_record(run, r)
    return run


def planned_of(record: CellRecord, spec: ReportSpec | None = None) -> PlannedCell:
    """The planned cell a manifest lists for ``record`` (``spec``: its declaration)."""
    return PlannedCell(
        cell_id=record.cell_id,
        workload=record.workload,
        engine=record.engine,
        params=record.params,
        nodeid=f"w::{record.cell_id}",
        report_spec=spec,
    )


# -- a grid of engine configurations, for the Decision ------------------------------------

GRID_SPEC = ReportSpec(
    throughput=Rate(
        metric="throughput.requests_per_s",
        unit="req/s",
        counts="requests",
        ci="throughput.requests_per_s_ci95",
        completed="requests.ok",
    ),
    tokens="throughput.output_tokens_per_s",
    scenario=("load", "level"),
    plots=(CdfPlot(samples="ttft", what="TTFT"),),
)
"""What the streaming workload declares: goodput is recounted from its samples."""
GRID_SLOS = {"ttft_p99": 0.2, "e2e_p99": 2.0}
"""The SLO the grid run was measured with (``--slo ttft_p99=200ms,e2e_p99=2s``)."""
GRID = (
    # engine, config, requests in the 10 s window, TTFT s, E2E s, metrics.energy
    ("vllm", "max_num_seqs=4", 100, 0.05, 0.5, None),
    ("vllm", "max_num_seqs=16", 120, 0.08, 0.9, {"per_output_token_j": 0.25}),
    ("sglang", "default", 110, 0.1, 0.7, {"absent": "no GPU power reading: NVML not found"}),
    ("tgi", "default", 130, 0.3, 1.0, None),
)
"""Goodput under the SLO (req/s) and p99s (ms), and what the Decision makes of them:

vllm max_num_seqs=16  12  TTFT 80   E2E 900   recommended; Pareto on TTFT and E2E
sglang default        11  TTFT 100  E2E 700   runner-up (8.33 % lower); beaten on TTFT
vllm max_num_seqs=4   10  TTFT 50   E2E 500   Pareto on TTFT and E2E
tgi default            0  TTFT 300  E2E 1000  misses ttft p99 by 50 %; beaten on both
"""


def grid_record(  # noqa: PLR0917  (a test builder: one argument per column of GRID)
    engine: str,
    config: str,
    run_id: str,
    requests: int,
    ttft: float,
    e2e: float,
    energy: dict[str, Any] | None,
) -> CellRecord:
    """A streaming cell of one engine configuration at 8 req/s open loop: every request
    with the same TTFT and E2E, 20 output tokens each, in a 10 s window."""
    window = 10.0
    ttfts, e2es = [ttft] * requests, [e2e] * requests
    tpots = [(e2e - ttft) / 19] * requests
    metrics: dict[str, Any] = {
        name: stats.to_json(stats.summarize(np.array(values)))
        for name, values in (("ttft", ttfts), ("tpot", tpots), ("e2e", e2es))
    }
    metrics["throughput"] = {
        "requests_per_s": requests / window,
        "requests_per_s_ci95": list(stats.rate_ci(requests, window)),
        "output_tokens_per_s": 20 * requests / window,
    }
    metrics["requests"] = {"total": requests, "ok": requests, "failed": 0}
    if energy is not None:
        metrics["energy"] = energy
    params = {"load": "open", "level": 8.0, "config": config}
    return _record(
        engine,
        f"streaming.{engine}.load=open.level=8.config={config}",
        "streaming",
        params,
        run_id=run_id,
        environment=MACHINE,
        metrics=metrics,
        samples={"ttft": ttfts, "tpot": tpots, "e2e": e2es},
        window={"duration_s": window, "requests": requests},
        headline=(Headline(label="ttft p99", metric="ttft.p99", unit="ms", scale=1e3),),
        report_spec=GRID_SPEC,
    )


def write_grid_run(root: Path, slos: dict[str, float] | None = GRID_SLOS) -> Path:
    """One run of ``GRID``'s engine configurations, its manifest holding ``slos`` as the
    SLO it was measured with (None: none)."""
    run = store.new_run_dir(root)
    records = [grid_record(*row[:2], run.name, *row[2:]) for row in GRID]
    planned = tuple(planned_of(r, GRID_SPEC) for r in records)
    settings: dict[str, Any] = {"engines": ["vllm", "sglang", "tgi"], "profile": "quick"}
    if slos is not None:
        settings["slos"] = slos
    store.write_manifest(
        run,
        Manifest(
            run_id=run.name,
            state="complete",
            created_at="2026-01-01T00:00:00.000Z",
            finished_at="2026-01-01T00:00:00.000Z",
            command=("pytest", "workloads", "--engine-grid", "vllm.max_num_seqs=4,16"),
            settings=settings,
            environment=MACHINE,
            planned=planned,
        ),
    )
    for r in records:
        store.write_record(run, r)
    return run
