"""Any OpenAI-compatible endpoint (vLLM, trtllm-serve, LMDeploy api_server, SGLang, ...).

The endpoint follows the request (``api=auto``, the default): a chat conversation goes to
``/v1/chat/completions`` as ``messages``; a text prompt, or token ids (which vLLM takes
as a list), to ``/v1/completions``. ``api=completions`` or ``api=chat`` forces one API: a
chat request to completions, or token ids to chat, is then an error saying so; a text
prompt sent to chat is one user message.

A server needs nothing local: the model name sent is ``served_model`` or the first of
the server's ``GET /v1/models`` (a request on a LoRA adapter sends the adapter's name, as
vLLM's server selects one); the run's model path is used only to re-tokenize
replies on the client, when it is a local Hugging Face directory with a tokenizer and
transformers is installed (otherwise it may be absent or any name: counts then rest on
the server's usage alone). Nothing here imports torch.

Streams completions or chat over SSE on the harness's own HTTP/1.1 client
(engines/openai_wire.py: keep-alive connections as asyncio protocols, httptools, orjson,
uvloop; httpx and then aiohttp served before it, see docs/measurements.md). Token counts
come from the server's usage in the stream (``stream_options.include_usage``:
``prompt_tokens`` and ``completion_tokens``, passed on in the chunks), running usage
(``continuous_usage_stats``) where offered: the difference between successive
``completion_tokens`` is the number of tokens an event carried, even when its text is
empty. Without running usage, an event with text counts as one token and ``describe()``
says so. The events that one read of the socket brought are one chunk, stamped when the
read returned (the client cannot tell apart what reached it together). An HTTP error, an
in-band error event or a stream that ends without ``[DONE]`` fails the request.

``dialect`` says what the server's API takes. ``vllm`` (the default, and what SGLang,
trtllm-serve and LMDeploy take too): token-id prompts as lists, the ``ignore_eos`` field.
``transformers`` (Hugging Face ``transformers serve``, engines/transformers_server.py):
text prompts only, so token ids are decoded with the run's tokenizer and the server
tokenizes them again (its count is the prompt's); the end of sequence ignored through
the request's ``generation_config`` (``eos_token_id: -1``); a stream ends at its last
chunk, without ``[DONE]``.

A reasoning model's thinking, where the server separates it from the answer (vLLM with
``--reasoning-parser``, SGLang, DeepSeek, Ollama, OpenRouter...), comes beside the
answer's ``content`` as ``delta.reasoning`` or ``delta.reasoning_content``; its tokens
are counted like the answer's and marked as reasoning (``Chunk.reasoning_tokens``).

The API key is read from the environment variable named by ``api_key_env`` and never
appears in ``describe()``, records or logs.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import json
import os
import time
from collections.abc import AsyncIterator, Collection, Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from engines import openai_pooling, vllm_media, vllm_speculative
from engines.openai_media import chat_messages
from engines.openai_stream import (
    EventSplitter,
    RequestFailed,
    StreamState,
    dumps,
    loads,
    sse_events,
    status_failure,
)
from engines.openai_wire import Origin, Pool, Response, head, post, send_now
from engines.vllm_lora import check_modules, check_rank
from engines.vllm_pooling import RUNNERS
from engines.vllm_server import FEATURES, SERVER_DEFAULTS
from harness.engine import (
    POOLING_KINDS,
    Availability,
    BatchingMode,
    Capabilities,
    Chunk,
    EngineConfig,
    EngineError,
    Family,
    GenerationRequest,
    Message,
    PoolingRequest,
    PoolingResult,
    counter_totals,
)
from harness.engine.optionschema import OptionSchema, choice, custom, flag, integer, number, text

# the stream's parsing lives in engines/openai_stream.py; its names are this engine's API too
__all__ = [
    "OPTIONS",
    "OpenAIEngine",
    "RequestFailed",
    "StreamState",
    "server_conflict",
    "sse_events",
]


def _base_url(url: str) -> str:
    if url and not url.startswith(("http://", "https://")):
        raise ValueError("base_url must start with http:// or https://")
    return url


APIS = ("auto", "completions", "chat")
SERVERS = ("vllm", "transformers")
DIALECTS = ("vllm", "transformers")
KEEPALIVE_S = 3.0
"""How long an idle connection is kept for the next request: under uvicorn's 5 s (vLLM's and
transformers serve's servers), so that the client never sends on a connection the server
is closing (aiohttp's default, 15 s, once lost a request to "Can not write request body"
after a pause between a cell's phases)."""
IGNORE_EOS_CONFIG = json.dumps({"eos_token_id": -1})
"""transformers serve's way to ignore the end of sequence: no token id is -1."""
OPTIONS = OptionSchema(
    custom(
        "base_url",
        "server root, e.g. http://127.0.0.1:8000 (absent: the harness starts one: server)",
        _base_url,
        "http(s)://HOST[:PORT]",
    ),
    text("served_model", "model name on the server (default: the first of /v1/models)"),
    choice(
        "api",
        "the OpenAI API streamed (auto: chat requests to chat, text and token ids to completions)",
        APIS,
        default="auto",
    ),
    text("api_key_env", "environment variable that holds the API key", default="OPENAI_API_KEY"),
    number(
        "timeout_s",
        "per-request timeout in seconds (between reads of the stream)",
        default="300",
        low=0,
        exclusive=True,
        must="a positive number",
    ),
    flag(
        "ignore_eos_field",
        "send vLLM's ignore_eos (true: lengths are what was asked; false: natural end)",
        default="1",
    ),
    integer(
        "max_num_seqs",
        "the harness-started vLLM server's --max-num-seqs (not with base_url: that server"
        " has its own; transformers serve has no such flag)",
        default=SERVER_DEFAULTS["max_num_seqs"],
    ),
    integer(
        "max_num_batched_tokens",
        "the harness-started server's tokens per batch (vLLM's --max-num-batched-tokens,"
        " transformers serve's --cb-max-batch-tokens; not with base_url)",
        default=SERVER_DEFAULTS["max_num_batched_tokens"],
    ),
    choice(
        "server",
        "the server the harness starts when base_url is absent: vllm, or transformers"
        " (transformers serve with continuous batching; sets dialect=transformers)",
        SERVERS,
        default="vllm",
    ),
    choice(
        "dialect",
        "what the server's API takes: vllm (token-id prompts, ignore_eos), transformers"
        " (transformers serve: text prompts, generation_config; default with"
        " server=transformers)",
        DIALECTS,
        default="vllm",
    ),
    custom(
        "lora_modules",
        "the harness-started vLLM server's LoRA adapters (--lora-modules; --lora sets it);"
        " a request names its adapter as the model",
        check_modules,
        "NAME=DIR[,NAME=DIR...]",
    ),
    custom("max_lora_rank", "the harness-started server's --max-lora-rank", check_rank, "8|16|..."),
    vllm_media.SERVER_MODEL_IMPL,  # --model-impl of the harness-started server
    choice(
        "runner",
        "the harness-started vLLM server's runner: generate, or pooling (--runner pooling:"
        " /v1/embeddings, /v1/score, /v1/rerank; the pooling workloads set it)",
        RUNNERS,
        default="generate",
    ),
    custom(
        "speculative",
        "the harness-started vLLM server's speculative decoding (--speculative-config): off,"
        " ngram[:K[:MAX[:MIN]]] or JSON",
        vllm_speculative.check,
        "off|ngram[:K[:MAX[:MIN]]]|JSON",
    ),
)
SERVER_OPTIONS = (*SERVER_DEFAULTS, *FEATURES, "server")
"""Options that set the server the harness starts, not the client."""


def dialect_of(options: Mapping[str, str]) -> str:
    """The dialect given, else the one of the server the harness starts (transformers serve
    speaks its own), else vLLM's."""
    if "dialect" in options:
        return options["dialect"]
    return "transformers" if options.get("server") == "transformers" else "vllm"


def server_conflict(options: Mapping[str, str]) -> str | None:
    """Why ``options`` cannot be used together (server settings for a server the user
    runs), or None."""
    if options.get("server") == "transformers" and options.get("dialect") == "vllm":
        return (
            "server=transformers takes the transformers dialect (text prompts, no ignore_eos"
            " field); leave dialect unset"
        )
    chosen = sorted(k for k in SERVER_OPTIONS if k in options)
    if chosen and options.get("base_url"):
        return (
            f"{', '.join(chosen)} set{'s' if len(chosen) == 1 else ''} the server the"
            " harness starts; the server at base_url runs with its own settings (benchmark"
            " it started each way, and compare the runs)"
        )
    return None


class OpenAIEngine:
    name: ClassVar[str] = "openai"
    option_schema: ClassVar[OptionSchema] = OPTIONS
    network_client: ClassVar[bool] = True  # --clients N: N processes may share its load
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.GENERATIVE,
        devices=frozenset({"cpu", "cuda"}),
        native_batching=frozenset({BatchingMode.CONTINUOUS}),
        streaming=True,
        lora=True,  # a request's adapter is the model it names (vLLM's --lora-modules)
        modalities=frozenset({"image"}),  # image_url parts; the server decides if it takes them
        pooling=POOLING_KINDS,  # /v1/embeddings, /v1/score, /v1/rerank: engines/openai_pooling.py
    )

    def __init__(self, config: EngineConfig) -> None:
        # the server settings were checked against the user's base_url when the run was
        # configured; here base_url may be the server the harness started with them
        OPTIONS.validate(config.options)
        self.config = config
        o = OPTIONS.resolve(config.options)
        self.base_url = o.get("base_url", "").rstrip("/")
        self._path = urlsplit(self.base_url).path  # a prefix the server is mounted under
        self._request_headers: dict[str, str] = {}
        self.api = o["api"]
        self.key_env = o["api_key_env"]
        self.timeout = float(o["timeout_s"])
        self.served_model = o.get("served_model", "")
        self.ignore_eos_field = o["ignore_eos_field"] == "1"
        self.dialect = dialect_of(config.options)
        self._client: Pool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tokenizer: Any = None
        self._server_version: str | None = None
        self.saw_running_usage: bool | None = None
        self._loaded = False
        self._scrape_client: Any = None  # kept alive between scrapes of /metrics
        self._scrape_by_name: bool | None = None  # None: not tried yet
        self._no_metrics = False

    @classmethod
    def probe(cls, device: str) -> Availability:
        for module in ("httptools", "httpx"):
            if importlib.util.find_spec(module) is None:
                return Availability(
                    False, f"{module} is not installed (pip install 'inference-harness[openai]')"
                )
        return Availability(True)

    @classmethod
    def validate_options(cls, options: Mapping[str, str]) -> None:
        OPTIONS.validate(options)
        conflict = server_conflict(options)
        if conflict:
            raise ValueError(conflict)

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
        self._request_headers = self._headers()
        self._loaded = True

    def counters(self) -> dict[str, float]:
        """The server's Prometheus counters and histogram sums/counts, summed over labels."""
        with self._sync_client() as sync:
            resp = sync.get("/metrics")
        if resp.status_code != 200:
            return {}
        return counter_totals(resp.text)

    def metrics_text(self, names: Collection[str] | None = None) -> str:
        """The server's Prometheus text, over one kept-alive connection (the harness
        scrapes it a few times a second from one thread). ``names``: asked for as
        prometheus_client's exposition takes them (``/metrics/?name[]=...``, which vLLM's
        /metrics mount serves): on the vLLM CPU server that is 3 KB instead of 74 KB and
        1.9 ms of the server's CPU instead of 4.9 ms per scrape. A server that does not
        answer so with any of them is asked for its whole ``/metrics`` from then on; one
        that has none (404: transformers serve) is not asked again, so that scraping does
        not load the server it measures."""
        if self._no_metrics:
            raise EngineError(f"{self.base_url} has no /metrics (HTTP 404 when first asked)")
        if self._scrape_client is None:
            self._scrape_client = self._sync_client()
        if names and self._scrape_by_name is not False:
            query = [("name[]", n) for n in sorted(names)]
            resp = self._scrape_client.get("/metrics/", params=query)
            if self._scrape_by_name:  # known to work: a failure now is this scrape's
                resp.raise_for_status()
                return str(resp.text)
            self._scrape_by_name = resp.status_code == 200 and any(n in resp.text for n in names)
            if self._scrape_by_name:
                return str(resp.text)
        resp = self._scrape_client.get("/metrics")
        self._no_metrics = resp.status_code == 404
        resp.raise_for_status()
        return str(resp.text)

    def describe(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "version": self._server_version or "unknown (the server answers no /version)",
            "device": self.config.device,
            "effective": {
                "base_url": self.base_url,
                "served_model": self.served_model,
                "api": self.api,
                "ignore_eos_field": self.ignore_eos_field,
                "dialect": self.dialect,
                "timeout_s": self.timeout,
            },
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
            "dialect": self.dialect,
            "token_id_prompts": "decoded to text; the server tokenizes them again"
            if self.dialect == "transformers"
            else "sent as token ids",
            "client": self._client_info(),
            "client_retokenization": str(self.config.model) if self._tokenizer else None,
        }

    def _client_info(self) -> dict[str, Any]:
        loop = type(self._loop).__module__.split(".")[0] if self._loop else "none yet"
        return {
            "library": f"engines/openai_wire.py on httptools {_version('httptools')}",
            "event_loop": loop,
            "json": loads.__module__,
            "timeout_s": self.timeout,
        }

    def endpoint(self, request: GenerationRequest) -> str:
        """The API ``request`` goes to, ``chat`` or ``completions``: the request's own with
        ``api=auto``, else the one forced, if that API can take the request."""
        kind = request.kind
        if self.api == "auto":
            return "chat" if kind == "chat" else "completions"
        if self.api == "completions" and kind == "chat":
            raise EngineError(
                "a chat request cannot go to the completions API (openai.api=completions);"
                " use openai.api=auto or chat"
            )
        if self.api == "chat" and kind == "tokens":
            raise EngineError(
                "a token-id prompt cannot go to the chat API (openai.api=chat), which takes"
                " messages; use openai.api=auto or completions"
            )
        return self.api

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.lora or self.served_model,  # an adapter is served as a model
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": True,
            # usage in the stream: prompt and completion tokens as the server counted them
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if self.dialect == "transformers":
            # its API refuses fields it does not know (HTTP 422)
            body["stream_options"] = {"include_usage": True}
            if request.ignore_eos:
                body["generation_config"] = IGNORE_EOS_CONFIG
        elif self.ignore_eos_field:
            body["ignore_eos"] = request.ignore_eos  # false: the reply ends at the EOS
        if self.endpoint(request) == "chat":
            messages = request.messages or (Message("user", str(request.prompt)),)
            body["messages"] = chat_messages(messages, request.images)  # images: image_url parts
        elif isinstance(request.prompt, tuple):
            body["prompt"] = self._token_prompt(request.prompt)
        else:
            body["prompt"] = request.prompt
        return body

    def _token_prompt(self, ids: tuple[int, ...]) -> list[int] | str:
        if self.dialect != "transformers":
            return list(ids)
        if self._tokenizer is None:
            raise EngineError(
                "openai.dialect=transformers sends token-id prompts as text, which needs the"
                " run's tokenizer: a local model directory with one, and transformers installed"
            )
        return str(self._tokenizer.decode(ids))

    def _pool(self) -> Pool:
        """The connection pool, made in the loop that uses it (connections belong to one)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            if self._client is not None:
                self._client.close()
            self._loop = loop
            origin = Origin.of(self.base_url)
            self._client = Pool(origin, KEEPALIVE_S, headers=self._request_headers)
        return self._client

    def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """The request goes out when this is called, on a kept-alive connection where one
        is free (the open-loop driver calls it at the request's due time, so the send is
        not one more turn of the event loop late); the stream is read as it is iterated."""
        if not self._loaded:
            raise EngineError("engine not loaded: call load() first")
        api = self.endpoint(request)
        body = dumps(self.payload(request))
        path = self._path + ("/v1/chat/completions" if api == "chat" else "/v1/completions")
        t_post = time.perf_counter()
        sent = send_now(self._pool(), path, body, self.timeout) if _in_loop() else None
        return self._stream(api, path, body, sent, t_post)

    async def _stream(
        self, api: str, path: str, body: bytes, sent: Response | None, t_post: float
    ) -> AsyncIterator[Chunk]:
        state = StreamState(api, transformers_serve=self.dialect == "transformers")
        if sent is None:
            t_post = time.perf_counter()
            sent = await post(self._pool(), path, body, self.timeout)
        response = await head(sent)
        conn = response.conn
        try:
            # sent to response headers: connection, transfer and the server's admission
            headers_s = conn.t_read - t_post
            if response.status != 200:
                raise status_failure(response.status, await response.read(300))
            splitter = EventSplitter()
            last: list[bytes] = []
            while True:  # Response.pieces, inlined: this loop runs for every read
                if conn.body:
                    datas = splitter.data(conn.take_body())
                    if conn.complete:  # the last read: its chunk also closes the stream
                        last = datas
                        break
                    chunk = state.feed_read(datas, conn.t_read)
                    if chunk is not None:
                        yield chunk
                if conn.complete:
                    break
                await conn.readable()
            read = state.read([*last, *splitter.close_data()])
        finally:
            response.release()
        state.close()
        retokenized = None
        if self._tokenizer is not None:
            retokenized = len(self._tokenizer.encode(state.text, add_special_tokens=False))
        stats = {"http_headers_s": headers_s}
        yield state.last_chunk(read, conn.t_read, retokenized=retokenized, client_stats=stats)
        self.saw_running_usage = state.running_usage

    async def pool(self, request: PoolingRequest) -> PoolingResult:
        """Embeddings, scores or reranking, one POST on the kept-alive connections."""
        if not self._loaded:
            raise EngineError("engine not loaded: call load() first")
        if self.dialect == "transformers":
            raise EngineError("transformers serve has no pooling API (/v1/embeddings)")
        return await openai_pooling.call(
            self._pool(), self._path, self.served_model, request, self.timeout
        )

    async def aclose(self) -> None:
        self._close_pool()

    def close(self) -> None:
        scrape, self._scrape_client = self._scrape_client, None
        if scrape is not None:
            scrape.close()
        self._close_pool()

    def _close_pool(self) -> None:
        pool, self._client, self._loop = self._client, None, None
        if pool is not None:
            pool.close()


def _in_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _client_tokenizer(model: Path | str | None) -> Any:
    """The model's tokenizer for client-side re-tokenization, when it is a local directory
    with a tokenizer and transformers is installed; None otherwise: no model, a name that
    is not a local directory (never fetched from a hub), or no transformers (counts then
    rest on the server's usage)."""
    if model is None or str(model) == "":
        return None
    local = Path(model)
    if not (local.is_dir() and (local / "tokenizer_config.json").is_file()):
        return None
    if importlib.util.find_spec("transformers") is None:
        return None
    from transformers import AutoTokenizer  # noqa: PLC0415

    return AutoTokenizer.from_pretrained(str(local))
