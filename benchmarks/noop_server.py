"""A no-op OpenAI-compatible streaming server for benchmarking the HTTP client side.

Every completion streams ``max_tokens`` one-token SSE events, a usage event and
``[DONE]`` at once, with no model behind it, so a client that cannot keep up is
measuring itself. Run one process per core with ``--processes`` (SO_REUSEPORT).

    python -m benchmarks.noop_server --port 8765 --processes 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
from typing import Any

from aiohttp import web

MODEL = "noop"


def _event(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _token(i: int) -> bytes:
    return _event(
        {
            "object": "text_completion",
            "model": MODEL,
            "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}],
            "usage": {"prompt_tokens": 1, "completion_tokens": i + 1},
        }
    )


TOKENS = [_token(i) for i in range(256)]  # rendered once: the server does no work per token


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    n = min(int(body.get("max_tokens", 4)), len(TOKENS))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(n):
        await resp.write(TOKENS[i])
    usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
    await resp.write(_event({"choices": [], "usage": usage}) + _event("[DONE]"))
    await resp.write_eof()
    return resp


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": "noop"})


def app() -> web.Application:
    application = web.Application()
    application.router.add_post("/v1/completions", completions)
    application.router.add_get("/v1/models", models)
    application.router.add_get("/version", version)
    return application


def serve(port: int, cpu: int | None = None) -> None:
    import os  # noqa: PLC0415

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    web.run_app(app(), host="127.0.0.1", port=port, reuse_port=True, access_log=None, print=None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    port: int, processes: int, cpus: list[int] | None = None
) -> list[multiprocessing.Process]:
    """Start ``processes`` server processes on ``port``; returns once it accepts."""
    procs = []
    for k in range(processes):
        cpu = cpus[k % len(cpus)] if cpus else None
        p = multiprocessing.get_context("spawn").Process(
            target=serve, args=(port, cpu), daemon=True
        )
        p.start()
        procs.append(p)
    asyncio.run(_wait_ready(port))
    return procs


async def _wait_ready(port: int, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if loop.time() > deadline:
                raise RuntimeError(f"no-op server on port {port} did not start") from None
            await asyncio.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    for p in start(args.port, args.processes):
        p.join()


if __name__ == "__main__":
    main()
