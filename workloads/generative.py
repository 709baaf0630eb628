"""Shared pieces of the generative workloads: model, seeded requests, engine, recording."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.cell import Cell
from harness.config import RunSettings
from harness.engine import (
    EngineError,
    ExposesCounters,
    GenerationRequest,
    GenerativeEngine,
    counter_delta,
)
from harness.plugin import OpenEngine
from harness.records import Headline
from harness.streaming import RequestRecord
from harness.streamstats import summarize_stream
from workloads.inputs import lengths

FIRST_ID = 4  # ids below are the tokenizer's special tokens (<s>, </s>, <unk>, <pad>)


def model_dir(settings: RunSettings) -> Path:
    if settings.model is not None:
        return settings.model
    from workloads.llm import embedded_llm  # noqa: PLC0415  (needs torch/transformers)

    return embedded_llm(settings.seed)


def vocab_size(model: Path) -> int:
    config = model / "config.json"
    if not config.is_file():
        raise EngineError(f"{model} has no config.json: give a Hugging Face model directory")
    return int(json.loads(config.read_text())["vocab_size"])


def make_requests(
    n: int, seed: int, vocab: int, prompt: tuple[int, int, int], output: tuple[int, int, int]
) -> list[GenerationRequest]:
    """Unique token-id prompts (no prefix cache can flatter them) and asked output lengths."""
    rng = np.random.default_rng(seed)
    p_lens, o_lens = lengths(rng, n, *prompt), lengths(rng, n, *output)
    requests = []
    for i, (p, o) in enumerate(zip(p_lens, o_lens, strict=True)):
        ids = tuple(int(t) for t in rng.integers(FIRST_ID, vocab, size=p))
        requests.append(GenerationRequest(prompt=ids, max_tokens=o, request_id=f"r{seed}-{i}"))
    if len({r.prompt for r in requests}) != n:
        raise RuntimeError("duplicate prompts: the seeded generator must give unique prompts")
    return requests


def open_generative(
    request: pytest.FixtureRequest,
    open_engine: OpenEngine,
    cell: Cell,
    model: Path,
    options: dict[str, str] | None = None,
) -> GenerativeEngine:
    opts = dict(options or {})
    settings: RunSettings = request.getfixturevalue("harness_settings")
    endpoint = None
    if cell.engine == "openai" and "base_url" not in settings.engine_options.get("openai", {}):
        endpoint = request.getfixturevalue("openai_endpoint")
        opts["base_url"] = endpoint.base_url
    engine = open_engine(model, options=opts, shared=True)
    if endpoint is not None:
        endpoint.pin_client()  # after open_engine: closing a previous engine may unpin
    if not isinstance(engine, GenerativeEngine):
        raise EngineError(f"{cell.engine} is not a generative engine")
    return engine


HEADLINE = (
    Headline(label="TTFT p50", metric="ttft.p50", unit="ms", scale=1e3, ci="ttft.ci95.p50"),
    Headline(label="p99", metric="ttft.p99", unit="ms", scale=1e3, ci="ttft.ci95.p99"),
    Headline(label="TPOT p50", metric="tpot.p50", unit="ms", scale=1e3),
    Headline(label="E2E p99", metric="e2e.p99", unit="ms", scale=1e3, ci="e2e.ci95.p99"),
    Headline(label="out", metric="throughput.output_tokens_per_s", unit="tok/s"),
    Headline(label="goodput", metric="throughput.goodput_requests_per_s", unit="req/s"),
)


ENGINE_COUNTERS = (
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:num_preemptions_total",
)


def read_counters(engine: GenerativeEngine) -> dict[str, float] | None:
    return engine.counters() if isinstance(engine, ExposesCounters) else None


def engine_counters(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, float]:
    """The server's own account of the cell (a vLLM server: /metrics deltas)."""
    if before is None or after is None:
        return {}
    delta = counter_delta(before, after)
    return {k: v for k, v in delta.items() if k.startswith(ENGINE_COUNTERS)}


def finish(
    cell: Cell,
    settings: RunSettings,
    records: list[RequestRecord],
    *,
    offered_rate: float | None,
    seed: int,
    extra: dict[str, Any] | None = None,
    single_stream: str | None = None,
) -> None:
    """Summarize the requests into the cell's metrics, evidence, samples and slow log;
    ``single_stream`` as in ``Cell.finish`` (a sample key, for one request in flight)."""
    summary = summarize_stream(records, settings.slos, offered_rate)
    cell.finish(
        metrics=summary.metrics | (extra or {}),
        evidence=summary.evidence,
        headline=HEADLINE,
        samples=summary.samples,
        window={"duration_s": summary.evidence.window_s, "requests": len(records)},
        seeds={"requests": seed, "model": settings.seed},
        slow=summary.slow,
        single_stream=single_stream,
    )
