"""The openai engine's streaming HTTP/1.1 client: keep-alive connections as asyncio
protocols, responses parsed by httptools (llhttp, the parser of Node.js), server-sent
events split from the body as it arrives, and one timestamp per read of the socket.

Why not aiohttp (the client before it): per streamed request aiohttp builds a URL, a
header multidict, a request and a response object, a stream reader and a timer per read,
and hands each piece of body through two more layers; profiled under load on one core
(docs/measurements.md, "The streaming client") that was most of the client's time, and
the client topped out near 3,000 requests/s of 16 tokens. Here a request is one
pre-rendered write, the response's bytes go from the socket callback to the SSE splitter,
and the only timer per request is the read timeout's, rescheduled lazily.

Every event of one read carries the time that read returned (``Conn.t_read``): the
events were on the wire together, and stamping each after parsing the ones before it
would add the parser's time to their arrival.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from harness.engine import RequestError


class HTTPFailed(RequestError):
    """The connection or the HTTP exchange failed (not the server's answer)."""


@dataclass(frozen=True)
class Origin:
    """Where requests go: scheme, host, port, and the ``Host`` header to send."""

    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port)

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port == default else f"{name}:{self.port}"


def request_head(origin: Origin, path: str, headers: Mapping[str, str]) -> bytes:
    """A POST's head for a JSON body, up to its ``Content-Length`` value."""
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {origin.host_header}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        *(f"{k}: {v}" for k, v in headers.items()),
        "Content-Length: ",
    ]
    return "\r\n".join(lines).encode("latin-1")


class Conn(asyncio.Protocol):
    """One keep-alive connection, one request at a time. The socket callback feeds the
    parser; the parser's callbacks collect the body; the waiting request wakes once per
    read, however many events the read held."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.lost: BaseException | None = None
        self.t_read = 0.0
        self.idle_since = 0.0
        self.timeout_s = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without deriving from it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.t_read = time.perf_counter()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HTTPFailed(f"unreadable HTTP response: {exc}"))
            return
        self._wake()

    def eof_received(self) -> bool | None:
        with contextlib.suppress(httptools.HttpParserError):
            self.parser.feed_data(b"")  # a body delimited by the close ends here
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.complete:
            self.lost = HTTPFailed(
                "the server closed the connection mid-response"
                + (f": {exc}" if exc is not None else "")
            )
        self._wake()

    # -- httptools callbacks ---------------------------------------------------------------
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    # -- the request's side ----------------------------------------------------------------
    def send(self, data: bytes, timeout_s: float) -> None:
        """Write a request; its response fails when no read comes for ``timeout_s``."""
        if self.transport is None or self.lost is not None:
            raise HTTPFailed("the connection is closed")
        self.body, self.status = [], 0
        self.headers_done = self.complete = False
        self.timeout_s = timeout_s
        self.t_read = time.perf_counter()
        # one timer per request, moved on only when it fires (not one per read)
        self._timer = asyncio.get_running_loop().call_later(timeout_s, self._check_idle)
        self.transport.write(data)

    def done(self) -> None:
        """The request is over: its read timeout goes."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def readable(self) -> asyncio.Future[None]:
        """Done at the next read, the connection's end or the read timeout (then with the
        error, unless the read brought what is still to be taken). A future, not a
        coroutine: one frame less on every read."""
        waiter = asyncio.get_running_loop().create_future()
        if self.lost is not None:
            waiter.set_exception(self.lost)
        else:
            self._waiter = waiter
        return waiter

    def take_body(self) -> bytes:
        pieces, self.body = self.body, []
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def close(self) -> None:
        transport, self.transport = self.transport, None
        if transport is not None:
            # a connection whose loop is gone went with it (asyncio.run ended it)
            with contextlib.suppress(RuntimeError):
                transport.close()

    def _check_idle(self) -> None:
        self._timer = None
        if self.complete or self.lost is not None:
            return
        idle = time.perf_counter() - self.t_read
        if idle < self.timeout_s:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.timeout_s - idle, self._check_idle)
            return
        # the connection is not reused: a late answer would be read as the next one's
        self.lost = HTTPFailed(f"no data from the server for {self.timeout_s:g} s")
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is None or waiter.done():
            return
        if self.lost is not None and not self.body and not self.complete:
            waiter.set_exception(self.lost)
        else:
            waiter.set_result(None)

    def _fail(self, exc: HTTPFailed) -> None:
        self.lost = exc
        self.close()
        self._wake()


