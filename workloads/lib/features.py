"""Engine features a generative workload turns on for the user: the LoRA adapters of
``--lora`` and speculative decoding (the ``speculative`` scenario, off and on).

An engine serves the run's adapters where it can load them (an option ``lora_modules``:
vLLM in process, or the vLLM server the harness starts for ``openai``); a server the user
runs (``openai.base_url``) is taken to serve them already, under the names given (a
request names its adapter as the model). A cell of an engine that cannot apply adapters
(``Capabilities.lora``) is skipped, saying so, rather than measured on the base model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from engines import vllm_speculative
from engines.vllm_lora import modules_text, rank_for
from harness.api import Headline, RunSettings, registry

SPECULATIVE_ON = "ngram"
"""What the ``speculative=on`` cells ask for: n-gram prompt lookup (no draft model),
``engines.vllm_speculative``'s defaults (3 tokens proposed per step)."""


def lora_options(
    engine: str, settings: RunSettings, user: Mapping[str, str], merged: Mapping[str, str]
) -> dict[str, str]:
    """The options that make ``engine`` serve ``--lora``'s adapters (none without it);
    skips the cell where they cannot be served."""
    mix = settings.lora
    if mix is None:
        return {}
    if not registry.load(engine).capabilities.lora:
        pytest.skip(f"{engine} cannot apply LoRA adapters (Capabilities.lora), asked by --lora")
    if engine == "openai" and "base_url" in user:
        return {}  # the user's server serves them under these names
    if merged.get("server") == "transformers":
        pytest.skip("--lora: the harness starts transformers serve without LoRA adapters")
    schema = getattr(registry.load(engine), "option_schema", None)
    if schema is None or "lora_modules" not in schema:
        return {}
    return {"lora_modules": modules_text(mix.modules), "max_lora_rank": str(rank_for(mix.max_rank))}


def speculative_setting(engine: str, settings: RunSettings, *, on: bool) -> dict[str, str]:
    """The option that sets ``engine``'s speculative decoding ``on`` (n-gram) or off; skips
    the cell where that cannot be had: an engine without the option asked for it on, a
    server the user runs, or an ``--engine-opt`` that fixes it the other way."""
    user = settings.engine_options.get(engine, {})
    if engine == "openai" and "base_url" in user:
        pytest.skip(
            "speculative decoding is the setting of the server at base_url: benchmark it"
            " started with and without it, and compare the two runs"
        )
    if engine == "openai" and user.get("server") == "transformers":
        pytest.skip("transformers serve: the harness sets no speculative decoding there")
    schema = getattr(registry.load(engine), "option_schema", None)
    if schema is None or "speculative" not in schema:
        if on:
            pytest.skip(f"{engine} has no speculative decoding the harness can turn on")
        return {}
    value = SPECULATIVE_ON
    fixed = user.get("speculative")
    if fixed is not None and (vllm_speculative.config_of(fixed) is not None) != on:
        pytest.skip(
            f"--engine-opt speculative={fixed} fixes speculative decoding; this cell studies"
            f" it {'on' if on else 'off'}"
        )
    # off is every engine's default: the same options as a cell that does not ask, so the
    # two share the engine (and the harness-started server)
    return {"speculative": fixed or value} if on else {}


def lora_headlines(metrics: Mapping[str, Any]) -> tuple[Headline, ...]:
    """The matrix's per-adapter figures: TTFT p50 and ITL p50 of each adapter that
    completed requests (``metrics.lora.by_adapter``)."""
    lora = metrics.get("lora")
    if not isinstance(lora, Mapping):
        return ()
    out: list[Headline] = []
    for name, figures in lora.get("by_adapter", {}).items():
        for what in ("ttft", "itl"):
            if "p50" in figures.get(what, {}):
                path = f"lora.by_adapter.{name}.{what}.p50"
                label = f"{what.upper()} p50 {name}"
                out.append(Headline(label=label, metric=path, unit="ms", scale=1e3))
    return tuple(out)
