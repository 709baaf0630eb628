"""Chunks from the in-process LLM engines' streams (vllm, tensorrt-llm, lmdeploy).

Each of them hands the adapter, per streamed step, the ids of the tokens new in that step
(vLLM and LMDeploy stream deltas; TensorRT-LLM's cumulative ids are diffed first by its
adapter). A chunk counts those ids, never one token per step: a step may carry several
tokens (speculative decoding, a scheduler that batches steps) or none (a final step
that only reports the finish).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import SupportsInt

from harness.engine import Chunk


def delta_chunk(
    new_ids: Iterable[SupportsInt],
    text: str | None = "",
    *,
    completion_tokens: int | None = None,
    prompt_tokens: int | None = None,
    finish_reason: str | None = None,
    engine_stats: Mapping[str, float] | None = None,
) -> Chunk:
    """The chunk of one step that carried ``new_ids``, with the step's new text (None:
    none) and the engine's running counts and finish where it gives them. Engines hand out
    their own integer types (numpy, torch): the ids become plain ints here."""
    ids = tuple(int(t) for t in new_ids)
    return Chunk(
        n_tokens=len(ids),
        token_ids=ids,
        text=text or "",
        completion_tokens=completion_tokens,
        prompt_tokens=prompt_tokens,
        finish_reason=finish_reason,
        engine_stats=engine_stats,
    )
