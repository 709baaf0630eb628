"""Reasoning models: time to the first token of any kind and to the first answer token,
and the reasoning/answer token split, from hand-made records, parsed SSE and the driver
on a loopback server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pickle
from pathlib import Path

import pytest
from aiohttp import web

from engines.openai_http import OpenAIEngine, StreamState
from harness.engine import Chunk, EngineConfig, GenerationRequest, Message
from harness.load.clients import shifted
from harness.load.clock import MonotonicClock
from harness.load.streamdriver import Driver
from harness.metrics.streamtiming import RequestRecord, StreamMetrics
from tests.support.fault_server import serve_app

httpx = pytest.importorskip("httpx")

PLAIN_SAMPLES = ["ttft", "ttft_send", "tpot", "itl", "icl", "e2e", "service", "queue"]


def rec(times, tokens, reasoning=(), *, t_sched=0.0, t_send=0.0, error=None):
    return RequestRecord(
        t_sched=t_sched,
        t_send=t_send,
        t_end=times[-1] if times else t_send,
        chunk_times=tuple(times),
        chunk_tokens=tuple(tokens),
        chunk_reasoning=tuple(reasoning),
        n_in=10,
        n_asked=8,
        error=error,
    )


# a role chunk, reasoning (1 + 2 tokens), a chunk that ends the reasoning and starts the
# answer (1 + 1), the answer (1), the usage-only chunk
THINKER = rec(
    [0.05, 0.10, 0.12, 0.14, 0.20, 0.22],
    [0, 1, 2, 2, 1, 0],
    [0, 1, 2, 1, 0, 0],
    t_send=0.01,
)
PLAIN = rec([1.05, 1.10], [1, 1], t_sched=1.0, t_send=1.0)
NO_ANSWER = rec([2.10, 2.20], [1, 1], [1, 1], t_sched=2.0, t_send=2.0)  # cut off thinking
FAILED = rec([], [], t_sched=3.0, t_send=3.0, error="HTTP 500: overloaded")


def test_record_times_the_first_token_of_any_kind_and_the_first_answer_token():
    assert (THINKER.n_counted, THINKER.n_reasoning, THINKER.n_answer) == (6, 4, 2)
    assert THINKER.has_reasoning
    assert THINKER.t_first == 0.10
    assert THINKER.ttft == pytest.approx(0.10)
    assert THINKER.t_first_answer == 0.14  # the chunk where the answer starts
    assert THINKER.ttft_answer == pytest.approx(0.14)
    # every token is either: tpot and itl still run over all of them
    assert THINKER.tpot == pytest.approx((0.20 - 0.10) / 5)


def test_without_reasoning_the_answer_starts_at_the_first_token():
    assert (PLAIN.n_reasoning, PLAIN.n_answer, PLAIN.has_reasoning) == (0, 2, False)
    assert PLAIN.t_first_answer == PLAIN.t_first == 1.05
    assert PLAIN.ttft_answer == PLAIN.ttft == pytest.approx(0.05)


def test_a_stream_that_never_reaches_its_answer_has_no_answer_time():
    assert (NO_ANSWER.n_reasoning, NO_ANSWER.n_answer) == (2, 0)
    assert NO_ANSWER.t_first_answer is None
    assert NO_ANSWER.ttft_answer is None
    assert NO_ANSWER.ttft == pytest.approx(0.10)


def test_samples_and_metrics_of_a_cell_with_reasoning():
    m = StreamMetrics([THINKER, PLAIN, NO_ANSWER, FAILED])
    s = m.samples()
    assert list(s) == ["ttft", "ttft_send", "ttft_answer", *PLAIN_SAMPLES[2:]]
    assert s["ttft"] == pytest.approx([0.10, 0.05, 0.10])  # every kind of token
    # the request without reasoning answers at its first token; the one that never
    # answered has no sample
    assert s["ttft_answer"] == pytest.approx([0.14, 0.05])
    out = m.to_json()
    answer = out["ttft_answer"]
    assert (answer["count"], answer["failed"]) == (2, 2)  # the failed and the unanswered
    assert (answer["min"], answer["max"]) == pytest.approx((0.05, 0.14))
    assert answer["mean"] == pytest.approx(0.095)
    assert out["ttft"]["failed"] == 1
    assert out["reasoning"] == {
        "requests": 2,
        "without_answer": 1,
        "reasoning_tokens": 6,
        "answer_tokens": 4,
        "reasoning_share": pytest.approx(0.6),
    }
    assert out["tokens"]["output"] == 10  # reasoning counts as output


def test_a_cell_without_reasoning_keeps_its_record_as_it_was():
    m = StreamMetrics([PLAIN, FAILED])
    assert list(m.samples()) == PLAIN_SAMPLES
    out = m.to_json()
    assert "reasoning" not in out
    assert "ttft_answer" not in out


def test_reasoning_counts_are_checked():
    with pytest.raises(ValueError, match="one reasoning token count per chunk"):
        rec([0.1, 0.2], [1, 1], [1])
    with pytest.raises(ValueError, match="between 0 and its tokens"):
        rec([0.1], [1], [2])
    with pytest.raises(ValueError, match="between 0 and n_tokens"):
        Chunk(n_tokens=1, reasoning_tokens=2)
    assert Chunk(3).reasoning_tokens == 0  # every existing call keeps its meaning


def test_the_split_survives_the_trip_between_client_processes():
    moved = shifted(THINKER, 5.0)
    assert moved.chunk_reasoning == THINKER.chunk_reasoning
    assert moved.ttft_answer == pytest.approx(THINKER.ttft_answer)
    assert pickle.loads(pickle.dumps(THINKER)) == THINKER


def feed_all(state: StreamState, *events: dict) -> list[Chunk]:
    chunks = [state.feed(json.dumps(e)) for e in events]
    state.feed("[DONE]")
    state.close()
    return [c for c in chunks if c is not None]


def delta_event(delta: dict, usage: dict | None = None, finish: str | None = None) -> dict:
    event: dict = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        event["usage"] = usage
    return event


def running(n: int, reasoning: int | None = None) -> dict:
    usage: dict = {"prompt_tokens": 12, "completion_tokens": n}
    if reasoning is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return usage


def test_vllm_reasoning_deltas_with_running_usage():
    # vLLM 0.32 (delta.reasoning, continuous usage, a parser that does not count): a
    # token whose text is empty belongs to the part under way
    chunks = feed_all(
        StreamState("chat"),
        delta_event({"role": "assistant", "content": ""}, running(0)),
        delta_event({"reasoning": "Let"}, running(1)),
        delta_event({"reasoning": " me"}, running(2)),
        delta_event({"content": ""}, running(3)),
        delta_event({"content": " Bado"}, running(4)),
        delta_event({"content": " kefi"}, running(5), "stop"),
        {"choices": [], "usage": running(5)},
    )
    assert [c.n_tokens for c in chunks] == [0, 1, 1, 1, 1, 1, 0]
    assert [c.reasoning_tokens for c in chunks] == [0, 1, 1, 1, 0, 0, 0]
    assert "".join(c.text for c in chunks) == " Bado kefi"  # the answer alone


def test_reasoning_content_without_running_usage_counts_each_kind_once():
    # older vLLM, SGLang, DeepSeek: delta.reasoning_content; no usage until the end
    state = StreamState("chat")
    chunks = feed_all(
        state,
        delta_event({"reasoning_content": "Hmm."}),
        delta_event({"reasoning_content": " Done.", "content": "Yes"}),
        delta_event({"content": "."}, finish="stop"),
    )
    assert [(c.n_tokens, c.reasoning_tokens) for c in chunks] == [(1, 1), (2, 1), (1, 0)]
    assert state.text == "Hmm. Done.Yes."  # re-tokenized whole, reasoning included


def test_a_chunk_with_both_parts_is_split_by_length():
    chunks = feed_all(
        StreamState("chat"),
        delta_event({"reasoning": "abcdef", "content": "xy"}, running(4)),
        delta_event({"reasoning": "a", "content": "b"}, running(5)),
    )
    assert [(c.n_tokens, c.reasoning_tokens) for c in chunks] == [(4, 3), (1, 0)]


def test_the_servers_running_reasoning_count_wins():
    # vLLM with a parser that counts: completion_tokens_details.reasoning_tokens
    chunks = feed_all(
        StreamState("chat"),
        delta_event({"role": "assistant", "content": ""}, running(0, 0)),
        delta_event({"reasoning": "Let me"}, running(2, 2)),
        delta_event({"reasoning": " see", "content": "No"}, running(5, 4)),
        delta_event({"content": "."}, running(6, 4), "stop"),
        {"choices": [], "usage": running(6, 4)},
    )
    assert [(c.n_tokens, c.reasoning_tokens) for c in chunks] == [
        (0, 0),
        (2, 2),
        (3, 2),
        (1, 0),
        (0, 0),
    ]


def test_completions_choices_may_carry_reasoning_too():
    chunks = feed_all(
        StreamState("completions"),
        {"choices": [{"index": 0, "text": "", "reasoning_content": "hm"}]},
        {"choices": [{"index": 0, "text": "ok", "finish_reason": "length"}]},
    )
    assert [(c.n_tokens, c.reasoning_tokens, c.text) for c in chunks] == [(1, 1, ""), (1, 0, "ok")]


def test_a_stream_without_reasoning_marks_none():
    chunks = feed_all(
        StreamState("chat"),
        delta_event({"role": "assistant", "content": ""}, running(0, 0)),
        delta_event({"content": "Hi"}, running(1, 0)),
        delta_event({"content": ""}, running(2, 0), "stop"),
    )
    assert [c.reasoning_tokens for c in chunks] == [0, 0, 0]


# served as vLLM 0.32 streams chat with a reasoning parser and continuous usage
REASONING_EVENTS = (
    delta_event({"role": "assistant", "content": ""}, running(0)),
    delta_event({"reasoning": "Bada"}, running(1)),
    delta_event({"reasoning": " kefi?"}, running(2)),
    delta_event({"content": " Lomo"}, running(3)),
    delta_event({"content": "."}, running(4), "stop"),
    {"choices": [], "usage": running(4)},
)
PLAIN_EVENTS = (
    delta_event({"role": "assistant", "content": ""}, running(0)),
    delta_event({"content": " Lomo"}, running(1)),
    delta_event({"content": "."}, running(2), "stop"),
    {"choices": [], "usage": running(2)},
)


def stream_app(events, pace_s: float = 0.0):
    """A loopback server: /v1/models, and every other path streams ``events`` as SSE,
    ``pace_s`` apart."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"data": [{"id": "tiny"}]})
        if request.path == "/version":
            return web.json_response({"version": "test"})
        await request.read()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for event in (*events, "[DONE]"):
            data = event if isinstance(event, str) else json.dumps(event)
            await response.write(f"data: {data}\n\n".encode())
            if pace_s:
                await asyncio.sleep(pace_s)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@pytest.fixture
