"""A fault-injecting OpenAI-compatible server on loopback, for testing the harness itself.

It streams completions the way vLLM does (running usage in every chunk, a usage-only
chunk, ``[DONE]``) and, for a seeded share of requests, does something wrong instead:

=============  ==============================================================
``429``        answers 429 Too Many Requests
``500``        answers 500 Internal Server Error
``reset``      sends two tokens, then resets the connection (TCP RST)
``truncate``   sends two tokens, then ends the stream cleanly without ``[DONE]``
``error``      sends two tokens, then an in-band ``{"error": ...}`` event
``slow``       waits ``slow_s`` before the first byte, then streams normally
=============  ==============================================================

The first ``clean_first`` requests are never faulted (a workload's warm-up); ``tally``
says what was done to every later request, so a test can check the client's account
against the server's, request for request.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import web

FAULTS = ("429", "500", "reset", "truncate", "error", "slow")
MODEL = "fault-model"


@dataclass
class Plan:
    shares: dict[str, float]
    seed: int = 0
    slow_s: float = 0.3
    clean_first: int = 0
    token_gap_s: float = 0.001
    tally: Counter[str] = field(default_factory=Counter)
    served: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.shares) - set(FAULTS)
        if unknown or sum(self.shares.values()) > 1.0:
            raise ValueError(f"fault shares must be of {FAULTS} and sum to <= 1")
        self._rng = np.random.default_rng(self.seed)

    def next_fault(self) -> str:
        self.served += 1
        if self.served <= self.clean_first:
            return "clean"
        draw = float(self._rng.random())
        for name, share in self.shares.items():
            if draw < share:
                self.tally[name] += 1
                return name
            draw -= share
        self.tally["clean"] += 1
        return "clean"


def _event(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def _token(i: int, n_prompt: int, last: bool) -> dict[str, Any]:
    return {
        "object": "text_completion",
        "model": MODEL,
        "choices": [{"index": 0, "text": f" t{i}", "finish_reason": "length" if last else None}],
        "usage": {"prompt_tokens": n_prompt, "completion_tokens": i + 1},
    }


def _reset(request: web.Request) -> None:
    """Close with SO_LINGER 0: the peer sees a connection reset, not an orderly close."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class FaultServer:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.app = web.Application()
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/version", self.version)
        self.app.router.add_post("/v1/completions", self.completions)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "fault-server"})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        fault = self.plan.next_fault()
        if fault in ("429", "500"):
            status = int(fault)
            message = "rate limited" if status == 429 else "injected server error"
            return web.json_response({"error": {"message": message}}, status=status)
        if fault == "slow":
            await asyncio.sleep(self.plan.slow_s)
        return await self._stream(request, body, fault)

    async def _stream(
        self, request: web.Request, body: dict[str, Any], fault: str
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = int(body.get("max_tokens", 16))
        prompt = body.get("prompt")
        n_prompt = len(prompt) if isinstance(prompt, list) else 1
        for i in range(n):
            if i == 2 and fault in ("reset", "truncate", "error"):
                return await self._break(request, resp, fault)
            await resp.write(_event(_token(i, n_prompt, last=i == n - 1)))
            await asyncio.sleep(self.plan.token_gap_s)
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}
        await resp.write(_event({"choices": [], "usage": usage}))
        await resp.write(_event("[DONE]"))
        await resp.write_eof()
        return resp

    async def _break(
        self, request: web.Request, resp: web.StreamResponse, fault: str
    ) -> web.StreamResponse:
        if fault == "reset":
            _reset(request)
            return resp
        if fault == "error":
            await resp.write(_event({"error": {"message": "injected engine error", "code": 500}}))
        await resp.write_eof()
        return resp


@contextmanager
def fault_server(plan: Plan) -> Iterator[str]:
    """Serve ``plan`` on a free loopback port in a thread; yields the base URL."""
    with serve_app(FaultServer(plan).app) as url:
        yield url


@contextmanager
def serve_app(app: web.Application) -> Iterator[str]:
    """Serve ``app`` on a free loopback port in a thread; yields the base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
