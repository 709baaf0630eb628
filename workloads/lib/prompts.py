"""Where a generative workload's prompts come from, and what it needs locally for them.

A server the user already runs (``--engine=openai --engine-opt openai.base_url=URL``)
needs nothing local: without ``--model`` its requests are text (the default dataset) and
the server's usage reports the token counts. Everything else gets the model directory
(``--model``, or the embedded tiny Llama, which needs torch), whose tokenizer also counts
input tokens on the client where an engine reports none.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import GenerationRequest, RunSettings
from workloads.lib import datasets
from workloads.lib.generative import NO_LOCAL_MODEL, model_dir
from workloads.lib.inputs import lengths


def traffic_label(path: Path | None, default: str) -> str:
    """Which traffic a cell carried, as a cell parameter: the file's name and the start of
    its sha256 (two files of one name are different traffic), or ``default``. Cells of
    different datasets or traces are different cells, never compared or ranked together."""
    if path is None:
        return default
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:8]
    return f"{path.stem}-{digest}"


def remote_server(settings: RunSettings, engine: str) -> bool:
    """An engine that is a client of a server the user started (not one the harness starts)."""
    return engine == "openai" and "base_url" in settings.engine_options.get("openai", {})


def server_model(settings: RunSettings, engine: str) -> Path:
    """The model directory to open the engine on; NO_LOCAL_MODEL for a user's server
    without ``--model`` (no torch, no model directory needed)."""
    if settings.model is None and remote_server(settings, engine):
        return NO_LOCAL_MODEL
    return model_dir(settings)


InputCounter = Callable[[GenerationRequest], int]


def engine_context(engine: object, model: Path) -> int | None:
    """The context the engine serves: the length it resolved (vLLM's ``max_model_len``,
    often below the model's own), else the model's."""
    describe = getattr(engine, "describe", None)
    info = describe() if callable(describe) else {}
    for section in (info.get("effective"), info.get("requested"), info):
        value = section.get("max_model_len") if isinstance(section, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return model_context(model)


def model_context(model: Path) -> int | None:
    """The model's context length (``max_position_embeddings``), where a local config
    says it."""
    config = model / "config.json"
    if not config.is_file():
        return None
    value = json.loads(config.read_text()).get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def input_counter(model: Path) -> InputCounter | None:
    """Counts a request's input tokens with the model's own tokenizer and chat template,
    for engines that report none; None without a local tokenizer (or transformers)."""
    if not (model / "tokenizer_config.json").is_file():
        return None
    if importlib.util.find_spec("transformers") is None:
        return None
    tokenizer = _tokenizer(str(model))
    return functools.partial(_count, tokenizer)


@functools.cache
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer  # noqa: PLC0415  (optional, heavy)

    return AutoTokenizer.from_pretrained(path)


def _count(tokenizer: Any, request: GenerationRequest) -> int:
    if request.kind == "tokens":
        return len(request.prompt)
    if request.kind == "chat":
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return len(ids)
    return len(tokenizer(str(request.prompt))["input_ids"])


def text_counter(counter: InputCounter | None) -> Callable[[str], int] | None:
    """Token counts of plain text (dataset length filters), from the request counter."""
    if counter is None:
        return None
    return lambda text: counter(GenerationRequest(prompt=text, max_tokens=1))


@dataclass(frozen=True)
class UserDataset:
    """The run's dataset (the user's file or the generated default) and its record."""

    dataset: datasets.Dataset
    input_range: tuple[int, int] | None = None
    """Prompt lengths sampled (in the dataset's length unit); None: all."""

    def requests(
        self, n: int, seed: int, traffic: Any
    ) -> tuple[list[GenerationRequest], dict[str, Any]]:
        """``n`` requests sampled with ``seed`` (with replacement when the dataset has
        fewer usable entries), replies as ``traffic.output_mode`` says, and what the record
        keeps about the dataset."""
        usable = len(self.dataset.entries)
        entries = datasets.select(
            self.dataset, n, seed, replace=n > usable, input_range=self.input_range
        )
        reqs = datasets.to_requests(
            entries, traffic.output_mode, seed=seed, cap=traffic.output_cap, id_prefix="d"
        )
        info = self.dataset.to_json(used=len(reqs)) | {
            "output_mode": traffic.output_mode,
            "sampled_with_replacement": n > usable,
            "selection": entries.to_json(),
        }
        return reqs, info


def user_dataset(
    settings: RunSettings, counter: InputCounter | None, context: int | None = None
) -> UserDataset:
    """``--dataset`` read (lengths in tokens where a tokenizer is at hand), or the
    generated conversations."""
    traffic = settings.traffic
    if traffic.dataset is None:
        # its longest conversations (800 words) would overflow a 2048-token model
        return UserDataset(datasets.default_dataset(settings.seed), DEFAULT_INPUT_WORDS)
    fmt = None if traffic.dataset_format == "auto" else traffic.dataset_format
    room = None if context is None else context - traffic.output_cap
    data = datasets.load_dataset(
        traffic.dataset, fmt, count_tokens=text_counter(counter), max_input_tokens=room
    )
    return UserDataset(data)


DEFAULT_INPUT_WORDS = (1, 300)
"""The generated conversations sampled: up to 300 words, which the embedded model's
tokenizer makes well under its 2048 positions."""


def text_requests(n: int, seed: int, output: tuple[int, int, int]) -> list[GenerationRequest]:
    """Text prompts from the generated conversations (their user turns as plain text),
    with seeded output lengths and ``ignore_eos``: the streaming workload's requests for a
    server that has no local model here to draw token ids from."""
    data = datasets.default_dataset(seed)
    entries = datasets.select(data, n, seed, replace=True, input_range=DEFAULT_INPUT_WORDS)
    rng = np.random.default_rng(seed)
    asked = lengths(rng, n, *output)
    return [
        GenerationRequest(prompt=e.prompt_text, max_tokens=k, request_id=f"x{seed}-{i}")
        for i, (e, k) in enumerate(zip(entries, asked, strict=True))
    ]