def serve():
    with contextlib.ExitStack() as stack:
        yield lambda app: stack.enter_context(serve_app(app))


def drive(base_url: str) -> RequestRecord:
    engine = OpenAIEngine(EngineConfig(model=Path("m"), options={"base_url": base_url}))
    engine.load()
    clock = MonotonicClock()
    driver = Driver(engine, clock, 10.0)
    chat = GenerationRequest("", 8, messages=(Message("user", "Bada?"),))

    async def one() -> RequestRecord:
        try:
            return await driver.one(chat, clock.now())
        finally:
            await engine.aclose()

    return asyncio.run(one())


def test_the_driver_records_the_split_of_a_reasoning_stream(serve):
    # paced: each event its own read, so its own chunk ([DONE] alone yields none)
    r = drive(serve(stream_app(REASONING_EVENTS, pace_s=0.02)))
    assert r.error is None
    # role, 2 reasoning, 2 answer, usage-only, the adapter's closing chunk
    assert r.chunk_tokens == (0, 1, 1, 1, 1, 0, 0)
    assert r.chunk_reasoning == (0, 1, 1, 0, 0, 0, 0)
    assert (r.n_out, r.n_reasoning, r.n_answer) == (4, 2, 2)
    assert r.t_first == r.chunk_times[1]
    assert r.t_first_answer == r.chunk_times[3]
    assert r.t_send <= r.t_first <= r.t_first_answer <= r.t_last
    assert r.ttft <= r.ttft_answer
    out = StreamMetrics([r]).to_json()
    assert out["reasoning"] == {
        "requests": 1,
        "without_answer": 0,
        "reasoning_tokens": 2,
        "answer_tokens": 2,
        "reasoning_share": 0.5,
    }


def test_paced_reasoning_comes_strictly_before_the_answer(serve):
    r = drive(serve(stream_app(REASONING_EVENTS, pace_s=0.05)))
    assert r.error is None
    assert r.t_first < r.t_first_answer  # two 50 ms gaps between them on the server
    assert r.ttft < r.ttft_answer < r.t_last - r.t_sched + 1e-9


def test_the_driver_records_no_split_for_a_plain_stream(serve):
    r = drive(serve(stream_app(PLAIN_EVENTS)))
    assert r.error is None
    assert r.chunk_reasoning == ()  # as every record before reasoning was measured
    assert r.ttft_answer == r.ttft
    out = StreamMetrics([r]).to_json()
    assert "reasoning" not in out
    assert "ttft_answer" not in out
