"""Pooling requests over HTTP: ``/v1/embeddings``, ``/v1/score`` and ``/v1/rerank``.

The openai engine's ``pool`` (engines/openai_http.py) sends one request per
``PoolingRequest`` on its kept-alive connections (engines/openai_wire.py) and reads the
whole JSON answer:

* ``embed`` -> ``POST /v1/embeddings`` ``{"model", "input": [...], "encoding_format":
  "float"}`` (texts, or token-id lists, which vLLM and OpenAI take); the answer's ``data``
  holds one ``embedding`` per input, by ``index``;
* ``score`` -> ``POST /v1/score`` ``{"model", "text_1": query, "text_2": [...]}`` (the
  field names every vLLM release with the API takes); ``data`` holds one ``score`` per
  input;
* ``rerank`` -> ``POST /v1/rerank`` ``{"model", "query", "documents": [...]}`` (vLLM's,
  Jina's and Cohere's shape); ``results`` holds one ``relevance_score`` per document,
  ordered by score, each with its ``index``.

Prompt tokens are the server's ``usage.prompt_tokens`` (None where it sends no usage).
An HTTP error, an answer that is not JSON, or one whose outputs do not match the inputs
one for one fails the request (``RequestFailed``) with what was wrong.
"""

from __future__ import annotations

from typing import Any

from engines.openai_stream import RequestFailed, dumps, loads, status_failure
from engines.openai_wire import Pool, head, post
from harness.engine import EngineError, PoolingRequest, PoolingResult

PATHS = {"embed": "/v1/embeddings", "score": "/v1/score", "rerank": "/v1/rerank"}
MAX_ANSWER = 1 << 28
"""The most bytes of an answer read (256 MiB: 64 inputs of 4096 floats as JSON are ~5 MB)."""


def payload(request: PoolingRequest, model: str) -> tuple[str, dict[str, Any]]:
    """The path and JSON body ``request`` is sent as."""
    if request.kind == "embed":
        inputs = [item if isinstance(item, str) else list(item) for item in request.inputs]
        return PATHS["embed"], {"model": model, "input": inputs, "encoding_format": "float"}
    texts = [item for item in request.inputs if isinstance(item, str)]
    if len(texts) != len(request.inputs):
        raise EngineError(
            f"{PATHS[request.kind]} takes texts: a {request.kind} request's inputs cannot"
            " be token ids"
        )
    if request.kind == "score":
        return PATHS["score"], {"model": model, "text_1": request.query, "text_2": texts}
    return PATHS["rerank"], {"model": model, "query": request.query, "documents": texts}


def parse(request: PoolingRequest, status: int, body: bytes) -> PoolingResult:
    """The result of ``request`` from the server's answer (``status``, ``body``)."""
    if status != 200:
        raise status_failure(status, body)
    try:
        answer = loads(body)
    except ValueError as exc:
        raise RequestFailed(f"the answer is not JSON: {body[:120]!r}") from exc
    if not isinstance(answer, dict):
        raise RequestFailed(f"the answer is not a JSON object: {body[:120]!r}")
    n = len(request.inputs)
    tokens = _prompt_tokens(answer)
    if request.kind == "embed":
        vectors = _by_index(answer, "data", "embedding", n)
        dims = {len(v) if isinstance(v, list) else -1 for v in vectors}
        if len(dims) != 1 or min(dims) < 1:
            raise RequestFailed("the embeddings are not float lists of one length")
        return PoolingResult(n_outputs=n, dims=dims.pop(), prompt_tokens=tokens)
    if request.kind == "score":
        scores = _by_index(answer, "data", "score", n)
    else:
        scores = _by_index(answer, "results", "relevance_score", n)
    if not all(isinstance(s, int | float) for s in scores):
        raise RequestFailed(f"the {request.kind} answer holds scores that are not numbers")
    return PoolingResult(n_outputs=n, scores=tuple(float(s) for s in scores), prompt_tokens=tokens)


def _by_index(answer: dict[str, Any], key: str, field: str, n: int) -> list[Any]:
    """``answer[key]``'s ``field`` values in input order (by each item's ``index``);
    exactly one per input, or the request failed."""
    items = answer.get(key)
    if not isinstance(items, list):
        raise RequestFailed(f"the answer has no {key!r} list (keys: {sorted(answer)})")
    found: dict[int, Any] = {}
    for item in items:
        if not isinstance(item, dict) or field not in item:
            raise RequestFailed(f"an item of {key!r} has no {field!r}")
        found[int(item.get("index", len(found)))] = item[field]
    if sorted(found) != list(range(n)):
        raise RequestFailed(f"the answer has {len(items)} {key!r} items for {n} inputs")
    return [found[i] for i in range(n)]


def _prompt_tokens(answer: dict[str, Any]) -> int | None:
    usage = answer.get("usage")
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) and value >= 0 else None


async def call(
    pool: Pool, prefix: str, model: str, request: PoolingRequest, timeout_s: float
) -> PoolingResult:
    """Send ``request`` on ``pool`` (the server mounted under ``prefix``) and read its
    whole answer."""
    path, body = payload(request, model)
    response = await head(await post(pool, prefix + path, dumps(body), timeout_s))
    try:
        data = await response.read(MAX_ANSWER)
        if not response.conn.complete and response.status == 200:
            raise RequestFailed(f"the answer is over {MAX_ANSWER} bytes")
    finally:
        response.release()
    return parse(request, response.status, data)
