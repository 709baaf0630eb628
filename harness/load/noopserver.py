"""A no-op OpenAI-compatible streaming server for benchmarking the HTTP client side.

Every completion streams ``max_tokens`` one-token SSE events, a usage event and
``[DONE]`` at once, with no model behind it, so a client that cannot keep up is
measuring itself. Run one process per core with ``--processes`` (SO_REUSEPORT).

It is a bare ``asyncio.Protocol`` writing pre-rendered HTTP/1.1 chunks, not a web
framework: a request costs it a small fraction of what it costs the client (one event
loop turn, a JSON parse of the body, one ``send`` per event), so on a machine with few
cores the server's share leaves room for a second client process. It speaks only what
the ``openai`` adapter sends: keep-alive requests with a ``Content-Length`` body.

    python -m harness.load.noopserver --port 8765 --processes 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import multiprocessing
import os
import signal
import socket
from multiprocessing.process import BaseProcess
from typing import Any, cast

from harness.engine import eventloop

MODEL = "noop"
MAX_TOKENS = 256
MAX_HEAD = 16384
"""A request head longer than this is not one the adapter sends: answer 431 and close."""


def _event(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _token(i: int) -> bytes:
    return _chunk(
        _event(
            {
                "object": "text_completion",
                "model": MODEL,
                "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}],
                "usage": {"prompt_tokens": 1, "completion_tokens": i + 1},
            }
        )
    )


def _tail(n: int, prompt_tokens: int = 1) -> bytes:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": n + 1}
    return _chunk(_event({"choices": [], "usage": usage}) + _event("[DONE]")) + b"0\r\n\r\n"


def _prompt_tokens(request: dict[str, Any]) -> int:
    """What a server would count: the ids of a token-id prompt, else words of the text or
    of the messages (the final usage carries it; clients take input counts from it)."""
    prompt = request.get("prompt")
    if isinstance(prompt, list):
        return len(prompt)
    if isinstance(prompt, str):
        return len(prompt.split())
    messages = request.get("messages") or []
    return sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))


def _json_response(status: str, payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


# rendered once: the server does no work per token
TOKENS = tuple(_token(i) for i in range(MAX_TOKENS))
TAILS = tuple(_tail(n) for n in range(MAX_TOKENS + 1))
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
)
FIXED = {
    (b"GET", b"/v1/models"): _json_response(
        "200 OK", {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
    ),
    (b"GET", b"/version"): _json_response("200 OK", {"version": "noop"}),
}
NOT_FOUND = _json_response("404 Not Found", {"error": "not found"})
BAD_REQUEST = _json_response("400 Bad Request", {"error": "unreadable request"})


def completion(body: bytes) -> list[bytes]:
    """The writes that answer one completion request, one per SSE event."""
    try:
        request = json.loads(body)
        n = max(0, min(int(request.get("max_tokens", 4)), MAX_TOKENS))
        prompt = _prompt_tokens(request)
    except (ValueError, TypeError, AttributeError):
        return [BAD_REQUEST]
    tail = TAILS[n] if prompt == 1 else _tail(n, prompt)
    return [STREAM_HEAD, *TOKENS[:n], tail]


def answer(head: bytes, body: bytes) -> list[bytes]:
    method, _, rest = head.partition(b" ")
    path = rest.partition(b" ")[0].partition(b"?")[0]
    if method == b"POST" and path == b"/v1/completions":
        return completion(body)
    return [FIXED.get((method, path), NOT_FOUND)]


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


class NoopProtocol(asyncio.Protocol):
    """One connection: parse each request as its bytes arrive, answer it at once."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without deriving from it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None and self._one():
            pass

    def _one(self) -> bool:
        """Answer the first whole request in the buffer; False when none is whole yet."""
        assert self.transport is not None
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD:
                self._refuse()
            return False
        head = self.buffer[:end]
        try:
            length = content_length(head)
        except ValueError:
            self._refuse()
            return False
        stop = end + 4 + length
        if len(self.buffer) < stop:
            return False
        body, self.buffer = self.buffer[end + 4 : stop], self.buffer[stop:]
        for piece in answer(head, body):
            self.transport.write(piece)  # one send per SSE event: the client sees a stream
        return True

    def _refuse(self) -> None:
        assert self.transport is not None
        self.transport.write(BAD_REQUEST)
        self.transport.close()
        self.transport = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def _serve(port: int, host: str) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(NoopProtocol, host, port, reuse_port=True, backlog=1024)
    async with server:
        await server.serve_forever()


def serve(port: int, cpu: int | None = None, host: str = "127.0.0.1", nice: int = 0) -> None:
    _die_with_parent()
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    if nice:
        with contextlib.suppress(PermissionError):  # below 0 needs root: then run at 0
            os.nice(nice)
    eventloop.run(_serve(port, host))


def _die_with_parent() -> None:
    """A server outliving its launcher would hold the port and a core."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    port: int,
    processes: int,
    cpus: list[int] | None = None,
    host: str = "127.0.0.1",
    nice: int = 0,
) -> list[BaseProcess]:
    """Start ``processes`` server processes on ``port``; returns once it accepts.

    ``nice``: the servers' scheduling priority change; negative (root only; otherwise
    ignored) lets a server sharing a core with a client answer at once."""
    procs: list[BaseProcess] = []
    for k in range(processes):
        cpu = cpus[k % len(cpus)] if cpus else None
        p = multiprocessing.get_context("spawn").Process(
            target=serve, args=(port, cpu, host, nice), daemon=True
        )
        p.start()
        procs.append(p)
    asyncio.run(_wait_ready(port, host))
    return procs


async def _wait_ready(port: int, host: str, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            _, writer = await asyncio.open_connection(host, port)
            writer.close()
            return
        except OSError:
            if loop.time() > deadline:
                raise RuntimeError(f"no-op server on port {port} did not start") from None
            await asyncio.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)"
    )
    args = parser.parse_args()
    for p in start(args.port, args.processes, host=args.host):
        p.join()


if __name__ == "__main__":
    main()
