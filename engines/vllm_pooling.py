"""Pooling requests on an in-process vLLM ``AsyncLLM`` started with ``runner=pooling``.

vLLM 0.32 serves pooling in process through ``AsyncLLM.encode(prompt, PoolingParams(
task=...), request_id)``, one prompt per call, each answered by one
``PoolingRequestOutput`` (its ``outputs.data`` the pooled tensor, its
``prompt_token_ids`` what the model read). A request of N inputs is N encodes sent at
once, so the engine batches them as its server would batch an ``input`` list.

* ``embed``: each input's vector (``task="embed"``, normalized as the model's pooler does).
* ``score`` / ``rerank`` on an embedding model: the query and every input embedded, and
  each input scored by the cosine similarity of its vector with the query's: vLLM's own
  bi-encoder scoring (``entrypoints/pooling/scoring/io_processor.py``), which its
  ``/v1/score`` and ``/v1/rerank`` run for such a model. Prompt tokens are the query's
  once and each input's, as that server counts them. ``rerank`` gives the same scores
  (the server's answer orders them; the contract keeps input order).
* A cross-encoder (a sequence classifier with one label) reads a query and an input as
  one sequence, which vLLM's server renders through its scoring processors; in process
  this adapter does not render such pairs, and says so: measure it through the server
  (``--engine=openai``), whose ``/v1/score`` does.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from typing import Any

from harness.engine import EngineError, PoolingRequest, PoolingResult

RUNNERS = ("generate", "pooling")

_ids = itertools.count()


def pooling_args(options: Mapping[str, str]) -> dict[str, Any]:
    """The AsyncEngineArgs of the adapter's ``runner`` option: none for generation (vLLM
    then picks the runner it always did); ``runner="pooling"`` for pooling, which turns
    a generative checkpoint into an embedding model (vLLM's ``--convert auto``)."""
    return {"runner": "pooling"} if options.get("runner") == "pooling" else {}


class VllmPooler:
    """Answers pooling requests on a loaded ``AsyncLLM`` (the adapter's ``pool``)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self._tasks: tuple[str, ...] | None = None

    async def tasks(self) -> tuple[str, ...]:
        """What the loaded model serves (``generate``; ``embed``, ``classify``, ...)."""
        if self._tasks is None:
            self._tasks = tuple(await self.llm.get_supported_tasks())
        return self._tasks

    async def pool(self, request: PoolingRequest) -> PoolingResult:
        tasks = await self.tasks()
        if "embed" not in tasks:
            raise EngineError(_why_not(tasks))
        if request.kind == "embed":
            outputs = await _encode_all(self.llm, request.inputs)
            return PoolingResult(
                n_outputs=len(outputs),
                dims=int(outputs[0].outputs.data.shape[-1]),
                prompt_tokens=sum(len(o.prompt_token_ids) for o in outputs),
            )
        # score and rerank alike: rerank's answer is the same scores, ordered by the server
        query, *docs = await _encode_all(self.llm, (request.query, *request.inputs))
        return PoolingResult(
            n_outputs=len(docs),
            scores=tuple(_cosine(query.outputs.data, d.outputs.data) for d in docs),
            prompt_tokens=sum(len(o.prompt_token_ids) for o in (query, *docs)),
        )


def _why_not(tasks: tuple[str, ...]) -> str:
    if "generate" in tasks:
        return (
            "this vLLM engine runs the generate runner: pooling requests need"
            " --engine-opt vllm.runner=pooling"
        )
    return (
        f"in process, pooling requests take an embedding model; this one serves"
        f" {', '.join(tasks)} (a cross-encoder's query-input pairs are rendered by vLLM's"
        " server: measure it with --engine=openai)"
    )


async def _encode_all(llm: Any, inputs: tuple[str | tuple[int, ...], ...]) -> list[Any]:
    """Every input embedded at once (the engine batches them), in input order."""
    from vllm import PoolingParams  # noqa: PLC0415
    from vllm.inputs import TokensPrompt  # noqa: PLC0415

    async def one(item: str | tuple[int, ...]) -> Any:
        prompt: Any = item if isinstance(item, str) else TokensPrompt(prompt_token_ids=list(item))
        last = None
        async for out in llm.encode(prompt, PoolingParams(task="embed"), f"pool-{next(_ids)}"):
            last = out
        if last is None or not last.finished:
            raise EngineError("vLLM ended a pooling request without its output")
        return last

    return list(await asyncio.gather(*(one(item) for item in inputs)))


def _cosine(a: Any, b: Any) -> float:
    """As vLLM's bi-encoder scoring computes it (torch's cosine_similarity in float32)."""
    import torch  # noqa: PLC0415

    return float(torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=0))
