"""The embedded generative model: a tiny random-weight Llama with a locally trained tokenizer.

Generated deterministically (seeded weights, a seeded synthetic corpus for a byte-level
BPE tokenizer) and cached under ``$HARNESS_CACHE_DIR/llm/<key>``, where the key hashes
the generator version, the seed, the architecture and the library versions. It loads
offline (``HF_HUB_OFFLINE=1``) in vLLM and any Hugging Face-compatible server.

Head size is 64 (hidden 128, 2 heads): vLLM's CPU attention kernels reject head size 16.
The tokenizer carries a simple chat template (``CHAT_TEMPLATE``: plain-text role markers,
the BOS once, at the start), so chat requests work in process and through an OpenAI
server's ``/v1/chat/completions``.
Needs ``torch``, ``transformers`` and ``tokenizers`` (the ``llm`` extra; the vLLM extras bring
them too).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from workloads.models import cache_dir

GENERATOR_VERSION = 2  # 2: the tokenizer has a chat template
NAME = "tiny-llama"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] + ': ' + message['content'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
)
"""``<s>``, then each turn as ``role: content`` and a newline (an assistant turn closed by
``</s>``), then ``assistant:`` when a reply is asked for. The BOS is the template's: the
tokenizer adds no special tokens of its own, and a rendered chat is tokenized without
them (as vLLM's chat API does), so it holds one BOS."""


@dataclass(frozen=True)
class LlamaShape:
    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048


SHAPE = LlamaShape()
SPECIAL_TOKENS = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": "<pad>",
}
SPECIAL = list(SPECIAL_TOKENS.values())  # ids 0..3, in this order


def corpus(seed: int, sentences: int = 4000) -> list[str]:
    """Seeded pseudo-text: words built from syllables, so BPE has structure to learn."""
    import numpy as np  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = ["".join(rng.choice(syllables, size=rng.integers(1, 4))) for _ in range(600)]
    return [
        " ".join(rng.choice(words, size=rng.integers(4, 16))).capitalize() + "."
        for _ in range(sentences)
    ]


LIBS = ("torch", "transformers", "tokenizers")
"""What the model is built with (``pip install -e '.[llm]'``), imported only to build it."""


def missing_libraries() -> list[str]:
    """Those of ``LIBS`` that are not installed."""
    return [lib for lib in LIBS if importlib.util.find_spec(lib) is None]


def needs(missing: list[str]) -> str:
    """What to say of the ``missing`` libraries alone ("needs torch, which is not
    installed: pip install ..."): the installed ones are not what the reader acts on."""
    names = missing[0] if len(missing) == 1 else f"{', '.join(missing[:-1])} and {missing[-1]}"
    which = "which is" if len(missing) == 1 else "which are"
    return f"needs {names}, {which} not installed: pip install -e '.[llm]'"


def _key(seed: int) -> str:
    parts = {
        "generator": GENERATOR_VERSION,
        "seed": seed,
        "shape": asdict(SHAPE),
        "libs": {lib: version(lib) for lib in LIBS},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _build(target: Path, seed: int) -> None:
    import torch  # noqa: PLC0415
    from tokenizers import ByteLevelBPETokenizer  # noqa: PLC0415
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: PLC0415

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        corpus(seed),
        vocab_size=SHAPE.vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL,
        show_progress=False,
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, **SPECIAL_TOKENS)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(target)
    torch.manual_seed(seed)
    config = LlamaConfig(
        **asdict(SHAPE) | {"vocab_size": max(SHAPE.vocab_size, len(tokenizer))},
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(target, safe_serialization=True)
    (target / "harness-model.json").write_text(
        json.dumps({"name": NAME, "seed": seed, "generator_version": GENERATOR_VERSION}, indent=1)
    )


def embedded_llm(seed: int = 0) -> Path:
    """Directory of the tiny Llama for ``seed``, built on first use and cached."""
    path = cache_dir().parent / "llm" / f"{NAME}-s{seed}-{_key(seed)}"
    if (path / "harness-model.json").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=".tmp-"))
    try:
        _build(tmp, seed)
        os.replace(tmp, path)  # atomic: a concurrent builder's result is equivalent
    except OSError:
        if not (path / "harness-model.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def describe(path: Path) -> dict[str, Any]:
    info: dict[str, Any] = json.loads((path / "harness-model.json").read_text())
    info["path"] = str(path)
    info["shape"] = asdict(SHAPE)
    return info
