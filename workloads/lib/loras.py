"""Tiny LoRA adapters for a local Llama directory, written in PEFT's format without peft.

``build(model, target, seed)`` writes ``adapter_config.json`` and
``adapter_model.safetensors`` with seeded random ``lora_A``/``lora_B`` weights for every
layer's ``q_proj`` and ``v_proj``: what ``peft.get_peft_model(...).save_pretrained``
writes for such a config, and what vLLM's ``--lora-modules``/``LoRARequest`` load. Both
halves are random (PEFT starts ``lora_B`` at zero), so an adapter changes the model's
answers and a request on it is not the base model's in disguise. Needs numpy and
safetensors (installed with vLLM and transformers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

RANK = 8
ALPHA = 16
TARGETS = ("q_proj", "v_proj")


def shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(out, in) features of each targeted projection, from a Llama ``config.json``."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head = int(config.get("head_dim") or hidden // heads)
    kv = int(config.get("num_key_value_heads") or heads)
    return {"q_proj": (heads * head, hidden), "v_proj": (kv * head, hidden)}


def adapter_config(model: Path, rank: int = RANK) -> dict[str, Any]:
    """PEFT's ``LoraConfig`` as saved, for ``TARGETS`` of ``model``."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model),
        "r": rank,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": list(TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
    }


def build(model: Path, target: Path, seed: int, rank: int = RANK) -> Path:
    """Write a random rank-``rank`` adapter of ``model`` into ``target``; returns it."""
    from safetensors.numpy import save_file  # noqa: PLC0415

    config = json.loads((model / "config.json").read_text())
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    for layer in range(int(config["num_hidden_layers"])):
        for proj, (out, inp) in shapes(config).items():
            base = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            scale = 1.0 / np.sqrt(inp)
            tensors[f"{base}.lora_A.weight"] = (rng.standard_normal((rank, inp)) * scale).astype(
                np.float32
            )
            tensors[f"{base}.lora_B.weight"] = (rng.standard_normal((out, rank)) * 0.1).astype(
                np.float32
            )
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / "adapter_model.safetensors"))
    (target / "adapter_config.json").write_text(json.dumps(adapter_config(model, rank), indent=1))
    return target
