"""What an OpenAI-compatible server streams, turned into the harness's chunks: server-sent
events split from the bytes as they arrive, and each event's text, reasoning and token
counts (running usage where the server sends it, one per text chunk where not). Pure, so
it is tested on recorded streams; engines/openai_http.py sends the requests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any

from harness.engine import Chunk, RequestError


class RequestFailed(RequestError):
    """One request failed (HTTP status, in-band error, truncated stream)."""


class StreamState:
    """Turns parsed SSE payloads into chunks; pure, so it is tested on recorded streams."""

    def __init__(self, api: str, *, transformers_serve: bool = False) -> None:
        """``transformers_serve``: its streams end at their last chunk, without ``[DONE]``,
        and tokens without text of their own (the EOS that ends a reply, a byte of a
        character still incomplete at the end) are counted by its final usage only."""
        self.api = api
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

    def feed(self, data: str) -> Chunk | None:
        """One SSE ``data`` field; returns the chunk it carried (None: nothing to yield)."""
        if data.strip() == "[DONE]":
            self.done = True
            return None
        try:
            event = json.loads(data)
        except json.JSONDecodeError as exc:
            raise RequestFailed(f"malformed SSE data: {data[:120]!r}") from exc
        if not isinstance(event, dict):
            raise RequestFailed(f"unexpected SSE payload: {data[:120]!r}")
        if "error" in event:
            err = event["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise RequestFailed(f"server error event: {message}")
        return self._chunk(event)

    def _chunk(self, event: dict[str, Any]) -> Chunk | None:
        choices = event.get("choices") or []
        text, reasoning, finish = "", "", None
        if choices:
            choice = choices[0]
            # chat: the delta's fields; completions: the choice's own (vLLM's completions
            # API does not separate reasoning: there it stays empty)
            fields = (choice.get("delta") or {}) if self.api == "chat" else choice
            text = fields.get("content" if self.api == "chat" else "text") or ""
            reasoning = _reasoning_text(fields)
            finish = choice.get("finish_reason")
            self.finished = self.finished or finish is not None
        usage = event.get("usage") or {}
        completion = usage.get("completion_tokens")
        if not choices:
            # the final usage-only chunk: totals, and no new tokens but (transformers serve)
            # those that came without text, which only its count shows
            late = 0 if self.needs_done or completion is None else completion - self.counted
            return Chunk(
                n_tokens=max(late, 0),
                completion_tokens=completion,
                prompt_tokens=usage.get("prompt_tokens"),
            )
        self._texts.append(reasoning + text)  # re-tokenized whole: all of the output
        if completion is not None:
            self.running_usage = True
            n = completion - (self.last_completion_tokens or 0)
            self.last_completion_tokens = completion
        else:
            n = (1 if text else 0) + (1 if reasoning else 0)
        n = max(n, 0)
        self.counted += n
        return Chunk(
            n_tokens=n,
            text=text,
            completion_tokens=completion,
            prompt_tokens=usage.get("prompt_tokens"),
            finish_reason=finish,
            reasoning_tokens=self._reasoning_tokens(n, reasoning, text, usage),
        )

    def _reasoning_tokens(self, n: int, reasoning: str, text: str, usage: Any) -> int:
        """How many of a chunk's ``n`` tokens are reasoning: the difference of the server's
        running count where it keeps one (vLLM's continuous usage with a reasoning parser
        that counts: ``completion_tokens_details.reasoning_tokens``), else by the chunk's
        text: all when it is reasoning only, none when it is answer only, split by length
        when it has both (at least one of each); a chunk without text (a token whose text
        comes later) belongs to the part under way."""
        if reasoning or text:
            self._thinking = not text
        details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
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


REASONING_FIELDS = ("reasoning_content", "reasoning")
"""Where OpenAI-compatible servers stream reasoning beside ``content``: vLLM 0.32 sends
``reasoning`` (as do OpenRouter and Ollama), earlier vLLM, DeepSeek, SGLang and
TensorRT-LLM ``reasoning_content``. A server that sends both sends the same text twice."""


def _reasoning_text(fields: Mapping[str, Any]) -> str:
    for name in REASONING_FIELDS:
        value = fields.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


async def sse_events(chunks: AsyncIterable[bytes]) -> AsyncIterator[tuple[str, str]]:
    """Server-sent events as ``(event, data)`` from a byte stream in arbitrary pieces.

    SSE: ``field: value`` lines, a blank line ends an event, ``:`` starts a comment.
    Splitting whole received pieces, not reading line by line, keeps the client's cost
    per streamed request low enough not to be the bottleneck."""
    buf = b""
    async for piece in chunks:
        buf = (buf + piece).replace(b"\r\n", b"\n")
        *complete, buf = buf.split(b"\n\n")
        for raw in complete:
            parsed = _event(raw)
            if parsed is not None:
                yield parsed
    if buf.strip():
        parsed = _event(buf)
        if parsed is not None:
            yield parsed


def _event(raw: bytes) -> tuple[str, str] | None:
    event, data = "message", []
    for line in raw.decode("utf-8", errors="replace").split("\n"):
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value.removeprefix(" "))
        elif name == "event":
            event = value.removeprefix(" ")
    return (event, "\n".join(data)) if data else None
