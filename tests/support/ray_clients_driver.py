"""The driver of tests/test_ray_clients.py, run inside the head test host: N clients as
Ray actors share one open-loop schedule against the no-op server; prints the merged run
as JSON (one line, last). With a marker path, it touches that file once every client is
ready, so the test can kill a host in mid-run.

    python -m tests.support.ray_clients_driver RAY_ADDRESS BASE_URL CLIENTS RATE SECONDS [MARKER]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from harness.dist.rayclients import RayActors
from harness.engine import EngineConfig, GenerationRequest
from harness.load.clients import Deadlines, OpenShare, SharedLoad, run_shared
from harness.load.stream_summary import summarize_stream

SEED = 11


class MarkingRayActors(RayActors):
    """RayActors that says (by a file) when every client is ready: a test hook only."""

    marker: Path | None = None

    def _await_ready(self, ray: Any, clients: Any, timeout_s: float) -> Any:
        failed = super()._await_ready(ray, clients, timeout_s)
        if self.marker is not None:
            self.marker.write_text(json.dumps(sorted(failed)))
        return failed


def shared_load(url: str, clients: int, rate: float, seconds: float) -> SharedLoad:
    n = int(rate * seconds)
    offsets = np.cumsum(np.random.default_rng(SEED).exponential(1 / rate, size=n))
    offsets -= offsets[0]
    requests = tuple(
        GenerationRequest(prompt=(3, 1 + i % 7), max_tokens=1 + i % 5, request_id=f"q{i}")
        for i in range(n)
    )
    warmup = tuple(GenerationRequest(prompt=(1,), max_tokens=2) for _ in range(8))
    return SharedLoad(
        engine="openai",
        config=EngineConfig(model=Path("-"), options={"base_url": url, "timeout_s": "10"}),
        requests=requests,
        load=OpenShare(tuple(offsets.tolist())),
        clients=clients,
        clock=RayActors.clock,
        timeout_s=10.0,
        warmup=warmup,
    )


def main() -> None:
    address, url, clients, rate, seconds = sys.argv[1:6]
    launcher = MarkingRayActors(address=address)
    if len(sys.argv) > 6:
        object.__setattr__(launcher, "marker", Path(sys.argv[6]))
    load = shared_load(url, int(clients), float(rate), float(seconds))
    merged = run_shared(load, launcher, Deadlines(ready_s=120.0, run_s=float(seconds) + 30.0))
    offered = len(load.requests) / float(seconds)
    ev = summarize_stream(merged.records, (), offered).evidence
    assert isinstance(load.load, OpenShare)
    start = merged.records[0].t_sched - load.load.offsets[0]
    doc = merged.to_json() | {
        "n": len(merged.records),
        "asked": [r.max_tokens for r in load.requests],
        "n_out": [r.n_out for r in merged.records],
        "ok": [r.ok for r in merged.records],
        "errors": sorted({r.error for r in merged.records if r.error}),
        "sched_error_s": max(
            abs(r.t_sched - start - o)
            for r, o in zip(merged.records, load.load.offsets, strict=True)
        ),
        "lag_p99_s": ev.lag_p99_s,
        "achieved_over_offered": (ev.achieved_rate or 0.0) / offered,
    }
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
