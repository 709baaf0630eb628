"""Multimodal requests in process on vLLM, and the setting that picks a model's
implementation (in process and for the harness-started server).

A chat request with images is rendered as vLLM's chat API renders one: the model's chat
template over OpenAI-style content lists, each image an ``{"type": "image"}`` part of the
last user turn (the template writes the model's own placeholder, e.g. LLaVA's
``<image>``), tokenized without special tokens (the template writes the BOS), and the
images, decoded with Pillow, as ``multi_modal_data``; vLLM's processor then expands each
placeholder to the image's tokens.

``model_impl``: vLLM's own model code (``vllm``), Hugging Face transformers' through
vLLM's Transformers backend (``transformers``) or vLLM's choice (``auto``, the default).
On the CPU build without torchvision (``tox -e vllm``), vLLM's LLaVA module cannot be
imported (it imports Pixtral's image processor, which needs torchvision), so the
embedded tiny LLaVA (``workloads.lib.vlm``) runs with ``model_impl=transformers``.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Mapping, Sequence
from typing import Any

from engines.llmstream import NoChatTemplate, has_chat_template
from harness.engine import GenerationRequest, Message
from harness.engine.media import ImageInput
from harness.engine.optionschema import choice

MODEL_IMPLS = ("auto", "vllm", "transformers")
MODEL_IMPL_HELP = (
    "the model's implementation: auto (vLLM's choice), vllm, or transformers (vLLM's"
    " Transformers backend: a model whose vLLM module this build cannot import)"
)
MODEL_IMPL = choice("model_impl", MODEL_IMPL_HELP, MODEL_IMPLS, default="auto")
SERVER_MODEL_IMPL = choice(
    "model_impl", f"the harness-started vLLM server's --model-impl: {MODEL_IMPL_HELP}", MODEL_IMPLS
)


def engine_args(options: Mapping[str, str]) -> dict[str, Any]:
    """``model_impl`` for ``AsyncEngineArgs`` where one is chosen."""
    impl = options.get("model_impl", "auto")
    return {} if impl == "auto" else {"model_impl": impl}


def server_flags(settings: Mapping[str, str]) -> list[str]:
    """``--model-impl`` for the harness-started server where one is chosen."""
    impl = settings.get("model_impl", "auto")
    return [] if impl == "auto" else ["--model-impl", impl]


def conversation(messages: Sequence[Message], n_images: int) -> list[dict[str, Any]]:
    """The messages, the last user turn as content parts: ``n_images`` image parts, then
    its text (the order of engines/openai_media.py's ``image_url`` parts)."""
    out: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in messages]
    if not n_images:
        return out
    parts: list[dict[str, Any]] = [{"type": "image"} for _ in range(n_images)]
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    if not users:
        return [*out, {"role": "user", "content": parts}]
    if messages[users[-1]].content:
        parts.append({"type": "text", "text": messages[users[-1]].content})
    out[users[-1]] = {"role": "user", "content": parts}
    return out


def decoded(images: Sequence[ImageInput]) -> list[Any]:
    """The images as RGB Pillow images, what vLLM's image processors take."""
    from PIL import Image  # noqa: PLC0415

    out = []
    for image in images:
        with Image.open(io.BytesIO(image.data)) as opened:
            out.append(opened.convert("RGB"))
    return out


async def prompt(tokenizer: Any, request: GenerationRequest, model: object) -> dict[str, Any]:
    """The ``TokensPrompt`` of a chat request with images: ids and ``multi_modal_data``.
    The images are decoded in a worker thread, as vLLM's server decodes them in its
    renderer's pool: the event loop, which is also the load generator's, keeps sending."""
    if not has_chat_template(tokenizer):
        raise NoChatTemplate(
            f"{model} has no chat template, so a chat request with images cannot be rendered"
        )
    chat = conversation(request.messages, len(request.images))
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    ids = [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]
    images = await asyncio.to_thread(decoded, request.images)
    return {"prompt_token_ids": ids, "multi_modal_data": {"image": images}}
