"""The pooling contract: embeddings, scores and reranking, one request to one result.

A pooling request is not streamed: its latency is the whole request's, and its work is
counted in inputs and in prompt tokens. ``embed`` turns each input into a vector (the
OpenAI ``/v1/embeddings`` API); ``score`` and ``rerank`` relate one query to each input
(vLLM's ``/v1/score`` and ``/v1/rerank``, or a cross-encoder in process).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from harness.engine.contract import POOLING_KINDS, Engine

PoolingKind = Literal["embed", "score", "rerank"]


@dataclass(frozen=True)
class PoolingRequest:
    """A batch of inputs for one pooling call: texts or token ids; ``query`` is what a
    ``score`` or ``rerank`` request relates them to (empty for ``embed``)."""

    inputs: tuple[str | tuple[int, ...], ...]
    kind: PoolingKind = "embed"
    query: str = ""
    request_id: str = ""

    def __post_init__(self) -> None:
        if self.kind not in POOLING_KINDS:
            raise ValueError(f"pooling kind {self.kind!r} is not one of {sorted(POOLING_KINDS)}")
        if not self.inputs:
            raise ValueError("a pooling request needs at least one input")
        if any(not item for item in self.inputs):
            raise ValueError("a pooling input is empty")
        if (self.kind == "embed") == bool(self.query):
            raise ValueError("score and rerank requests need a query; embed requests take none")


@dataclass(frozen=True)
class PoolingResult:
    """What the engine returned: one vector (``dims`` long) or one score per input, and the
    prompt tokens it counted (None where it does not say)."""

    n_outputs: int
    dims: int = 0
    scores: tuple[float, ...] = ()
    prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.n_outputs < 1:
            raise ValueError("a pooling result has at least one output")
        if self.scores and len(self.scores) != self.n_outputs:
            raise ValueError("one score per output")
        if self.dims < 0 or (self.prompt_tokens is not None and self.prompt_tokens < 0):
            raise ValueError("dims and prompt_tokens are counts (>= 0)")


@runtime_checkable
class PoolingEngine(Engine, Protocol):
    """Serves pooling requests (``capabilities.pooling`` says which kinds)."""

    async def pool(self, request: PoolingRequest) -> PoolingResult: ...
