"""Chunks from the in-process LLM engines' streams (vllm, tensorrt-llm, lmdeploy).

Each of them hands the adapter, per streamed step, the ids of the tokens new in that step
(vLLM and LMDeploy stream deltas; TensorRT-LLM's cumulative ids are diffed first by its
adapter). A chunk counts those ids, never one token per step: a step may carry several
tokens (speculative decoding, a scheduler that batches steps) or none (a final step
that only reports the finish).

Chat requests are rendered here for the engines that take a prompt, not a conversation
(vLLM, TensorRT-LLM): with the model's chat template, as their own OpenAI servers do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, SupportsInt

from harness.engine import Chunk, EngineError, Message

TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def torch_dtype_precision(engine: str, name: str, device: str) -> dict[str, str]:
    """``precision_options`` of an engine that loads the model's torch weights in another
    ``dtype`` (vLLM, transformers): fp32, bf16 or fp16, fp16 only on cuda (the CPU
    kernels compute fp16 in fp32 or not at all, so a CPU figure would say nothing)."""
    if name not in TORCH_DTYPES:
        raise ValueError(f"{engine} runs fp32, bf16 or fp16 weights, not {name} (dtype)")
    if name == "fp16" and not device.startswith("cuda"):
        raise ValueError(f"{engine} on cpu computes in fp32 or bf16; fp16 is measured on cuda")
    return {"dtype": TORCH_DTYPES[name]}


class NoChatTemplate(EngineError):
    """A chat request to a model whose tokenizer has no chat template."""


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` (a Hugging Face tokenizer, or a wrapper that forwards
    ``get_chat_template``) has a chat template of its own."""
    try:
        return bool(tokenizer.get_chat_template())
    except (ValueError, AttributeError):
        return False  # transformers: "... tokenizer.chat_template is not set ..."


def chat_prompt_ids(tokenizer: Any, messages: Sequence[Message], model: object) -> list[int]:
    """The prompt ids of a chat request, rendered as vLLM's and TensorRT-LLM's OpenAI
    servers render one: the chat template with the generation prompt, as text, then
    tokenized without special tokens (the template writes the BOS itself, so it is not
    added twice). A model without a chat template is refused (``NoChatTemplate``), never
    sent the raw text."""
    if not has_chat_template(tokenizer):
        raise NoChatTemplate(
            f"{model} has no chat template (its tokenizer defines none), so a chat request"
            " cannot be rendered: send text or token-id prompts, or give a model whose"
            " tokenizer has a chat template"
        )
    conversation = [{"role": m.role, "content": m.content} for m in messages]
    text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


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
