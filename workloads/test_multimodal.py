"""Multimodal chat: streaming chat requests that carry images, TTFT and E2E by image
count and size.

Each cell declares its images (``workloads.lib.mmimages`` spec: a count and a size drawn per
request) and a load: one user in a closed loop (single-stream latency) or Poisson
arrivals. Every request has its own synthetic images (seeded, so no engine's image
cache can flatter a cell) and a short text question; replies are asked ``OUTPUT`` tokens
with ``ignore_eos``. Images reach an HTTP server as ``image_url`` data-URL parts
(engines/openai_media.py) and vLLM in process as ``multi_modal_data``
(engines/vllm_media.py). The record carries each request's image count and pixels as
samples (``image_count``, ``image_pixels``) and TTFT/E2E medians by image count.

TTFT is not split into vision encoder and prefill: vLLM 0.32 reports neither per request
(``RequestStateStats`` has queue, schedule and first-token times only) nor as a metric
(its Prometheus registry counts multimodal cache queries and hits, no encoder time), so
the record says ``ttft_split: null`` and why. The model is ``--model`` (a vision-language
model), else the embedded tiny LLaVA (``workloads.lib.vlm``), which vLLM CPU runs on its
Transformers backend (``model_impl=transformers``: engines/vllm_media.py says why).
Images in the user's own ``--dataset`` are sent by the dataset workload
(workloads/lib/dataset_images.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.api import (
    Cell,
    GenerationRequest,
    Message,
    OpenEngine,
    ReportSpec,
    RequestRecord,
    RunSettings,
)
from workloads.lib import reporting
from workloads.lib.datasets import synthetic_text
from workloads.lib.generative import (
    engine_counters,
    finish,
    load_source,
    read_counters,
    traffic_samples,
    watch_server,
)
from workloads.lib.mmimages import ImageSpec, parse_image_spec, request_samples, synthetic_images
from workloads.lib.prompts import NO_LOCAL_MODEL, server_model

SPECS = {
    "1img-224": "count=1,size=224x224",
    "2img-224": "count=2,size=224x224",
    "1img-448": "count=1,size=448x448",
}
"""Cell ids (``-k 2img``) and the images each request of the cell carries."""
LOADS = [("closed", 1.0), ("open", 4.0)]
OUTPUT = 16
QUESTION_WORDS = (4, 24)
WARMUP = 4
TTFT_SPLIT = (
    "not reported: vLLM gives no per-request vision-encoder time (RequestStateStats) and"
    " no encoder-time metric; TTFT holds image processing, encoding and prefill"
)
SINGLE_STREAM = ("closed", 1.0)

REPORT = ReportSpec(
    throughput=reporting.REQUESTS,
    tokens=reporting.TOKENS,
    scenario=("images", "load", "level"),  # what each request carries, and the load
    timing_floor=reporting.LAG_P99,
    latencies=reporting.STREAMED,
    plots=(reporting.TTFT_CDF, reporting.E2E_CDF),
)


@pytest.mark.requires(family="generative", streaming=True, modalities="image")
@pytest.mark.report_spec(REPORT)
@pytest.mark.parametrize("images", list(SPECS.values()), ids=list(SPECS))
@pytest.mark.parametrize(("load", "level"), LOADS, ids=[f"{a}-{b:g}" for a, b in LOADS])
def test_multimodal(
    request: pytest.FixtureRequest,
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    aio: asyncio.Runner,
    images: str,
    load: str,
    level: float,
) -> None:
    spec = parse_image_spec(images)
    model, options = vision_model(harness_settings, cell.engine)
    engine, source = load_source(request, open_engine, cell, model, aio, options=options)
    seed = harness_settings.seed + 3000
    reqs = image_requests(spec, harness_settings.profile.gen_requests, seed)
    source.warm_up(image_requests(spec, WARMUP, seed + 1), 2)
    before = read_counters(engine)
    server = watch_server(request, engine)
    sent, offered, _ = source.at_level(load, level, reqs, seed)
    ok = [(r, rec) for r, rec in zip(reqs, sent.records, strict=False) if rec.ok]
    finish(
        cell,
        harness_settings,
        sent.records,
        offered_rate=offered,
        seed=seed,
        server=server,
        extra={
            "engine_counters": engine_counters(before, read_counters(engine)),
            "images": image_account(spec, ok),
        }
        | sent.extra,
        samples=traffic_samples(sent.records, None) | request_samples([r.images for r, _ in ok]),
        single_stream="e2e" if (load, level) == SINGLE_STREAM else None,
    )


def vision_model(settings: RunSettings, engine: str) -> tuple[Path, dict[str, str]]:
    """``--model`` (or a user's server without one), else the embedded tiny LLaVA with
    the setting that lets vLLM CPU load it."""
    model = server_model(settings, engine)
    if settings.model is not None or model == NO_LOCAL_MODEL:
        return model, {}
    from workloads.lib import llm, vlm  # noqa: PLC0415  (builds with torch/transformers)

    if missing := llm.missing_libraries():
        pytest.skip(f"the embedded tiny VLM {llm.needs(missing)}, or give --model DIR")
    options = {"model_impl": "transformers"} if engine in ("vllm", "openai") else {}
    return vlm.embedded_vlm(settings.seed), options


def image_requests(spec: ImageSpec, n: int, seed: int) -> list[GenerationRequest]:
    """``n`` chat requests, each a short question with its own images."""
    rng = np.random.default_rng(seed)
    drawn = synthetic_images(spec, n, seed)
    return [
        GenerationRequest(
            prompt="",
            messages=(Message("user", synthetic_text(rng, int(rng.integers(*QUESTION_WORDS)))),),
            images=images,
            max_tokens=OUTPUT,
            request_id=f"mm{seed}-{i}",
        )
        for i, images in enumerate(drawn)
    ]


def image_account(
    spec: ImageSpec, ok: list[tuple[GenerationRequest, RequestRecord]]
) -> dict[str, Any]:
    """The spec, the images the completed requests carried, and TTFT/E2E medians by
    image count (a spec with several counts answers "what does one more image cost")."""
    by_count: dict[str, Any] = {}
    for count in sorted({len(r.images) for r, _ in ok}):
        recs = [rec for r, rec in ok if len(r.images) == count]
        by_count[str(count)] = {
            "requests": len(recs),
            "ttft_p50_s": float(np.median([rec.ttft for rec in recs])),
            "e2e_p50_s": float(np.median([rec.t_last - rec.t_sched for rec in recs])),
        }
    pixels = [sum(i.pixels for i in r.images) for r, _ in ok]
    return {
        "spec": spec.to_json(),
        "per_request": float(np.mean([len(r.images) for r, _ in ok])) if ok else None,
        "pixels_per_request": float(np.mean(pixels)) if ok else None,
        "by_count": by_count,
        "ttft_split": None,
        "ttft_split_reason": TTFT_SPLIT,
    }
