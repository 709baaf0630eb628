"""How fast is the harness itself? Three benchmarks against engines that do no work.

* ``inprocess``: the highest open-loop (Poisson) rate the in-process serving loop
  sustains on one core against the ``null`` engine: completed/offered >= 0.99 and p99
  of both the wake-up lag and the dispatch delay (scheduled to sent) under 1 ms. Found
  by the harness's own capacity search, so every probed rate is listed.
* ``overhead``: added latency per request, harness vs a direct call, with the ``null``
  engine at a fixed service time (0 and 1 ms).
* ``http``: the highest streamed request rate one client process (the ``openai``
  adapter, httpx + SSE) sustains against a no-op streaming server on loopback, and the
  total with more client processes.

    python -m benchmarks.harness_bench all --out /tmp/harness-bench.json

Prints a Markdown summary; the JSON holds every point and the machine's fingerprint.
Run it on an idle machine: it measures the harness, and anything else running counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from harness import registry, stats
from harness.batching import NoBatching, serve_open_loop
from harness.capacity import Point, SearchPolicy, capacity_search
from harness.clock import MonotonicClock
from harness.engine import EngineConfig, GenerationRequest, TensorEngine
from harness.environment import fingerprint
from harness.genload import Driver
from harness.loadgen import Arrivals, OpenLoop

CPUS = sorted(os.sched_getaffinity(0))  # before any benchmark pins this process
MAX_LAG_S = 0.001
HTTP_MAX_LAG_S = 0.002  # the full profile's bound for every cell; asyncio timers are ms-grained
MIN_RATIO = 0.99
X = {"x": np.zeros((1, 4), dtype=np.float32)}


def _null(service_time_s: float = 0.0) -> TensorEngine:
    engine = registry.load("null")(
        EngineConfig(model=Path("-"), options={"service_time_s": str(service_time_s)})
    )
    engine.load()
    assert isinstance(engine, TensorEngine)
    return engine


def _pin(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def _p(values: Any, p: float) -> float | None:
    arr = np.asarray(values, dtype=np.float64)
    return stats.nearest_rank(arr, p) if arr.size else None


def _point(
    rate: float,
    achieved: float,
    lag_p99: float | None,
    delay_p99: float | None,
    max_lag_s: float = MAX_LAG_S,
    **extra: Any,
) -> Point:
    ratio = achieved / rate
    reasons = []
    if ratio < MIN_RATIO:
        reasons.append(f"completed {ratio:.3f} of offered < {MIN_RATIO}")
    for name, value in (("lag", lag_p99), ("dispatch delay", delay_p99)):
        if value is not None and value >= max_lag_s:
            reasons.append(f"{name} p99 {value * 1e3:.3g} ms >= {max_lag_s * 1e3:g} ms")
    return Point(
        load=rate,
        valid=not reasons,
        reasons=tuple(reasons),
        throughput=achieved,
        error_rate=0.0,
        latency_p99_s=delay_p99,
        offered=rate,
        metrics={"ratio": ratio, "lag_p99_s": lag_p99, "dispatch_p99_s": delay_p99, **extra},
    )


def _progress(label: str) -> Callable[[Point], None]:
    def show(p: Point) -> None:
        verdict = "ok" if p.passes else "no: " + "; ".join(p.reasons)
        print(
            f"  {label} {p.load:>9.0f}/s  achieved {p.throughput:>9.0f}/s  {verdict}",
            file=sys.stderr,
        )

    return show


def inprocess(duration_s: float = 2.0, cpu: int | None = 0) -> dict[str, Any]:
    _pin(cpu)
    engine, clock = _null(), MonotonicClock()

    def run_batch(indices: Any) -> dict[str, float]:
        t0 = clock.now()
        engine.infer(X)
        return {"infer": clock.now() - t0}

    show = _progress("in-process")

    def measure(rate: float) -> Point:
        offsets = OpenLoop(rate=rate, duration=duration_s).schedule(int(rate))
        trace = serve_open_loop(offsets, NoBatching(), run_batch, clock)
        offered = offsets.size / duration_s
        achieved = offsets.size / trace.window
        point = _point(
            offered,
            achieved,
            stats.conservative(trace.lag, 99.0),
            _p(trace.t_send - trace.t_sched, 99.0),
            requests=int(offsets.size),
            nominal_rate=rate,
        )
        show(point)
        return point

    result = capacity_search(
        measure, SearchPolicy(start=10_000, floor=1_000, ceiling=1_000_000, tolerance=0.05)
    )
    return {
        "criterion": f"completed/offered >= {MIN_RATIO}, lag and dispatch p99 < 1 ms",
        "pinned_cpu": cpu,
        "max_rate": result.capacity.load if result.capacity else None,
        "search": result.to_json(),
    }


def _call(engine: TensorEngine) -> Callable[[Any], float]:
    def run_batch(indices: Any) -> float:
        engine.infer(X)
        return 0.0

    return run_batch


def overhead(
    n: int = 400, rounds: int = 7, rate: float = 200.0, cpu: int | None = 0
) -> dict[str, Any]:
    """Added latency per request: the harness's e2e (due to done) minus a direct call's,
    both paced the same (evenly spaced at a low rate, so nothing queues and both pay
    the same idle-CPU wake-up): what remains is the harness's own work. Direct and
    harness runs alternate for ``rounds`` rounds; the median difference is reported
    with its range, since a shared machine drifts between rounds."""
    _pin(cpu)
    out: dict[str, Any] = {}
    clock = MonotonicClock()
    offsets = OpenLoop(rate=rate, duration=n / rate, arrivals=Arrivals.CONSTANT).schedule(1)
    for service in (0.0, 0.001):
        engine = _null(service)
        diffs: dict[str, list[float]] = {}
        for _ in range(rounds):
            direct = _direct(engine, offsets, clock)
            trace = serve_open_loop(offsets, NoBatching(), _call(engine), clock)
            harness = {"e2e": trace.t_done - trace.t_sched, "call": trace.t_done - trace.t_send}
            for k in ("e2e", "call"):
                for p in (50.0, 99.0):
                    d, h = _p(direct[k], p), _p(harness[k], p)
                    diffs.setdefault(f"{k}_p{p:g}", []).append(((h or 0.0) - (d or 0.0)) * 1e6)
        row: dict[str, Any] = {"requests_per_round": n, "rounds": rounds, "rate": rate}
        for key, values in diffs.items():
            row[f"added_{key}_us"] = float(np.median(values))
            row[f"added_{key}_us_range"] = [min(values), max(values)]
        out[f"service_{service * 1e3:g}ms"] = row
        print(f"  overhead, service {service * 1e3:g} ms: {row}", file=sys.stderr)
    return out


def _direct(engine: TensorEngine, offsets: Any, clock: MonotonicClock) -> dict[str, Any]:
    start = clock.now()
    e2e, call = np.empty(offsets.size), np.empty(offsets.size)
    for i, offset in enumerate(offsets.tolist()):
        due = start + offset
        clock.sleep_until(due)
        t0 = clock.now()
        engine.infer(X)
        done = clock.now()
        e2e[i], call[i] = done - due, done - t0
    return {"e2e": e2e, "call": call}


def _http_client(
    url: str, rate: float, duration_s: float, cpu: int | None, seed: int
) -> dict[str, Any]:
    """One client process: open-loop streamed requests at ``rate`` for ``duration_s``."""
    _pin(cpu)
    engine = registry.load("openai")(
        EngineConfig(model=Path("-"), options={"base_url": url, "timeout_s": "30"})
    )
    engine.load()
    try:
        offsets = OpenLoop(rate=rate, duration=duration_s).schedule(seed)
        reqs = [
            GenerationRequest(prompt=(5, 6, i), max_tokens=4, request_id=f"b{i}")
            for i in range(offsets.size)
        ]
        driver = Driver(engine, MonotonicClock(), 30.0)  # type: ignore[arg-type]
        records = asyncio.run(_warm_then(driver, reqs, offsets))
    finally:
        engine.close()  # its loop is gone with asyncio.run; _warm_then closed the session
    ok = [r for r in records if r.ok]
    window = max(r.t_end for r in records) - min(r.t_sched for r in records)
    return {
        "offered": offsets.size / duration_s,
        "achieved": len(ok) / window,
        "requests": len(records),
        "failed": len(records) - len(ok),
        "lag_p99_s": _p([r.lag for r in records], 99.0),
        "ttft_p50_s": _p([r.t_first - r.t_sched for r in ok], 50.0),
    }


async def _warm_then(driver: Driver, reqs: list[GenerationRequest], offsets: Any) -> Any:
    warm = [GenerationRequest(prompt=(1,), max_tokens=4, request_id=f"w{i}") for i in range(64)]
    await driver.closed_loop(warm, 32)  # opens the connection pool before the schedule
    try:
        return await driver.open_loop(reqs, offsets)
    finally:
        await driver.engine.aclose()  # type: ignore[attr-defined]


def _clients(
    url: str, rate: float, k: int, duration_s: float, cpus: list[int]
) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(k) as pool:
        jobs = [
            pool.apply_async(_http_client, (url, rate, duration_s, cpus[i % len(cpus)], i))
            for i in range(k)
        ]
        return [j.get(timeout=duration_s * 10 + 60) for j in jobs]


def http(duration_s: float = 3.0, processes: tuple[int, ...] = (1, 2, 4)) -> dict[str, Any]:
    """For 1, 2, ... client processes: the highest total rate they sustain together, the
    rate split evenly, every process held to the same bounds (found by capacity search)."""
    from benchmarks import noop_server  # noqa: PLC0415

    server_cpus, client_cpus = CPUS[:1], CPUS[1:] or CPUS
    port = noop_server.free_port()
    servers = noop_server.start(port, processes=1, cpus=server_cpus)
    url = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {
        "cpus": len(CPUS),
        "server_cpus": server_cpus,
        "client_cpus": client_cpus,
        "criterion": f"every client: completed/offered >= {MIN_RATIO}, no failures,"
        f" lag p99 < {HTTP_MAX_LAG_S * 1e3:g} ms",
        "clients": [],
    }
    try:
        for k in processes:
            if k + 1 > len(CPUS):
                # two clients on one core preempt each other for whole timeslices: their lag
                # measures the scheduler, not the harness
                why = f"needs {k + 1} cores (one per client process, one for the server)"
                out["clients"].append(
                    {"processes": k, "skipped": f"{why}; this machine has {len(CPUS)}"}
                )
                continue
            show = _progress(f"http x{k}")

            def measure(total: float, k: int = k, show: Callable[[Point], None] = show) -> Point:
                res = _clients(url, total / k, k, duration_s, client_cpus)
                point = _client_point(res)
                show(point)
                return point

            search = capacity_search(
                measure, SearchPolicy(start=1000 * k, floor=100, ceiling=100_000, tolerance=0.1)
            )
            best = search.capacity.load if search.capacity else None
            out["clients"].append(
                {
                    "processes": k,
                    "max_total_rate": best,
                    "per_process": best / k if best else None,
                    "search": search.to_json(),
                }
            )
    finally:
        for s in servers:
            s.terminate()
    return out


def _client_point(res: list[dict[str, Any]]) -> Point:
    offered = sum(r["offered"] for r in res)
    achieved = sum(r["achieved"] for r in res)
    lag = max((r["lag_p99_s"] or 0.0) for r in res)
    point = _point(offered, achieved, lag, None, HTTP_MAX_LAG_S, clients=res)
    failed = sum(r["failed"] for r in res)
    if not failed:
        return point
    reasons = (*point.reasons, f"{failed} requests failed")
    total = sum(r["requests"] for r in res)
    return Point(offered, False, reasons, achieved, failed / total, lag)


def main() -> None:
    parser = argparse.ArgumentParser(description="benchmark the harness itself")
    parser.add_argument(
        "which", choices=["inprocess", "overhead", "http", "all"], nargs="?", default="all"
    )
    parser.add_argument("--out", type=Path, default=None, help="write every point here as JSON")
    args = parser.parse_args()
    doc: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.harness_bench", *sys.argv[1:]])
    }
    doc["environment"] = fingerprint()
    if args.which in ("inprocess", "all"):
        doc["inprocess"] = inprocess()
    if args.which in ("overhead", "all"):
        doc["overhead"] = overhead()
    if args.which in ("http", "all"):
        doc["http"] = http()
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2, default=str))
    print(summary(doc))


def summary(doc: dict[str, Any]) -> str:
    lines = ["| benchmark | result |", "|---|---|"]
    if "inprocess" in doc:
        rate = doc["inprocess"]["max_rate"] or 0.0
        lines.append(f"| in-process open loop, one core | {rate:.0f} req/s sustained |")
    for key, row in doc.get("overhead", {}).items():
        lo, hi = row["added_e2e_p50_us_range"]
        lines.append(
            f"| added latency, {key} | p50 {row['added_e2e_p50_us']:+.1f} us"
            f" (rounds {lo:+.1f} to {hi:+.1f}), p99 {row['added_e2e_p99_us']:+.1f} us,"
            " harness vs direct call, from the due time |"
        )
    for row in doc.get("http", {}).get("clients", []):
        k = row["processes"]
        if "skipped" in row:
            lines.append(
                f"| HTTP streamed, {k} client processes | not measured: {row['skipped']} |"
            )
            continue
        total = row["max_total_rate"] or 0.0
        lines.append(
            f"| HTTP streamed, {k} client process{'es' if k > 1 else ''}"
            f" | {total:.0f} req/s sustained in all ({total / k:.0f} per process) |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
