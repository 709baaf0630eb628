"""Any OpenAI-compatible endpoint (vLLM, trtllm-serve, LMDeploy api_server, SGLang, ...).

Streams completions or chat over SSE with httpx + httpx-sse, one event at a time. Token
counts come from the server's running usage (``stream_options.continuous_usage_stats``)
where offered: the difference between successive ``completion_tokens`` is the number of
tokens a chunk carried, even when its text is empty. Without running usage, a chunk with
text counts as one token and ``describe()`` says so. An HTTP error, an in-band error
event or a stream that ends without ``[DONE]`` fails the request.

The API key is read from the environment variable named by ``api_key_env`` and never
appears in ``describe()``, records or logs.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from harness.engine import (
    Availability,
    BatchingMode,
    Capabilities,
    Chunk,
    EngineConfig,
    EngineError,
    Family,
    GenerationRequest,
    RequestError,
    reject_unknown_options,
)

OPTIONS = {
    "base_url": "server root, e.g. http://127.0.0.1:8000 (absent: the harness starts vLLM)",
    "served_model": "model name on the server (default: the first of /v1/models)",
    "api": "completions (default) or chat",
    "api_key_env": "environment variable that holds the API key (default: OPENAI_API_KEY)",
    "timeout_s": "per-request timeout in seconds (default: 300)",
    "ignore_eos_field": "1 (default): send vLLM's ignore_eos so lengths are what was asked",
}


class RequestFailed(RequestError):
    """One request failed (HTTP status, in-band error, truncated stream)."""


class StreamState:
    """Turns parsed SSE payloads into chunks; pure, so it is tested on recorded streams."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.done = False
        self.last_completion_tokens: int | None = None
        self.running_usage = False
        self._texts: list[str] = []

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
        text, finish = "", None
        if choices:
            choice = choices[0]
            text = (
                (choice.get("delta") or {}).get("content") or ""
                if self.api == "chat"
                else choice.get("text") or ""
            )
            finish = choice.get("finish_reason")
        usage = event.get("usage") or {}
        completion = usage.get("completion_tokens")
        if not choices:
            # the final usage-only chunk: totals, no new tokens
            return Chunk(
                n_tokens=0, completion_tokens=completion, prompt_tokens=usage.get("prompt_tokens")
            )
        self._texts.append(text)
        if completion is not None:
            self.running_usage = True
            n = completion - (self.last_completion_tokens or 0)
            self.last_completion_tokens = completion
        else:
            n = 1 if text else 0
        return Chunk(
            n_tokens=max(n, 0),
            text=text,
            completion_tokens=completion,
            prompt_tokens=usage.get("prompt_tokens"),
            finish_reason=finish,
        )

    def close(self) -> None:
        if not self.done:
            raise RequestFailed("stream truncated: ended without [DONE]")

    @property
    def text(self) -> str:
        return "".join(self._texts)


