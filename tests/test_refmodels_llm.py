"""The embedded decoders' builds, checked without building the large one: its config and
parameter count on torch's meta device (no weights allocated), and a cache key that says
what was built. Needs torch and transformers (``tox -e transformers``); skipped
elsewhere. The build itself (26 s and 1.95 GB on two cores) is measured in
docs/workloads.md, not repeated here."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace
from importlib.metadata import version

import pytest

from workloads.lib import llm

torch = pytest.importorskip("torch", reason="torch is not installed (tox -e transformers)")
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (tox -e transformers)"
)


class Tokenizer:
    """What the config takes of the trained tokenizer (training it takes seconds)."""

    bos_token_id, eos_token_id, pad_token_id = 0, 1, 3

    def __len__(self) -> int:
        return llm.TOKENIZER_VOCAB


def on_meta(spec: llm.LlamaSpec):
    config = llm.config_for(spec, Tokenizer())
    with torch.device("meta"):
        return config, transformers.LlamaForCausalLM(config)


@pytest.mark.slow  # transformers' Llama module takes seconds to import
def test_the_1b_decoder_has_llama_3_2_1b_layers_and_about_a_billion_parameters():
    config, model = on_meta(llm.LLAMA_1B)
    assert (config.hidden_size, config.intermediate_size) == (2048, 8192)
    assert (config.num_hidden_layers, config.num_attention_heads) == (16, 32)
    assert config.num_key_value_heads == 8
    assert config.head_dim == 64
    assert config.vocab_size == 1024
    assert str(config.dtype).removeprefix("torch.") == "bfloat16"
    assert all(p.is_meta for p in model.parameters())  # nothing was allocated
    counted = sum(p.numel() for p in model.parameters())
    assert counted == llm.parameter_count(llm.LLAMA_1B.shape) == 977_340_416
    assert counted * 2 / 1e9 == pytest.approx(1.95, abs=0.01)  # bf16 on disk, in GB


@pytest.mark.slow
def test_the_tiny_decoder_is_counted_by_the_same_formula():
    _, model = on_meta(llm.TINY)
    assert sum(p.numel() for p in model.parameters()) == llm.parameter_count(llm.TINY.shape)


def test_the_cache_key_says_what_was_built():
    keys = {
        llm._key(0, llm.TINY),
        llm._key(0, llm.LLAMA_1B),
        llm._key(1, llm.LLAMA_1B),
        llm._key(0, replace(llm.LLAMA_1B, dtype="float16")),
        llm._key(0, replace(llm.LLAMA_1B, shape=replace(llm.LLAMA_1B.shape, hidden_size=1024))),
    }
    assert len(keys) == 5


def test_the_tiny_decoders_key_is_the_one_it_had_so_its_cache_stays_valid():
    before = {  # what workloads/lib/llm.py hashed before models had names
        "generator": llm.GENERATOR_VERSION,
        "seed": 0,
        "shape": asdict(llm.LlamaShape()),
        "libs": {lib: version(lib) for lib in llm.LIBS},
    }
    digest = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
    assert llm._key(0) == digest
