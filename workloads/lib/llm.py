"""The embedded generative models: random-weight Llamas with a locally trained tokenizer.

* ``tiny-llama`` (``TINY``): hidden 128, 2 layers, 2 heads of 64, float32; the CPU's;
* ``llama-1b`` (``LLAMA_1B``): Llama-3.2-1B's layers (hidden 2048, 16 layers, 32 query
  and 8 key-value heads of 64, MLP 8192), 0.98 billion parameters, saved in bf16 (2 GB
  on disk); the GPU's (``workloads.lib.modelset``). Its vocabulary is the tokenizer's 1024
  tokens, not Llama's 128k: random weights would emit ids that no token stands for, and
  the 16 layers hold all but 0.4 % of the parameters anyway.

Generated deterministically (seeded weights, a seeded synthetic corpus for a byte-level
BPE tokenizer) and cached under ``$HARNESS_CACHE_DIR/llm/<name>-s<seed>-<key>``, where the
key hashes the generator version, the seed, the architecture, the dtype and the library
versions. A build is announced (seconds, disk); a cache hit says nothing. It loads
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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from harness.api import announce
from workloads.lib.models import cache_dir

GENERATOR_VERSION = 2  # 2: the tokenizer has a chat template

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


TOKENIZER_VOCAB = 1024
"""What the byte-level BPE is trained to (every model's tokenizer)."""


@dataclass(frozen=True)
class LlamaSpec:
    """One embedded decoder: its name, its shape and what its weights are saved in."""

    name: str
    shape: LlamaShape
    dtype: str = "float32"


TINY = LlamaSpec("tiny-llama", LlamaShape(vocab_size=TOKENIZER_VOCAB))
LLAMA_1B = LlamaSpec(
    "llama-1b",
    LlamaShape(
        vocab_size=TOKENIZER_VOCAB,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
    ),
    dtype="bfloat16",  # half the disk and load time of float32, what GPUs serve it in
)
SPECS = {spec.name: spec for spec in (TINY, LLAMA_1B)}
NAME, SHAPE = TINY.name, TINY.shape
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


def parameter_count(shape: LlamaShape) -> int:
    """What ``LlamaForCausalLM`` holds for ``shape`` (untied embeddings, no biases)."""
    head = shape.hidden_size // shape.num_attention_heads
    kv = shape.num_key_value_heads * head
    attention = 2 * shape.hidden_size * shape.hidden_size + 2 * shape.hidden_size * kv
    mlp = 3 * shape.hidden_size * shape.intermediate_size
    layer = attention + mlp + 2 * shape.hidden_size  # and its two RMSNorm weights
    embeddings = 2 * shape.vocab_size * shape.hidden_size  # input table and LM head
    return shape.num_hidden_layers * layer + embeddings + shape.hidden_size


def _key(seed: int, spec: LlamaSpec = TINY) -> str:
    parts: dict[str, Any] = {
        "generator": GENERATOR_VERSION,
        "seed": seed,
        "shape": asdict(spec.shape),
        "libs": {lib: version(lib) for lib in LIBS},
    }
    if spec != TINY:  # the tiny model's key predates names: kept, so its cache stays valid
        parts |= {"name": spec.name, "dtype": spec.dtype}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _tokenizer(seed: int) -> Any:
    from tokenizers import ByteLevelBPETokenizer  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        corpus(seed),
        vocab_size=TOKENIZER_VOCAB,
        min_frequency=2,
        special_tokens=SPECIAL,
        show_progress=False,
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, **SPECIAL_TOKENS)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def config_for(spec: LlamaSpec, tokenizer: Any) -> Any:
    """The ``LlamaConfig`` of ``spec`` with ``tokenizer``'s special ids (what the build
    saves; also what a test instantiates on the meta device to count parameters)."""
    from transformers import LlamaConfig  # noqa: PLC0415

    return LlamaConfig(
        **asdict(spec.shape) | {"vocab_size": max(spec.shape.vocab_size, len(tokenizer))},
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype=spec.dtype,
    )


def _build(target: Path, seed: int, spec: LlamaSpec) -> dict[str, Any]:
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: PLC0415

    began = time.perf_counter()
    tokenizer = _tokenizer(seed)
    tokenizer.save_pretrained(target)
    torch.manual_seed(seed)
    config = config_for(spec, tokenizer)
    if spec.dtype == "float32":
        model = LlamaForCausalLM(config)
    else:  # made in its dtype: a float32 copy of 1B parameters would take 4 GB more
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, spec.dtype))
    model.save_pretrained(target, safe_serialization=True)
    return {
        "name": spec.name,
        "seed": seed,
        "generator_version": GENERATOR_VERSION,
        "parameters": sum(p.numel() for p in model.parameters()),
        "build_s": round(time.perf_counter() - began, 1),
        "bytes": sum(f.stat().st_size for f in target.iterdir()),
    }


def embedded_llm(seed: int = 0, spec: LlamaSpec = TINY) -> Path:
    """Directory of the embedded decoder ``spec`` for ``seed``, built on first use (and
    announced: seconds, parameters, disk) and cached."""
    path = cache_dir().parent / "llm" / f"{spec.name}-s{seed}-{_key(seed, spec)}"
    return built_once(
        path,
        lambda target: _build(target, seed, spec),
        lambda info: (
            f"embedded model {spec.name} (seed {seed}) built in {info['build_s']:.1f} s:"
            f" {info['parameters'] / 1e9:.2f}B parameters, {info['bytes'] / 1e9:.2f} GB at {path}"
        ),
    )


def built_once(
    path: Path,
    build: Callable[[Path], dict[str, Any]],
    summary: Callable[[dict[str, Any]], str],
) -> Path:
    """``path``, a model directory that ``build`` writes on first use (returning what
    goes in its harness-model.json; announced with ``summary`` of it) and that is cached
    after: built in a temporary directory beside it and moved into place in one step."""
    if (path / "harness-model.json").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=".tmp-"))
    try:
        info = build(tmp)
        (tmp / "harness-model.json").write_text(json.dumps(info, indent=1))
        os.replace(tmp, path)  # atomic: a concurrent builder's result is equivalent
    except OSError:
        if not (path / "harness-model.json").is_file():
            raise
    else:
        announce(summary(info))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def describe(path: Path) -> dict[str, Any]:
    info: dict[str, Any] = json.loads((path / "harness-model.json").read_text())
    info["path"] = str(path)
    spec = SPECS.get(str(info.get("name")), TINY)
    info |= {"shape": asdict(spec.shape), "dtype": spec.dtype}
    return info