class OpenAIEngine:
    name: ClassVar[str] = "openai"
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.GENERATIVE,
        devices=frozenset({"cpu", "cuda"}),
        native_batching=frozenset({BatchingMode.CONTINUOUS}),
        streaming=True,
    )

    def __init__(self, config: EngineConfig) -> None:
        self.validate_options(config.options)
        self.config = config
        o = config.options
        self.base_url = o.get("base_url", "").rstrip("/")
        self.api = o.get("api", "completions")
        self.key_env = o.get("api_key_env", "OPENAI_API_KEY")
        self.timeout = float(o.get("timeout_s", "300"))
        self.served_model = o.get("served_model", "")
        self.ignore_eos_field = o.get("ignore_eos_field", "1") == "1"
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tokenizer: Any = None
        self._server_version: str | None = None
        self.saw_running_usage: bool | None = None

    @classmethod
    def probe(cls, device: str) -> Availability:
        for module in ("httpx", "httpx_sse"):
            if importlib.util.find_spec(module) is None:
                return Availability(
                    False, f"{module} is not installed (pip install 'inference-harness[openai]')"
                )
        return Availability(True)

    @classmethod
    def validate_options(cls, options: Mapping[str, str]) -> None:
        reject_unknown_options(options, OPTIONS)
        if options.get("api", "completions") not in ("completions", "chat"):
            raise ValueError("api must be completions or chat")
        url = options.get("base_url", "")
        if url and not url.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://")
        try:
            if float(options.get("timeout_s", "300")) <= 0:
                raise ValueError
        except ValueError:
            raise ValueError("timeout_s must be a positive number") from None

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.key_env)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _sync_client(self) -> Any:
        """For the few calls outside the measured stream (model list, version, /metrics)."""
        import httpx  # noqa: PLC0415

        return httpx.Client(base_url=self.base_url, headers=self._headers(), timeout=10.0)

    def load(self) -> None:
        import httpx  # noqa: PLC0415

        if not self.base_url:
            raise EngineError(
                "openai needs --engine-opt openai.base_url=URL (or a harness-started server)"
            )
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers(),
            timeout=httpx.Timeout(self.timeout, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        with self._sync_client() as sync:
            try:
                models = sync.get("/v1/models")
                models.raise_for_status()
            except httpx.HTTPError as exc:
                raise EngineError(f"OpenAI endpoint {self.base_url} not usable: {exc}") from exc
            served = [m["id"] for m in models.json().get("data", [])]
            if not self.served_model:
                if not served:
                    raise EngineError(f"{self.base_url}/v1/models lists no model")
                self.served_model = served[0]
            version = sync.get("/version")
            self._server_version = (
                version.json().get("version") if version.status_code == 200 else None
            )
        self._tokenizer = _client_tokenizer(self.config.model)

    def counters(self) -> dict[str, float]:
        """The server's Prometheus counters and histogram sums/counts, summed over labels."""
        from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

        with self._sync_client() as sync:
            resp = sync.get("/metrics")
        if resp.status_code != 200:
            return {}
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(resp.text):
            for sample in family.samples:
                if sample.name.endswith(("_sum", "_count", "_total")):
                    totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
        return totals

    def describe(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "version": self._server_version,
            "base_url": self.base_url,
            "served_model": self.served_model,
            "api": self.api,
            "api_key_env": self.key_env,
            "api_key": "set" if os.environ.get(self.key_env) else "unset",
            "token_counts": "server running usage"
            if self.saw_running_usage
            else (
                "one per text chunk (no running usage seen)"
                if self.saw_running_usage is False
                else "unknown yet"
            ),
            "ignore_eos_field": self.ignore_eos_field,
            "client": {"library": "httpx+httpx-sse", "timeout_s": self.timeout},
            "client_retokenization": str(self.config.model) if self._tokenizer else None,
        }

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.served_model,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if self.ignore_eos_field:
            body["ignore_eos"] = request.ignore_eos
        if self.api == "chat":
            text = (
                request.prompt
                if isinstance(request.prompt, str)
                else " ".join(map(str, request.prompt))
            )
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = (
                list(request.prompt) if isinstance(request.prompt, tuple) else request.prompt
            )
        return body

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        from httpx_sse import aconnect_sse  # noqa: PLC0415

        if self._client is None:
            raise EngineError("engine not loaded: call load() first")
        self._loop = asyncio.get_running_loop()
        path = "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        state = StreamState(self.api)
        async with aconnect_sse(self._client, "POST", path, json=self.payload(request)) as source:
            response = source.response
            if response.status_code != 200:
                body = (await response.aread())[:300].decode(errors="replace")
                raise RequestFailed(f"HTTP {response.status_code}: {body}")
            async for sse in source.aiter_sse():
                if sse.event == "error":
                    raise RequestFailed(f"server error event: {sse.data[:300]}")
                chunk = state.feed(sse.data)
                if chunk is not None:
                    yield chunk
        state.close()
        if self._tokenizer is not None:
            ids = self._tokenizer.encode(state.text, add_special_tokens=False)
            yield Chunk(n_tokens=0, retokenized=len(ids))
        self.saw_running_usage = state.running_usage

    def close(self) -> None:
        client, self._client = self._client, None
        loop, self._loop = self._loop, None
        if client is None:
            return
        # The connection pool belongs to the loop that used it; close it there.
        if loop is not None and not loop.is_closed() and not loop.is_running():
            loop.run_until_complete(client.aclose())
        elif loop is None:
            asyncio.run(client.aclose())


def _client_tokenizer(model: Path) -> Any:
    """The model's tokenizer for client-side re-tokenization, when it is a local directory
    and transformers is installed; None otherwise (counts then rest on server usage)."""
    if not (model.is_dir() and (model / "tokenizer_config.json").is_file()):
        return None
    if importlib.util.find_spec("transformers") is None:
        return None
    from transformers import AutoTokenizer  # noqa: PLC0415

    return AutoTokenizer.from_pretrained(str(model))