class Pool:
    """Keep-alive connections to one origin, the most recently used first (warm in the
    server's and the kernel's caches); idle ones older than ``keepalive_s`` are closed,
    under the server's own idle timeout, so that no request is sent on a connection the
    server is closing."""

    def __init__(
        self,
        origin: Origin,
        keepalive_s: float,
        headers: Mapping[str, str] | None = None,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.origin = origin
        self.headers = dict(headers or {})
        self._heads: dict[str, bytes] = {}
        self.keepalive_s = keepalive_s
        self.connect_timeout_s = connect_timeout_s
        self._idle: collections.deque[Conn] = collections.deque()
        self._ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if origin.scheme == "https" else None
        )
        self._all: set[Conn] = set()

    def request(self, path: str, body: bytes) -> bytes:
        """The bytes of a POST of ``body`` to ``path``: one write (the head's fixed part
        is rendered once per path)."""
        head = self._heads.get(path)
        if head is None:
            head = self._heads[path] = request_head(self.origin, path, self.headers)
        return b"%s%d\r\n\r\n%s" % (head, len(body), body)

    def idle(self) -> Conn | None:
        """The most recently used idle connection still fit for a request, or None."""
        now = time.perf_counter()
        while self._idle:
            conn = self._idle.pop()
            usable = conn.transport is not None and conn.lost is None
            if usable and now - conn.idle_since < self.keepalive_s:
                return conn
            self._drop(conn)
        return None

    async def acquire(self) -> Conn:
        conn = self.idle()
        return conn if conn is not None else await self._open()

    def release(self, conn: Conn) -> None:
        conn.done()
        if conn.complete and conn.keep_alive and conn.lost is None and conn.transport:
            conn.idle_since = time.perf_counter()
            self._idle.append(conn)
        else:
            self._drop(conn)

    def _drop(self, conn: Conn) -> None:
        conn.close()
        self._all.discard(conn)

    async def _open(self) -> Conn:
        loop = asyncio.get_running_loop()
        origin = self.origin
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    Conn,
                    origin.host,
                    origin.port,
                    ssl=self._ssl,
                    server_hostname=origin.host if self._ssl else None,
                )
        except (OSError, TimeoutError) as exc:
            why = str(exc) or type(exc).__name__
            raise HTTPFailed(f"cannot connect to {origin.host}:{origin.port}: {why}") from exc
        self._all.add(conn)
        return conn

    def close(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()


class Response:
    """A request's response as it streams: status, and the body's pieces as they come."""

    __slots__ = ("conn", "pool", "released")

    def __init__(self, conn: Conn, pool: Pool) -> None:
        self.conn, self.pool, self.released = conn, pool, False

    @property
    def status(self) -> int:
        return self.conn.status

    async def pieces(self) -> AsyncIterator[tuple[bytes, float]]:
        """The body's bytes, read by read, each with the time its read returned."""
        conn = self.conn
        while True:
            if conn.body:
                yield conn.take_body(), conn.t_read
            if conn.complete:
                return
            if conn.lost is not None:
                raise conn.lost
            await conn.readable()

    async def read(self, limit: int = 1 << 16) -> bytes:
        out = bytearray()
        async for piece, _ in self.pieces():
            out += piece
            if len(out) >= limit:
                break
        return bytes(out)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.pool.release(self.conn)


def send_now(pool: Pool, path: str, body: bytes, timeout_s: float) -> Response | None:
    """Send a POST now on a kept-alive connection, if one is free (None: none is; opening
    one takes the event loop's turns, so ``post`` does that)."""
    conn = pool.idle()
    if conn is None:
        return None
    conn.send(pool.request(path, body), timeout_s)
    return Response(conn, pool)


async def post(pool: Pool, path: str, body: bytes, timeout_s: float) -> Response:
    """Send a POST on a pooled connection, opened if none is free."""
    conn = await pool.acquire()
    conn.send(pool.request(path, body), timeout_s)
    return Response(conn, pool)


async def head(response: Response) -> Response:
    """``response`` once its head is in; on any failure its connection is given back."""
    conn = response.conn
    try:
        while not conn.headers_done:
            await conn.readable()
    except BaseException:
        response.release()
        raise
    return response
