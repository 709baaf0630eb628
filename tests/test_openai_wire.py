"""The openai engine's own HTTP/1.1 client (engines/openai_wire.py) against raw loopback
servers written here byte by byte: keep-alive reuse, the idle limit, a server that
closes mid-response or goes silent, chunked and sized bodies, and one chunk per read."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

pytest.importorskip("httptools", reason="httptools is not installed (the openai extra)")

from engines.openai_http import OpenAIEngine
from engines.openai_wire import HTTPFailed, Origin, Pool, head, post
from harness.engine import (
    EngineConfig,
    GenerationRequest,
    eventloop,
)
from harness.load.clock import MonotonicClock
from harness.load.noopserver import NoopProtocol
from harness.load.streamdriver import Driver

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _head(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
    return head


def _sse(*events: str) -> bytes:
    return b"".join(f"data: {e}\n\n".encode() for e in events)


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


OK_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def _token(text: str, n: int) -> str:
    return json.dumps(
        {"choices": [{"text": text, "finish_reason": None}], "usage": {"completion_tokens": n}}
    )


def test_a_keep_alive_connection_is_reused_and_an_idle_one_past_the_limit_is_not():
    peers: list[int] = []

    async def handler(reader, writer):
        peers.append(writer.get_extra_info("peername")[1])
        while True:
            try:
                await _head(reader)
            except asyncio.IncompleteReadError:
                return
            body = _sse(_token("a", 1), "[DONE]")
            writer.write(OK_HEAD + _chunked(body))

    async def main():
        server, url = await _serve(handler)
        pool = Pool(Origin.of(url), keepalive_s=0.2)
        for pause in (0.0, 0.0, 0.3):
            await asyncio.sleep(pause)
            response = await head(await post(pool, "/v1/completions", b"{}", 5.0))
            assert response.status == 200
            assert b'"a"' in await response.read()
            response.release()
        pool.close()
        server.close()

    asyncio.run(main())
    # two requests on the first connection, the third after the idle limit on a new one
    assert len(peers) == 2


def test_events_of_one_read_are_one_chunk_and_paced_events_their_own():
    async def handler(reader, writer):
        await _head(reader)
        writer.write(OK_HEAD)
        together = _sse(_token(" a", 1), _token(" b", 2), _token(" c", 3))
        writer.write(_chunked(together)[: -len(b"0\r\n\r\n")])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(_chunked(_sse(_token(" d", 4), "[DONE]")))
        await writer.drain()

    async def main():
        server, url = await _serve(handler)
        engine = OpenAIEngine(
            EngineConfig(model=Path("-"), options={"base_url": url, "served_model": "m"})
        )
        engine._loaded = True  # no /v1/models on this server: the test's own shortcut
        clock = MonotonicClock()
        sent = clock.now()
        record = await Driver(engine, clock, 5.0).one(GenerationRequest((1,), 4), sent)
        engine.close()
        server.close()
        return sent, record

    sent, record = asyncio.run(main())
    assert record.error is None
    # three events in one read; the fourth in the last read, whose chunk closes the stream
    assert record.chunk_tokens == (3, 1)
    first, second = record.chunk_times
    assert sent < first < second
    assert second - first >= 0.04  # the pause between the reads, not a parse order


def test_a_server_that_closes_mid_response_fails_the_request_and_the_connection():
    async def handler(reader, writer):
        await _head(reader)
        writer.write(OK_HEAD + b"%x\r\n%s\r\n" % (len(_sse(_token("a", 1))), _sse(_token("a", 1))))
        await writer.drain()
        writer.close()

    async def main():
        server, url = await _serve(handler)
        pool = Pool(Origin.of(url), keepalive_s=5.0)
        response = await head(await post(pool, "/v1/completions", b"{}", 5.0))
        with pytest.raises(HTTPFailed, match="closed the connection mid-response"):
            async for _ in response.pieces():
                pass
        response.release()
        assert not pool._idle  # never reused
        server.close()

    asyncio.run(main())


def test_a_silent_server_times_out_between_reads():
    async def handler(reader, writer):
        await _head(reader)
        writer.write(OK_HEAD)
        await asyncio.sleep(2)

    async def main():
        server, url = await _serve(handler)
        pool = Pool(Origin.of(url), keepalive_s=5.0)
        start = time.perf_counter()
        response = await head(await post(pool, "/v1/completions", b"{}", 0.2))
        with pytest.raises(HTTPFailed, match=r"no data from the server for 0.2 s"):
            async for _ in response.pieces():
                pass
        response.release()
        server.close()
        return time.perf_counter() - start

    assert 0.2 <= asyncio.run(main()) < 1.5


def test_a_sized_body_and_the_request_head():
    heads: list[bytes] = []

    async def handler(reader, writer):
        heads.append(await _head(reader))
        body = b'{"error": "no such model"}'
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()

    async def main():
        server, url = await _serve(handler)
        pool = Pool(Origin.of(url + "/prefix"), 5.0, headers={"Authorization": "x"})
        response = await head(await post(pool, "/prefix/v1/completions", b"{}", 5))
        got = (response.status, await response.read())
        response.release()
        server.close()
        return got, url

    (status, body), url = asyncio.run(main())
    assert (status, body) == (404, b'{"error": "no such model"}')
    lines = heads[0].decode().split("\r\n")
    assert lines[0] == "POST /prefix/v1/completions HTTP/1.1"
    assert f"Host: {url.removeprefix('http://')}" in lines
    assert "Content-Length: 2" in lines
    assert "Authorization: x" in lines


def test_no_server_is_a_clear_failure():
    async def main():
        pool = Pool(Origin.of("http://127.0.0.1:9"), keepalive_s=5.0)
        with pytest.raises(HTTPFailed, match=r"cannot connect to 127.0.0.1:9"):
            await head(await post(pool, "/v1/completions", b"{}", 5.0))

    asyncio.run(main())


def test_origins_and_their_host_headers():
    assert Origin.of("http://h:8000/x").host_header == "h:8000"
    assert Origin.of("https://h").port == 443
    assert Origin.of("https://h").host_header == "h"
    assert Origin.of("http://[::1]:81").host_header == "[::1]:81"
    with pytest.raises(ValueError, match="not an http"):
        Origin.of("ftp://h")


def test_the_noop_server_streams_through_the_engine_on_the_harness_loop():
    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(NoopProtocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        engine = OpenAIEngine(
            EngineConfig(model=Path("-"), options={"base_url": f"http://127.0.0.1:{port}"})
        )
        await asyncio.to_thread(engine.load)
        driver = Driver(engine, MonotonicClock(), 5.0)
        records = [await driver.one(GenerationRequest((1, 2), 16), 0.0) for _ in range(3)]
        info = engine.describe()["client"]
        engine.close()
        server.close()
        return records, info

    records, info = eventloop.run(main())
    assert [r.n_out for r in records] == [16, 16, 16]
    assert all(r.error is None for r in records)
    assert info["event_loop"] in ("uvloop", "asyncio")
    assert "httptools" in info["library"]


def test_the_event_loop_choice(monkeypatch):
    monkeypatch.setenv(eventloop.ENV, "asyncio")
    assert eventloop.loop_factory() is asyncio.new_event_loop
    monkeypatch.setenv(eventloop.ENV, "tokio")
    with pytest.raises(ValueError, match="choose one of auto, uvloop, asyncio"):
        eventloop.loop_factory()
