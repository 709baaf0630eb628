"""What an OpenAI-compatible server streams, turned into the harness's chunks: server-sent
events split from the bytes as they arrive, and each event's text, reasoning and token
counts (running usage where the server sends it, one per text chunk where not). Pure, so
it is tested on recorded streams; engines/openai_http.py sends the requests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from harness.engine import Chunk, RequestError


def _codec() -> tuple[Callable[[bytes | str], Any], Callable[[Any], bytes]]:
    """orjson where installed (the openai extra brings it): a streamed event parses in
    0.47 us instead of the standard library's 2.2 (docs/measurements.md)."""
    try:
        import orjson  # noqa: PLC0415
    except ImportError:
        return json.loads, lambda doc: json.dumps(doc, separators=(",", ":")).encode()
    return orjson.loads, orjson.dumps


loads, dumps = _codec()


class RequestFailed(RequestError):
    """One request failed (HTTP status, in-band error, truncated stream)."""


def status_failure(status: int, body: bytes) -> RequestFailed:
    """An answer other than 200 as its request's failure: the status and the start of
    the body, where servers say why."""
    return RequestFailed(f"HTTP {status}: {body[:300].decode(errors='replace')}")


class StreamState:
    """Turns parsed SSE payloads into chunks; pure, so it is tested on recorded streams."""

    def __init__(self, api: str, *, transformers_serve: bool = False) -> None:
        """``transformers_serve``: its streams end at their last chunk, without ``[DONE]``,
        and tokens without text of their own (the EOS that ends a reply, a byte of a
        character still incomplete at the end) are counted by its final usage only."""
        self.api = api
        self._text_key = "content" if api == "chat" else "text"
        self.needs_done = not transformers_serve
        self.counted = 0  # tokens the chunks carried so far
        self.done = False
        self.finished = False
        self.last_completion_tokens: int | None = None
        self.running_usage = False
        self._texts: list[str] = []
        self._thinking = False  # the stream's text so far ends in reasoning
        self._server_reasoning = False  # the server's running reasoning count has moved
        self._last_reasoning = 0

    def feed(self, data: bytes | str, received_at: float | None = None) -> Chunk | None:
        """One SSE ``data`` field; returns the chunk it carried (None: nothing to yield)."""
        return self.feed_read((data,), received_at)

    def feed_read(
        self, datas: Iterable[bytes | str], received_at: float | None = None
    ) -> Chunk | None:
        """The SSE ``data`` fields one read of the socket brought, as one chunk stamped
        ``received_at`` (when the read returned): the client cannot tell apart events
        that reached it together, so it does not invent gaps between them (the ITL of a
        chunk of k tokens is its gap spread over the k, as docs/methodology.md defines).
        None: nothing to yield (the read held only ``[DONE]``)."""
        return self.chunk(self.read(datas), received_at)

    def read(self, datas: Iterable[bytes | str]) -> _Read:
        """What the events of one read add up to (``seen`` False: none but ``[DONE]``)."""
        read = _Read()
        for event in self._events(datas):
            self._add(event, read)
        return read

    def chunk(self, read: _Read, received_at: float | None) -> Chunk | None:
        """The read as one chunk (None: it held no event)."""
        return self.last_chunk(read, received_at) if read.seen else None

    def last_chunk(self, read: _Read, received_at: float | None, **extra: Any) -> Chunk:
        """The read as one chunk, with ``extra`` fields (the stream's closing totals)."""
        return Chunk(
            n_tokens=read.n,
            text="".join(read.texts),
            completion_tokens=read.completion,
            prompt_tokens=read.prompt,
            finish_reason=read.finish,
            reasoning_tokens=read.reasoning,
            received_at=received_at if read.seen else None,
            **extra,
        )

    def _events(self, datas: Iterable[bytes | str]) -> list[dict[str, Any]]:
        """The read's events parsed: as one JSON array where they are whole objects (one
        call into the parser per read, not per event), else one by one, which also names
        the one that is not JSON."""
        datas = list(datas)
        body = datas[:-1] if datas and datas[-1] == b"[DONE]" else datas
        if body and isinstance(body[0], bytes):
            try:
                events = loads(b"[" + b",".join(body) + b"]")  # type: ignore[arg-type]
            except ValueError:
                events = None
            if events is not None and len(events) == len(body):
                if len(body) < len(datas):
                    self.done = True
                if all(type(e) is dict and "error" not in e for e in events):
                    return events  # type: ignore[no-any-return]
        return [e for e in map(self._event, datas) if e is not None]

    def _event(self, data: bytes | str) -> dict[str, Any] | None:
        first = data[:1]
        if first not in (b"{", "{") and data.strip() in (b"[DONE]", "[DONE]"):
            self.done = True
            return None
        try:
            event = loads(data)
        except ValueError as exc:
            raise RequestFailed(f"malformed SSE data: {data[:120]!r}") from exc
        if not isinstance(event, dict):
            raise RequestFailed(f"unexpected SSE payload: {data[:120]!r}")
        if "error" in event:
            err = event["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise RequestFailed(f"server error event: {message}")
        return event

    def _add(self, event: dict[str, Any], read: _Read) -> None:
        """One event's tokens, reasoning among them, text, finish reason and usage, added
        to the read's. (Runs for every streamed event: a few dictionary lookups.)"""
        read.seen = True
        usage = event.get("usage") or _EMPTY
        completion = usage.get("completion_tokens")
        if completion is not None:
            read.completion = completion
        prompt = usage.get("prompt_tokens")
        if prompt is not None:
            read.prompt = prompt
        choices = event.get("choices")
        if not choices:
            # the final usage-only chunk: totals, and no new tokens but (transformers serve)
            # those that came without text, which only its count shows
            if not self.needs_done and completion is not None:
                read.n += max(completion - self.counted, 0)
            return
        choice = choices[0]
        # chat: the delta's fields; completions: the choice's own (vLLM's completions
        # API does not separate reasoning: there it stays empty)
        fields = (choice.get("delta") or _EMPTY) if self.api == "chat" else choice
        text = fields.get(self._text_key) or ""
        reasoning = _reasoning_text(fields)
        finish = choice.get("finish_reason")
        if finish is not None:
            self.finished = True
            read.finish = finish
        self._texts.append(reasoning + text if reasoning else text)  # re-tokenized whole
        if completion is not None:
            self.running_usage = True
            n = max(completion - (self.last_completion_tokens or 0), 0)
            self.last_completion_tokens = completion
        else:
            n = (1 if text else 0) + (1 if reasoning else 0)
        self.counted += n
        read.n += n
        read.reasoning += self._reasoning_tokens(n, reasoning, text, usage)
        if text:
            read.texts.append(text)

    def _reasoning_tokens(self, n: int, reasoning: str, text: str, usage: Mapping[str, Any]) -> int:
        """How many of a chunk's ``n`` tokens are reasoning: the difference of the server's
        running count where it keeps one (vLLM's continuous usage with a reasoning parser
        that counts: ``completion_tokens_details.reasoning_tokens``), else by the chunk's
        text: all when it is reasoning only, none when it is answer only, split by length
        when it has both (at least one of each); a chunk without text (a token whose text
        comes later) belongs to the part under way."""
        details = usage.get("completion_tokens_details")
        if not reasoning and details is None and not self._server_reasoning:
            # the common event (answer text, or none): no count to read, nothing to split
            if text:
                self._thinking = False
            return n if self._thinking else 0
        if reasoning or text:
            self._thinking = not text
        running = details.get("reasoning_tokens") if isinstance(details, dict) else None
        if isinstance(running, int) and (running > 0 or self._server_reasoning):
            self._server_reasoning = True
            counted, self._last_reasoning = running - self._last_reasoning, running
            return min(max(counted, 0), n)
        if reasoning and text:
            if n < 2:
                return 0
            share = round(n * len(reasoning) / (len(reasoning) + len(text)))
            return min(max(share, 1), n - 1)
        return n if self._thinking else 0

    def close(self) -> None:
        if not self.done and (self.needs_done or not self.finished):
            raise RequestFailed(
                "stream truncated: ended without "
                + ("[DONE]" if self.needs_done else "a finish_reason")
            )

    @property
    def text(self) -> str:
        return "".join(self._texts)


_EMPTY: Mapping[str, Any] = {}


class _Read:
    """What the events of one read add up to."""

    __slots__ = ("completion", "finish", "n", "prompt", "reasoning", "seen", "texts")

    def __init__(self) -> None:
        self.seen = False
        self.n = self.reasoning = 0
        self.texts: list[str] = []
        self.completion: int | None = None
        self.prompt: int | None = None
        self.finish: str | None = None


REASONING_FIELDS = ("reasoning_content", "reasoning")
"""Where OpenAI-compatible servers stream reasoning beside ``content``: vLLM 0.32 sends
``reasoning`` (as do OpenRouter and Ollama), earlier vLLM, DeepSeek, SGLang and
TensorRT-LLM ``reasoning_content``. A server that sends both sends the same text twice."""


def _reasoning_text(fields: Mapping[str, Any]) -> str:
    if "reasoning" not in fields and "reasoning_content" not in fields:
        return ""
    for name in REASONING_FIELDS:
        value = fields.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


class EventSplitter:
    """Server-sent events as ``(event, data)`` from a byte stream in arbitrary pieces.

    SSE: ``field: value`` lines, a blank line ends an event, ``:`` starts a comment.
    Whole received pieces are split, not read line by line, and the common event (one
    ``data: ...`` line) takes a fast path: per event this is a split and a slice."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, piece: bytes) -> list[tuple[str, bytes]]:
        buf = self._rest + piece if self._rest else piece
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        *complete, self._rest = buf.split(b"\n\n")
        out = []
        for raw in complete:
            if raw.startswith(b"data: ") and b"\n" not in raw:
                out.append(("message", raw[6:]))
                continue
            parsed = _event(raw)
            if parsed is not None:
                out.append(parsed)
        return out

    def data(self, piece: bytes) -> list[bytes]:
        """The ``data`` of the message events ``piece`` completed; an ``error`` event fails
        the request. The common read (whole one-line ``data: ...`` events only) is one
        split in all; any other goes through ``feed``."""
        buf = self._rest + piece if self._rest else piece
        if buf[:6] == b"data: " and buf[-2:] == b"\n\n" and b"\r" not in buf:
            # whole one-line events only (JSON escapes its newlines): one split in all
            n = buf.count(b"\n\n")
            if buf.count(b"\n") == 2 * n and buf.count(b"data: ") == n:
                self._rest = b""
                return buf[6:-2].split(b"\n\ndata: ")
        return _message_data(self.feed(piece))

    def close_data(self) -> list[bytes]:
        return _message_data(self.close())

    def close(self) -> list[tuple[str, bytes]]:
        """What an unterminated last event held (a stream may end without a blank line)."""
        rest, self._rest = self._rest, b""
        parsed = _event(rest) if rest.strip() else None
        return [parsed] if parsed is not None else []


def _message_data(events: list[tuple[str, bytes]]) -> list[bytes]:
    for event, data in events:
        if event == "error":
            raise RequestFailed(f"server error event: {data[:300].decode(errors='replace')}")
    return [data for _, data in events]


async def sse_events(chunks: AsyncIterable[bytes]) -> AsyncIterator[tuple[str, bytes]]:
    """:class:`EventSplitter` over an async byte stream."""
    splitter = EventSplitter()
    async for piece in chunks:
        for parsed in splitter.feed(piece):
            yield parsed
    for parsed in splitter.close():
        yield parsed


def _event(raw: bytes) -> tuple[str, bytes] | None:
    event, data = "message", []
    for line in raw.split(b"\n"):
        name, _, value = line.partition(b":")
        if name == b"data":
            data.append(value.removeprefix(b" "))
        elif name == b"event":
            event = value.removeprefix(b" ").decode("utf-8", errors="replace")
    return (event, b"\n".join(data)) if data else None
