"""The OpenAI-compatible adapter on recorded and malformed SSE streams, served by a
loopback aiohttp server whose answers the tests write as ``httpx.Response`` objects."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest
from aiohttp import web

from engines.openai_http import OPTIONS, OpenAIEngine, RequestFailed, StreamState
from harness.engine import EngineConfig, EngineError, GenerationRequest, Message, counter_delta
from harness.load.clock import MonotonicClock
from harness.load.streamdriver import Driver
from tests.support.fault_server import serve_app

httpx = pytest.importorskip("httpx")


def sse(*events: object, done: bool = True) -> bytes:
    lines = [f"data: {json.dumps(e) if not isinstance(e, str) else e}\n\n" for e in events]
    if done:
        lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


def completion(text: str, completion_tokens: int | None, finish: str | None = None) -> dict:
    event: dict = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if completion_tokens is not None:
        event["usage"] = {"prompt_tokens": 5, "completion_tokens": completion_tokens}
    return event


# A stream recorded from vLLM 0.32 (ids and timestamps trimmed), running usage on:
# note the chunk whose text is empty but which carries a token.
RECORDED = sse(
    completion(" nobiso", 1),
    completion("esine", 2),
    completion("", 3),
    completion("firo", 4),
    completion(" goke", 5, "length"),
    {"choices": [], "usage": {"prompt_tokens": 5, "total_tokens": 10, "completion_tokens": 5}},
)


def test_recorded_stream_counts_tokens_from_running_usage():
    state = StreamState("completions")
    chunks = []
    for block in RECORDED.decode().split("\n\n"):
        if block.startswith("data: "):
            chunk = state.feed(block.removeprefix("data: "))
            if chunk is not None:
                chunks.append(chunk)
    state.close()
    assert [c.n_tokens for c in chunks] == [1, 1, 1, 1, 1, 0]
    assert chunks[2].text == ""  # a token with empty text still counts
    assert chunks[-1].completion_tokens == 5
    assert chunks[4].finish_reason == "length"
    assert state.running_usage


def test_multi_token_chunks_are_counted_by_usage_difference():
    state = StreamState("completions")
    a = state.feed(json.dumps(completion("ab", 2)))
    b = state.feed(json.dumps(completion("cde", 5)))
    assert (a.n_tokens, b.n_tokens) == (2, 3)


def test_without_running_usage_each_text_chunk_counts_once():
    state = StreamState("chat")
    role = state.feed(
        json.dumps({"choices": [{"delta": {"role": "assistant"}, "finish_reason": None}]})
    )
    tok = state.feed(json.dumps({"choices": [{"delta": {"content": "hi"}, "finish_reason": None}]}))
    assert (role.n_tokens, tok.n_tokens) == (0, 1)
    assert not state.running_usage


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            '{"error": {"message": "KV cache exhausted", "code": 500}}',
            "server error event: KV cache exhausted",
        ),
        ('{"choices": [{"text": "x"', "malformed SSE data"),
        ("[1, 2]", "unexpected SSE payload"),
    ],
)
def test_malformed_and_error_events_fail_the_request(data, message):
    with pytest.raises(RequestFailed, match=message):
        StreamState("completions").feed(data)


def test_truncated_stream_fails_on_close():
    state = StreamState("completions")
    state.feed(json.dumps(completion("a", 1)))
    with pytest.raises(RequestFailed, match="stream truncated"):
        state.close()


def canned_app(handler):
    """Every request goes to ``handler(httpx.Request) -> httpx.Response``."""

    async def any_route(request: web.Request) -> web.Response:
        seen = httpx.Request(
            request.method,
            str(request.url),
            headers=dict(request.headers),
            content=await request.read(),
        )
        answer = handler(seen)
        content_type = answer.headers.get("content-type", "application/json")
        return web.Response(
            status=answer.status_code, body=answer.content, content_type=content_type.split(";")[0]
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", any_route)
    return app


@pytest.fixture
def serve():
    """``serve(handler)`` -> the base URL of a loopback server answering with it."""
    with contextlib.ExitStack() as stack:
        yield lambda handler: stack.enter_context(serve_app(canned_app(handler)))


def engine_for(serve, handler, **options):
    engine = OpenAIEngine(
        EngineConfig(model=Path("m"), options={"base_url": serve(handler), **options})
    )
    engine.load()
    return engine


def server(stream_body: bytes, status: int = 200, seen: list | None = None):
    def handler(request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        if request.url.path == "/version":
            return httpx.Response(200, json={"version": "test"})
        if seen is not None:
            seen.append(request)
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "overloaded"}})
        return httpx.Response(
            200, content=stream_body, headers={"content-type": "text/event-stream"}
        )

    return handler


async def collect(engine, req):
    return [c async for c in engine.generate(req)]


def test_engine_streams_a_recorded_response_and_sends_what_was_asked(serve):
    seen: list = []
    engine = engine_for(serve, server(RECORDED, seen=seen))
    chunks = asyncio.run(collect(engine, GenerationRequest(prompt=(5, 6, 7), max_tokens=5)))
    assert sum(c.n_tokens for c in chunks) == 5
    assert 0 < chunks[-1].client_stats["http_headers_s"] < 1.0  # the network span
    body = json.loads(seen[0].content)
    assert body["prompt"] == [5, 6, 7]
    assert body["max_tokens"] == 5
    assert body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["model"] == "tiny"  # discovered from /v1/models
    assert engine.describe()["token_counts"] == "server running usage"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"", 429, "HTTP 429"),
        (b"", 500, "HTTP 500"),
        (sse(completion("a", 1), done=False), 200, "stream truncated"),
        (
            sse(completion("a", 1), '{"error": {"message": "boom"}}'),
            200,
            "server error event: boom",
        ),
    ],
)
def test_engine_failures_are_request_failures(serve, body, status, message):
    engine = engine_for(serve, server(body, status))
    with pytest.raises(RequestFailed, match=message):
        asyncio.run(collect(engine, GenerationRequest(prompt=(1,), max_tokens=2)))


def test_api_key_comes_from_the_environment_and_never_shows(serve, monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-secret-123")
    seen: list = []
    engine = engine_for(serve, server(RECORDED, seen=seen), api_key_env="MY_KEY")
    asyncio.run(collect(engine, GenerationRequest(prompt=(1,), max_tokens=5)))
    assert seen[0].headers["authorization"] == "Bearer sk-secret-123"
    described = json.dumps(engine.describe())
    assert "sk-secret" not in described
    assert engine.describe()["api_key"] == "set"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"api": "embeddings"}, "api must be"),
        ({"base_url": "127.0.0.1:8000"}, "http://"),
        ({"timeout_s": "-1"}, "positive"),
        ({"x": "1"}, "unknown option"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        OpenAIEngine.validate_options(options)


def test_counters_are_read_from_prometheus_metrics(serve):
    pytest.importorskip("prometheus_client")
    text = (
        "# HELP vllm:time_to_first_token_seconds ttft\n"
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_bucket{model_name="tiny",le="+Inf"} 4.0\n'
        'vllm:time_to_first_token_seconds_count{model_name="tiny"} 4.0\n'
        'vllm:time_to_first_token_seconds_sum{model_name="tiny"} 0.2\n'
        "# HELP vllm:generation_tokens counter\n"
        "# TYPE vllm:generation_tokens counter\n"
        'vllm:generation_tokens_total{model_name="tiny"} 128.0\n'
    )

    def handler(request):
        if request.url.path == "/metrics":
            return httpx.Response(200, text=text)
        return server(RECORDED)(request)

    engine = engine_for(serve, handler)
    counters = engine.counters()
    assert counters["vllm:time_to_first_token_seconds_sum"] == pytest.approx(0.2)
    assert counters["vllm:time_to_first_token_seconds_count"] == 4.0
    assert counters["vllm:generation_tokens_total"] == 128.0


def test_counter_delta_gives_histogram_means():
    before = {"x_sum": 1.0, "x_count": 10.0, "t_total": 5.0}
    after = {"x_sum": 1.6, "x_count": 13.0, "t_total": 9.0, "new_total": 1.0}
    assert counter_delta(before, after) == pytest.approx(
        {"t_total": 4.0, "x_count": 3.0, "x_sum": 0.6, "x_mean": 0.2}
    )


def test_client_retokenization_is_recorded_beside_server_counts(serve):
    class WordTokenizer:  # a stand-in for the model's tokenizer: one id per word
        def encode(self, text, add_special_tokens=False):
            return text.split()

    engine = engine_for(serve, server(RECORDED))
    engine._tokenizer = WordTokenizer()
    chunks = asyncio.run(collect(engine, GenerationRequest(prompt=(1,), max_tokens=5)))
    assert chunks[-1].retokenized == len(["nobisoesinefiro", "goke"])
    assert sum(c.n_tokens for c in chunks) == 5  # server's count untouched


async def _pieces(data: bytes, size: int):
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.mark.parametrize("size", [1, 2, 7, 64, 10_000])
def test_sse_events_survive_any_split_and_crlf(size):
    from engines.openai_http import sse_events  # noqa: PLC0415

    stream = (
        b": a comment\r\n\r\n"
        b'data: {"a": 1}\r\n\r\n'
        b"event: error\ndata: line one\ndata: line two\n\n"
        b"data:no-space\n\n"
        b"data: [DONE]"  # no final blank line: still an event
    )

    async def collect_events():
        return [e async for e in sse_events(_pieces(stream, size))]

    assert asyncio.run(collect_events()) == [
        ("message", b'{"a": 1}'),
        ("error", b"line one\nline two"),
        ("message", b"no-space"),
        ("message", b"[DONE]"),
    ]


# -- requests as users send them: text, chat, token ids; natural end; usage -----------------


def chat_event(content: str | None, completion_tokens: int, finish: str | None = None) -> dict:
    delta = {"role": "assistant", "content": ""} if content is None else {"content": content}
    return {
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        "usage": {"prompt_tokens": 12, "completion_tokens": completion_tokens},
    }


# the shape of vLLM's chat stream with continuous usage: a role-only first chunk, then
# content chunks, then the usage-only chunk (include_usage)
CHAT_STREAM = sse(
    chat_event(None, 0),
    chat_event(" Bado", 1),
    chat_event(" kefi", 2, "stop"),
    {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}},
)


def by_path(seen: list):
    """A server that answers /v1/chat/completions with a chat stream and
    /v1/completions with a completions stream, recording every generation request."""

    def handler(request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}, {"id": "other"}]})
        if request.url.path == "/version":
            return httpx.Response(404)
        seen.append(request)
        body = {"/v1/chat/completions": CHAT_STREAM, "/v1/completions": RECORDED}
        if request.url.path not in body:
            return httpx.Response(404, json={"error": {"message": "no such route"}})
        return httpx.Response(
            200, content=body[request.url.path], headers={"content-type": "text/event-stream"}
        )

    return handler


CONVERSATION = (Message("system", "Be brief."), Message("user", "Bada kefi lomo?"))


def test_each_request_kind_goes_to_its_own_endpoint(serve):
    seen: list = []
    engine = engine_for(serve, by_path(seen))
    chat = GenerationRequest("", 4, messages=CONVERSATION)
    text = GenerationRequest("Bada kefi", 5)
    tokens = GenerationRequest((5, 6, 7), 5)
    got = [asyncio.run(collect(engine, r)) for r in (chat, text, tokens)]
    assert [r.url.path for r in seen] == [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/completions",
    ]
    bodies = [json.loads(r.content) for r in seen]
    assert bodies[0]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Bada kefi lomo?"},
    ]
    assert "prompt" not in bodies[0]
    assert bodies[1]["prompt"] == "Bada kefi"
    assert "messages" not in bodies[1]
    assert bodies[2]["prompt"] == [5, 6, 7]
    for body in bodies:
        assert body["model"] == "tiny"  # the first of /v1/models
        assert body["stream_options"]["include_usage"] is True
        assert body["ignore_eos"] is True
    # the chat reply: its text and the server's counts, prompt tokens included
    chat_chunks = got[0]
    assert "".join(c.text for c in chat_chunks) == " Bado kefi"
    assert sum(c.n_tokens for c in chat_chunks) == 2
    # events that arrive in one read are one chunk: however they came, each says 12
    assert {c.prompt_tokens for c in chat_chunks if c.n_tokens} == {12}
    assert [c.finish_reason for c in chat_chunks if c.finish_reason] == ["stop"]
    assert [c.completion_tokens for c in chat_chunks][-1] == 2  # the last says the total


def test_natural_end_sends_ignore_eos_false_or_nothing(serve):
    seen: list = []
    natural = GenerationRequest("Bada", 64, ignore_eos=False)
    asyncio.run(collect(engine_for(serve, by_path(seen)), natural))
    asyncio.run(collect(engine_for(serve, by_path(seen), ignore_eos_field="0"), natural))
    first, second = (json.loads(r.content) for r in seen)
    assert first["ignore_eos"] is False
    assert first["max_tokens"] == 64  # a cap: the reply ends where the model ends it
    assert "ignore_eos" not in second


def test_a_forced_api_refuses_what_it_cannot_take(serve):
    seen: list = []
    chat = GenerationRequest("", 4, messages=CONVERSATION)
    completions = engine_for(serve, by_path(seen), api="completions")
    with pytest.raises(EngineError, match=r"chat request cannot go to the completions API"):
        asyncio.run(collect(completions, chat))
    chat_only = engine_for(serve, by_path(seen), api="chat")
    with pytest.raises(EngineError, match=r"token-id prompt cannot go to the chat API"):
        asyncio.run(collect(chat_only, GenerationRequest((1, 2), 4)))
    assert seen == []  # refused before anything was sent
    # a text prompt forced to chat is one user message
    asyncio.run(collect(chat_only, GenerationRequest("Bada kefi", 4)))
    assert seen[0].url.path == "/v1/chat/completions"
    assert json.loads(seen[0].content)["messages"] == [{"role": "user", "content": "Bada kefi"}]
    assert chat_only.describe()["api"] == "chat"


def test_the_driver_takes_input_tokens_from_the_servers_usage(serve):
    engine = engine_for(serve, by_path([]))
    driver = Driver(engine, MonotonicClock(), 5.0, count_input=lambda req: 999)
    chat = asyncio.run(driver.one(GenerationRequest("", 4, messages=CONVERSATION), 0.0))
    text = asyncio.run(driver.one(GenerationRequest("Bada kefi", 5), 0.0))
    assert (chat.n_in, chat.n_in_source, chat.n_out_reported) == (12, "engine", 2)
    assert (text.n_in, text.n_in_source, text.n_out_reported) == (5, "engine", 5)
    assert chat.error is None
    assert text.error is None


@pytest.mark.parametrize("model", [Path("/nonexistent/model"), Path("meta-llama/Llama-3-8B")])
def test_a_server_needs_no_local_model(serve, model):
    seen: list = []
    engine = OpenAIEngine(EngineConfig(model=model, options={"base_url": serve(by_path(seen))}))
    engine.load()
    assert engine.served_model == "tiny"  # from GET /v1/models, not from the model path
    assert engine._tokenizer is None  # nothing to re-tokenize with: no local directory
    chunks = asyncio.run(collect(engine, GenerationRequest("Bada kefi", 5)))
    assert json.loads(seen[0].content)["model"] == "tiny"
    assert sum(c.n_tokens for c in chunks) == 5
    assert chunks[-1].retokenized is None
    info = engine.describe()
    assert info["client_retokenization"] is None
    assert info["served_model"] == "tiny"


def test_served_model_option_names_the_model_and_a_local_dir_without_tokenizer(serve, tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model directory, but no tokenizer
    seen: list = []
    engine = OpenAIEngine(
        EngineConfig(
            model=tmp_path, options={"base_url": serve(by_path(seen)), "served_model": "other"}
        )
    )
    engine.load()
    assert engine._tokenizer is None
    asyncio.run(collect(engine, GenerationRequest("", 2, messages=CONVERSATION)))
    assert json.loads(seen[0].content)["model"] == "other"


def test_api_option_defaults_to_following_the_request():
    assert OPTIONS.option("api").default == "auto"
    OpenAIEngine.validate_options({"api": "auto"})
    with pytest.raises(ValueError, match="api must be one of auto, completions, chat"):
        OpenAIEngine.validate_options({"api": "responses"})
