"""Pooling requests without vLLM: the HTTP payloads and answers of /v1/embeddings,
/v1/score and /v1/rerank, the openai engine's ``pool`` and the pooling driver against a
loopback test double of vLLM's pooling server (``PoolingDouble``), the adapters'
pooling options, and the embeddings workload end to end on that double.

The real thing (vLLM CPU in process and behind a harness-started server) is
tests/test_vllm_pooling.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from engines import openai_pooling
from engines.openai_http import OpenAIEngine
from engines.openai_stream import RequestFailed
from engines.vllm import VllmEngine
from engines.vllm_server import setting_flags
from harness.engine import EngineConfig, EngineError, PoolingRequest, PoolingResult
from harness.load.clock import MonotonicClock
from harness.load.pooldriver import PoolDriver, PoolOutcome, PoolTrace, summarize_pooling
from harness.results.records import Status
from tests.support.fault_server import serve_app
from tests.support.runner import run_workloads
from workloads.lib import embedding

MODEL = "pooling-double"
FAIL = "FAIL"
"""An input holding this word is answered 500 by the double."""


class PoolingDouble:
    """A test double of vLLM's pooling server: its answers' shapes, deterministic values
    (a vector of ``dims`` per input, a score per input from its word count), usage as
    words, and HTTP 500 for a request with an input holding ``FAIL``."""

    def __init__(self, dims: int = 8, service_s: float = 0.002) -> None:
        self.dims, self.service_s = dims, service_s
        self.bodies: list[dict[str, Any]] = []
        self.app = web.Application()
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/version", self.version)
        for path in ("/v1/embeddings", "/v1/score", "/v1/rerank"):
            self.app.router.add_post(path, self.answer)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "pooling-double"})

    async def answer(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        await asyncio.sleep(self.service_s)
        texts = body.get("input") or body.get("text_2") or body.get("documents")
        if any(FAIL in str(t) for t in texts):
            return web.json_response({"error": {"message": "injected"}}, status=500)
        usage = {"prompt_tokens": sum(len(str(t).split()) for t in texts)}
        if request.path == "/v1/embeddings":
            data = [
                {"index": i, "object": "embedding", "embedding": [0.5] * self.dims}
                for i in reversed(range(len(texts)))  # any order: the client sorts by index
            ]
            return web.json_response({"data": data, "usage": usage})
        scores = [1.0 / (1 + len(str(t).split())) for t in texts]
        if request.path == "/v1/score":
            data = [{"index": i, "score": s} for i, s in enumerate(scores)]
            return web.json_response({"data": data, "usage": usage})
        ranked = sorted(range(len(scores)), key=lambda i: -scores[i])
        results = [{"index": i, "relevance_score": scores[i]} for i in ranked]
        return web.json_response({"results": results, "usage": usage})


@pytest.fixture(scope="module")
def double() -> Iterator[tuple[PoolingDouble, str]]:
    server = PoolingDouble()
    with serve_app(server.app) as url:
        yield server, url


def embed(*inputs: str | tuple[int, ...]) -> PoolingRequest:
    return PoolingRequest(inputs=inputs)


# -- requests and payloads ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"inputs": ()}, "at least one input"),
        ({"inputs": ("a", "")}, "input is empty"),
        ({"inputs": ("a",), "kind": "score"}, "need a query"),
        ({"inputs": ("a",), "query": "q"}, "embed requests take none"),
        ({"inputs": ("a",), "kind": "classify", "query": "q"}, "not one of"),
    ],
)
def test_a_pooling_request_says_what_is_wrong_with_it(kwargs: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PoolingRequest(**kwargs)


def test_payloads_are_what_vllms_pooling_apis_take() -> None:
    path, body = openai_pooling.payload(embed("a b", (5, 6, 7)), "m")
    assert path == "/v1/embeddings"
    assert body == {"model": "m", "input": ["a b", [5, 6, 7]], "encoding_format": "float"}
    score = PoolingRequest(inputs=("d1", "d2"), kind="score", query="q")
    assert openai_pooling.payload(score, "m") == (
        "/v1/score",
        {"model": "m", "text_1": "q", "text_2": ["d1", "d2"]},
    )
    rerank = PoolingRequest(inputs=("d1",), kind="rerank", query="q")
    assert openai_pooling.payload(rerank, "m") == (
        "/v1/rerank",
        {"model": "m", "query": "q", "documents": ["d1"]},
    )


def test_token_ids_cannot_be_scored_over_http() -> None:
    request = PoolingRequest(inputs=((5, 6),), kind="rerank", query="q")
    with pytest.raises(EngineError, match="/v1/rerank takes texts"):
        openai_pooling.payload(request, "m")


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


def test_answers_are_read_in_input_order_with_the_servers_token_count() -> None:
    answer = {
        "results": [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.1}]
    }
    rerank = PoolingRequest(inputs=("d0", "d1"), kind="rerank", query="q")
    result = openai_pooling.parse(rerank, 200, _json(answer | {"usage": {"prompt_tokens": 7}}))
    assert result == PoolingResult(n_outputs=2, scores=(0.1, 0.9), prompt_tokens=7)
    vectors = {"data": [{"index": 0, "embedding": [1.0, 0.0, 0.0]}]}  # no usage: not counted
    assert openai_pooling.parse(embed("x"), 200, _json(vectors)) == PoolingResult(1, dims=3)


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (500, b'{"error": "boom"}', "HTTP 500: .*boom"),
        (200, b"<html>", "not JSON"),
        (200, b"[]", "not a JSON object"),
        (200, _json({"object": "list"}), "no 'data' list"),
        (200, _json({"data": [{"index": 0, "embedding": [1.0]}]}), "1 'data' items for 2"),
        (200, _json({"data": [{"index": 0, "embedding": [1.0]}, {"index": 1}]}), "no 'embedding'"),
        (
            200,
            _json({"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1, 2]}]}),
            "not float lists of one length",
        ),
    ],
)
def test_a_wrong_answer_fails_the_request_saying_why(
    status: int, body: bytes, message: str
) -> None:
    with pytest.raises(RequestFailed, match=message):
        openai_pooling.parse(embed("a", "b"), status, body)


# -- the openai engine and the driver on the double ------------------------------------------


def _engine(url: str) -> OpenAIEngine:
    engine = OpenAIEngine(EngineConfig(model=Path("none"), options={"base_url": url}))
    engine.load()
    return engine


def test_the_openai_engine_pools_over_http(double: tuple[PoolingDouble, str]) -> None:
    server, url = double
    engine = _engine(url)
    try:
        got = asyncio.run(engine.pool(embed("one two", "three")))
        scored = asyncio.run(engine.pool(PoolingRequest(("a b c", "d"), "score", "q")))
    finally:
        engine.close()
    assert got == PoolingResult(n_outputs=2, dims=8, prompt_tokens=3)
    assert scored.scores == (0.25, 0.5)
    assert server.bodies[-1]["model"] == MODEL


def test_the_driver_counts_inputs_tokens_and_failures(double: tuple[PoolingDouble, str]) -> None:
    _, url = double
    engine = _engine(url)
    requests = [embed(f"w{i} x y", "z") for i in range(9)] + [embed("a", f"{FAIL} b")]
    driver = PoolDriver(engine, MonotonicClock(), timeout_s=5.0)
    try:
        closed = asyncio.run(driver.closed_loop(requests, 3))
        offsets = np.linspace(0.0, 0.2, len(requests))
        opened = asyncio.run(driver.open_loop(requests, offsets))
    finally:
        engine.close()
    for run in (closed, opened):
        summary = summarize_pooling(run, None if run is closed else 50.0)
        m = summary.metrics
        assert m["requests"] == {"total": 10, "ok": 9, "failed": 1, "met_slo": 9}
        assert list(m["errors"].values()) == [1]
        assert "HTTP 500" in next(iter(m["errors"]))
        assert m["pooling"]["inputs_completed"] == 18
        assert m["pooling"]["prompt_tokens"] == 9 * 4
        assert m["pooling"]["dims"] == [8]
        window = summary.evidence.window_s
        assert m["throughput"]["inputs_per_s"] == pytest.approx(18 / window)
        assert m["throughput"]["tokens_per_s"] == pytest.approx(36 / window)
        assert summary.samples["inputs"] == [2.0] * 9
    assert summarize_pooling(closed, None).evidence.offered_rate is None
    assert len(opened.serve_trace().lag) == 10  # the open loop's own lateness, per request


def test_a_closed_loop_with_a_window_cycles_its_requests(double: tuple[PoolingDouble, str]) -> None:
    _, url = double
    engine = _engine(url)
    driver = PoolDriver(engine, MonotonicClock(), timeout_s=5.0)
    try:
        run = asyncio.run(driver.closed_loop([embed("a"), embed("b")], 2, 0.05, min_requests=7))
    finally:
        engine.close()
    assert len(run.outcomes) >= 7
    assert {r.inputs for r in run.requests} == {("a",), ("b",)}
    assert all(o.result is not None for o in run.outcomes)


class _Miscounting:
    """An engine test double that answers one output too few."""

    async def pool(self, request: PoolingRequest) -> PoolingResult:
        return PoolingResult(n_outputs=max(1, len(request.inputs) - 1))


def test_an_answer_missing_outputs_is_a_failed_request() -> None:
    driver = PoolDriver(_Miscounting(), MonotonicClock(), timeout_s=1.0)  # type: ignore[arg-type]
    run = asyncio.run(driver.closed_loop([embed("a", "b")], 1))
    (outcome,) = run.outcomes
    assert outcome.result is None
    assert outcome.error == "the engine returned 1 outputs for 2 inputs"


def test_a_trace_needs_an_outcome_per_request() -> None:
    with pytest.raises(ValueError, match="one outcome per request"):
        PoolTrace((embed("a"),), (PoolOutcome(0.0, 0.0, 1.0, None), PoolOutcome(0, 0, 1, None)))


# -- options, inputs --------------------------------------------------------------------------


def test_the_pooling_runner_reaches_vllm_in_process_and_served() -> None:
    pooled = VllmEngine(EngineConfig(model=Path("m"), options={"runner": "pooling"}))
    assert pooled.engine_args()["runner"] == "pooling"
    assert "runner" not in VllmEngine(EngineConfig(model=Path("m"))).engine_args()
    with pytest.raises(ValueError, match="runner"):
        VllmEngine.validate_options({"runner": "embed"})
    assert setting_flags({"runner": "pooling"})[-2:] == ["--runner", "pooling"]
    assert "--runner" not in setting_flags({"runner": "generate"})
    OpenAIEngine.validate_options({"runner": "pooling"})
    with pytest.raises(ValueError, match="runner sets the server the harness starts"):
        OpenAIEngine.validate_options({"runner": "pooling", "base_url": "http://h:1"})


def test_requests_draw_seeded_inputs_and_queries() -> None:
    texts = embedding.Texts(("t0", "t1", "t2"), {"name": embedding.DEFAULT_NAME})
    first = texts.requests("rerank", 4, 5, seed=3)
    assert first == texts.requests("rerank", 4, 5, seed=3)
    assert [len(r.inputs) for r in first] == [5] * 4
    assert all(r.query and r.kind == "rerank" for r in first)
    assert all(not r.query for r in texts.requests("embed", 2, 1, seed=3))


# -- the workload end to end ------------------------------------------------------------------


@pytest.mark.slow
def test_the_workload_runs_on_a_pooling_server_and_skips_elsewhere(
    tmp_path: Path, double: tuple[PoolingDouble, str]
) -> None:
    """Through the openai engine on the double (a server the user runs), the closed and
    open loop's cells on the user's texts (``--dataset``) are ok and hold what the reports
    need; on null-gen, which serves no pooling, every cell skips saying so."""
    _, url = double
    texts = [f"passage {i} about item {i % 7} " * (1 + i % 4) for i in range(30)]
    dataset = tmp_path / "texts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    run = run_workloads(
        tmp_path,
        f"--dataset={dataset}",
        "--engine=openai,null-gen",
        f"--engine-opt=openai.base_url={url}",
        "--requests=100",  # the fewest with a p99
        "-k",
        "test_embeddings and (embed-16-inputs-closed-4 or rerank-1-input-open-16)",
    )
    assert run.returncode == 0, run.stdout[-4000:]
    by_engine: dict[str, list[Any]] = {}
    for record in run.records.values():
        by_engine.setdefault(record.engine, []).append(record)
    assert {r.status for r in by_engine["null-gen"]} == {Status.SKIPPED}
    assert by_engine["null-gen"][0].reasons[0].startswith("null-gen lacks capability pooling=")
    for record in by_engine["openai"]:
        assert record.status is Status.OK, record.reasons
        m = record.metrics
        assert m["requests"]["failed"] == 0
        assert m["throughput"]["inputs_per_s"] > 0
        assert m["throughput"]["tokens_per_s"] > 0
        assert record.report_spec is not None
        assert record.report_spec.throughput.metric == "throughput.inputs_per_s"
        assert len(record.samples["e2e"]) == m["requests"]["ok"]
        assert (m["dataset"]["format"], m["dataset"]["usable"]) == ("jsonl", 30)
        assert str(record.params["dataset"]).startswith("texts-")
        assert any(t.startswith(m["example"]["first_input"]) for t in texts)
