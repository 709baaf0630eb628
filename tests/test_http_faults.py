"""HTTP failures are failed requests: the real streaming workload against a faulty server.

The server (tests/fault_server.py) answers a seeded share of requests with 429s, 500s,
connection resets, truncated streams, in-band error events or a slow first byte, and
keeps a tally; the cell's record must account for every one of them.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys

import pytest

from harness.results.records import Status
from harness.session.outcome import RunExit
from tests.support.fault_server import Plan, fault_server
from tests.support.runner import run_workloads

pytestmark = pytest.mark.slow

REQUESTS = 150
WARMUP = 4  # the streaming workload's warm-up requests come first and are kept clean
BREAKING = ("429", "500", "reset", "truncate", "error")


@pytest.fixture
def model(tmp_path):
    """All the workload needs of a model when the server is given: its vocabulary size."""
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"vocab_size": 512}))
    return path


def streaming_cell(tmp_path, model, plan):
    with fault_server(plan) as url:
        run = run_workloads(
            tmp_path,
            "--engine=openai",
            f"--engine-opt=openai.base_url={url}",
            f"--model={model}",
            f"--requests={REQUESTS}",
            "-k",
            "test_streaming and closed and 4",
        )
    [record] = run.records.values()
    return run, record


def test_every_injected_http_fault_is_a_counted_failure(tmp_path, model):
    shares = {"429": 0.06, "500": 0.04, "reset": 0.04, "truncate": 0.04, "error": 0.04}
    plan = Plan(shares={**shares, "slow": 0.05}, seed=3, clean_first=WARMUP)
    run, rec = streaming_cell(tmp_path, model, plan)
    injected = sum(plan.tally[f] for f in BREAKING)
    assert injected >= 15, plan.tally
    assert rec.status is Status.INVALID
    assert any(r.startswith("error rate") and "ceiling 1.00%" in r for r in rec.reasons)
    assert rec.metrics["requests"]["total"] == REQUESTS
    assert rec.metrics["requests"]["failed"] == injected
    errors = rec.metrics["errors"]

    def count(*needles):
        return sum(n for k, n in errors.items() if any(s in k for s in needles))

    assert count("HTTP 429") == plan.tally["429"]
    assert count("HTTP 500") == plan.tally["500"]
    assert count("ended without [DONE]") == plan.tally["truncate"]
    assert count("server error event: injected engine error") == plan.tally["error"]
    assert count("ReadError", "RemoteProtocolError", "reset") == plan.tally["reset"]
    assert sum(errors.values()) == injected
    # failed requests are infinite latencies in the error-adjusted percentiles, never met
    # an SLO, and are not in the plain percentiles at all
    assert rec.metric("e2e.adjusted.p99") == math.inf
    assert rec.metric("e2e.count") == REQUESTS - injected
    assert rec.metrics["requests"]["met_slo"] == REQUESTS - injected
    # an invalid cell is a verdict, not a failed run; the run says so with its own status
    assert run.returncode == RunExit.INVALID, run.stdout[-3000:]


def test_a_slow_first_byte_is_latency_not_failure(tmp_path, model):
    plan = Plan(shares={"slow": 0.1}, seed=5, slow_s=0.25, clean_first=WARMUP)
    _, rec = streaming_cell(tmp_path, model, plan)
    assert plan.tally["slow"] >= 5
    assert rec.metrics["requests"]["failed"] == 0
    assert rec.metric("ttft.max") >= 0.25
    assert rec.metric("ttft.p50") < 0.25
    slow = [t for t in rec.samples["ttft"] if t >= 0.25]
    assert len(slow) == plan.tally["slow"]


def test_a_server_that_is_not_there_is_named_in_the_first_cell(tmp_path, model):
    """The first cell carries the real reason; the later ones refer back to it."""
    with socket.socket() as probe:  # a loopback port that nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    run = run_workloads(
        tmp_path,
        "--engine=openai",
        f"--engine-opt=openai.base_url={url}",
        f"--model={model}",
        "-k",
        "test_streaming",
    )
    first = run.records["streaming.openai.load=closed.level=1"]
    assert first.status is Status.FAILED
    assert f"OpenAI endpoint {url} not usable" in first.reasons[0]
    assert "Connection refused" in first.reasons[0]
    assert "earlier cell" not in first.reasons[0]
    later = run.records["streaming.openai.load=closed.level=4"]
    assert "engine failed to load for an earlier cell: OpenAI endpoint" in later.reasons[0]


PASSWORD = "pw-never-shown-4711"


def test_credentials_in_the_server_url_appear_nowhere(tmp_path, model):
    """Not in the manifest, records, worker log, matrix, HTML report or on the terminal."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://admin:{PASSWORD}@127.0.0.1:{port}/?api_key=Qk3y"
    run = run_workloads(
        tmp_path,
        "--engine=openai",
        f"--engine-opt=openai.base_url={base}",
        f"--model={model}",
        "-k",
        "test_streaming and closed",
    )
    [first, _] = sorted(run.records.values(), key=lambda r: r.cell_id)
    assert "Connection refused" in first.reasons[0]
    assert "http://[REDACTED]@127.0.0.1" in first.reasons[0]
    report = subprocess.run(
        [sys.executable, "-m", "harness", "report", str(run.run_dir), "--html"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert (run.run_dir / "report.html").is_file()
    written = [p for p in run.run_dir.rglob("*") if p.is_file()]
    assert {"manifest.json", "matrix.md", "matrix.csv", "report.html"} <= {p.name for p in written}
    assert any(p.suffix == ".log" for p in written)
    for text in [*(p.read_text(errors="replace") for p in written), run.stdout, report.stdout]:
        assert PASSWORD not in text
        assert "api_key=Qk3y" not in text
