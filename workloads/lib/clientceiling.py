"""The load generator's own ceiling, known before it matters.

One client process can only send and read so many streams a second; past that its own
lag, not the server, sets the latencies. Before the first open-loop cell of an HTTP
engine (an engine that is a client of a server: ``openai``) in a process, this measures
what one client process sustains on this machine against the harness's no-op streaming
server (harness.load.noopserver: a server that costs almost nothing, so what is measured
is the client): open-loop steps at rising rates (``LADDER``, ``STEP_S`` each), streaming
``TOKENS`` tokens per request, and the ceiling is the highest rate whose step met the
profile's own bounds (generator lag p99, the rate sent, 95 % completed, no failures).

A cell offered more than ``SHARE`` of the ceiling gets a validity warning naming both;
``--clients auto`` runs as many client processes as keep each under ``SHARE`` of it.
The measurement is kept per process (the cells of one engine run in one worker).
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import (
    Driver,
    EngineConfig,
    GenerationRequest,
    MonotonicClock,
    OpenLoop,
    RunSettings,
    registry,
    stats,
)
from harness.load import noopserver
from harness.load.clients import is_network_client
from harness.metrics.validity import Policy

LADDER = (100.0, 200.0, 400.0, 800.0, 1600.0, 3200.0, 6400.0, 12800.0)
"""Up to past one client process's ceiling on this project's machines (about 10,000 streamed
requests/s of 16 tokens on one core: docs/measurements.md, "The streaming client")."""
STEP_S = 1.0
TOKENS = 16
WARMUP = 64
SHARE = 0.5
"""Of the ceiling a client process may be offered: at half of it the client's lag is still
its quiet-machine lag; nearer, the client's scheduling starts to show in the latencies."""


@dataclass(frozen=True)
class Ceiling:
    rate_per_s: float
    """The highest request rate one client process sustained (0: not even the first step)."""
    steps: tuple[dict[str, float], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "rate_per_s": self.rate_per_s,
            "tokens_per_request": TOKENS,
            "step_s": STEP_S,
            "share": SHARE,
            "steps": list(self.steps),
        }


_MEASURED: dict[tuple[str, tuple[tuple[str, str], ...]], Ceiling] = {}


def ceiling(engine: str, settings: RunSettings, aio: asyncio.Runner) -> Ceiling | None:
    """What one client process of ``engine`` sustains here; None for an engine that is
    not a client of a server (its load generator is not a separate bottleneck)."""
    if not is_network_client(registry.load(engine)):
        return None
    options = {k: v for k, v in settings.engine_options.get(engine, {}).items() if k != "base_url"}
    key = (engine, tuple(sorted(options.items())))
    if key not in _MEASURED:
        _MEASURED[key] = measure(engine, options, settings.profile.policy, aio)
    return _MEASURED[key]


def measure(
    engine: str, options: Mapping[str, str], policy: Policy, aio: asyncio.Runner
) -> Ceiling:
    """The ladder against a no-op server of our own (no model: the adapter asks the
    server which it serves, as for a user's server without ``--model``)."""
    port = noopserver.free_port()
    servers = noopserver.start(port, processes=1)
    try:
        config = EngineConfig(
            model=Path(os.devnull), options={**options, "base_url": f"http://127.0.0.1:{port}"}
        )
        client = registry.load(engine)(config)
        client.load()
        try:
            steps = aio.run(_ladder(Driver(client, MonotonicClock(), 30.0), policy))  # type: ignore[arg-type]
        finally:
            client.close()
    finally:
        for s in servers:
            s.terminate()
    passed = [s["rate_per_s"] for s in steps if s["ok"]]
    return Ceiling(max(passed, default=0.0), tuple(steps))


async def _ladder(driver: Driver, policy: Policy) -> list[dict[str, float]]:
    # a cold client (its first connections, imports, caches) lags tens of ms on its first
    # requests: measured here 81 ms p99 at 100 req/s cold, not its steady ceiling
    warm = [
        GenerationRequest(prompt=(5, 6, 7, 8), max_tokens=TOKENS, request_id=f"w{i}")
        for i in range(WARMUP)
    ]
    await driver.closed_loop(warm, 8)
    out: list[dict[str, float]] = []
    for rate in LADDER:
        step = await _step(driver, rate, policy)
        out.append(step)
        if not step["ok"]:
            break  # past the ceiling: higher rates only cost time
    return out


async def _step(driver: Driver, rate: float, policy: Policy) -> dict[str, float]:
    offsets = OpenLoop(rate=rate, duration=STEP_S).schedule(int(rate))
    requests = [
        GenerationRequest(prompt=(5, 6, 7, i % 100 + 8), max_tokens=TOKENS, request_id=f"c{i}")
        for i in range(offsets.size)
    ]
    records = await driver.open_loop(requests, offsets)
    ok = [r for r in records if r.ok]
    lag = stats.conservative([r.lag for r in records], 99.0) or 0.0
    window = max(r.t_end for r in records) - min(r.t_sched for r in records)
    achieved = len(ok) / window if window > 0 else 0.0
    passed = (
        len(ok) == len(records)
        and lag <= policy.max_lag_p99_s
        and achieved >= 0.95 * offsets.size / STEP_S
    )
    return {
        "rate_per_s": rate,
        "lag_p99_s": round(lag, 6),
        "achieved_per_s": round(achieved, 3),
        "ok": float(passed),
    }


def clients_for(offered: float, found: Ceiling) -> int:
    """Client processes that keep each under ``SHARE`` of the ceiling (at most one per
    core: more would only share cores)."""
    if found.rate_per_s <= 0:
        return os.cpu_count() or 1
    need = math.ceil(offered / (SHARE * found.rate_per_s))
    return int(np.clip(need, 1, os.cpu_count() or 1))


def warning(offered: float, clients: int, found: Ceiling) -> str | None:
    """A validity warning when the client processes were offered more than they sustain
    quietly."""
    each = offered / clients
    if each <= SHARE * found.rate_per_s:
        return None
    return (
        f"client near its ceiling: each of {clients} client process(es) was offered"
        f" {each:.4g} req/s, over {SHARE:.0%} of the {found.rate_per_s:g} req/s one client"
        " process sustains here (measured against a no-op server); use --clients N or"
        " --clients auto"
    )
