"""What the embeddings workload sends, and the engine it sends it to.

Inputs are texts: each entry of the user's ``--dataset`` as one text (its conversation up
to the last user turn, as a completions API would take it), or, without one, generated
pseudo-text of seeded log-normal lengths (``INPUT_WORDS``). A request holds ``batch``
inputs drawn with the run's seed; a ``score`` or ``rerank`` request also holds a query
(a short generated text, or the start of another dataset entry).

The engine is the run's model as a pooling model: the embedded tiny Llama (or
``--model``) started with vLLM's pooling runner, which turns a generative checkpoint into
an embedding model (last-token pooling, normalized), in process (``vllm.runner=pooling``)
and behind the harness-started server (``openai.runner=pooling``: ``vllm serve
--runner pooling``, which serves ``/v1/embeddings``, ``/v1/score`` and ``/v1/rerank``).
A server the user runs (``openai.base_url``) is taken as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.api import (
    Cell,
    OpenEngine,
    PoolingEngine,
    PoolingRequest,
    RunSettings,
)
from workloads.lib import datasets
from workloads.lib.generative import open_generative
from workloads.lib.inputs import lengths
from workloads.lib.prompts import remote_server, server_model, traffic_label

DEFAULT_NAME = "synthetic-text"
"""The generated inputs' name (the ``dataset`` parameter of a cell without ``--dataset``)."""
INPUT_WORDS = (48, 8, 200)
"""Generated input lengths in words: median, min, max (a passage, as retrieval embeds)."""
QUERY_WORDS = (10, 4, 24)
"""Generated query lengths in words (a search query)."""
QUERY_CHARS = 200
"""A dataset entry used as a query is cut to its first characters (a query is short)."""


def dataset_label(settings: RunSettings) -> str:
    return traffic_label(settings.traffic.dataset, DEFAULT_NAME)


@dataclass(frozen=True)
class Texts:
    """The texts inputs are drawn from, and what the record says of them."""

    texts: tuple[str, ...]
    info: dict[str, Any]

    def requests(self, kind: str, n: int, batch: int, seed: int) -> list[PoolingRequest]:
        """``n`` requests of ``batch`` inputs each, drawn with ``seed`` (with replacement:
        a request's inputs are distinct draws of the texts, not distinct texts)."""
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, len(self.texts), size=(n, batch))
        queries = self._queries(rng, n) if kind != "embed" else [""] * n
        return [
            PoolingRequest(
                inputs=tuple(self.texts[j] for j in row),
                kind=kind,  # type: ignore[arg-type]  # checked by PoolingRequest itself
                query=query,
                request_id=f"p{seed}-{i}",
            )
            for i, (row, query) in enumerate(zip(picks.tolist(), queries, strict=True))
        ]

    def _queries(self, rng: np.random.Generator, n: int) -> list[str]:
        if self.info["name"] == DEFAULT_NAME:
            return [datasets.synthetic_text(rng, k) for k in lengths(rng, n, *QUERY_WORDS)]
        picks = rng.integers(0, len(self.texts), size=n)
        return [self.texts[j][:QUERY_CHARS] for j in picks.tolist()]


def texts(settings: RunSettings, n: int = 512) -> Texts:
    """The user's dataset's texts (every usable entry), or ``n`` generated ones."""
    path = settings.traffic.dataset
    if path is None:
        rng = np.random.default_rng(settings.seed + 7)
        words = lengths(rng, n, *INPUT_WORDS)
        generated = tuple(datasets.synthetic_text(rng, k) for k in words)
        return Texts(generated, {"name": DEFAULT_NAME, "texts": n, "words": list(INPUT_WORDS)})
    fmt = None if settings.traffic.dataset_format == "auto" else settings.traffic.dataset_format
    data = datasets.load_dataset(path, fmt)
    entries = tuple(e.prompt_text for e in data.entries)
    return Texts(entries, data.to_json(used=len(entries)))


def open_pooling(
    request: pytest.FixtureRequest,
    open_engine: OpenEngine,
    cell: Cell,
    settings: RunSettings,
) -> tuple[PoolingEngine, Path]:
    """The cell's engine as a pooling engine, and the model it serves (the workload's
    ``requires(pooling=KIND)`` has skipped engines that serve no such requests); skips
    transformers serve, which has no pooling API."""
    user = settings.options_for(cell.engine, cell.params)
    if user.get("server") == "transformers":
        pytest.skip("transformers serve has no pooling API (/v1/embeddings, /v1/score)")
    model = server_model(settings, cell.engine)
    options = {} if remote_server(settings, cell.engine) else {"runner": "pooling"}
    engine = open_generative(request, open_engine, cell, model, options)
    if not isinstance(engine, PoolingEngine):
        raise TypeError(f"{cell.engine} declares pooling but has no pool() method")
    return engine, model
