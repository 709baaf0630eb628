"""Precision: one model at fp32 and at fp16 / bf16 / int8 on the same engine, in one cell.

The engine says how it runs each precision (``precision_options``): ONNX Runtime
quantizes the model dynamically to int8 on the CPU and converts it to fp16 on a GPU;
torch casts weights and inputs (fp16, bf16); TensorRT builds with its fp16 flag; vLLM
takes a dtype. An engine that cannot run a precision skips the cell with its reason.

Both variants serve the same seeded batches; their outputs are compared (max / mean
|diff|, row cosine similarity, top-1 agreement for the classifier) against the fp32
reference, and their latencies are taken interleaved in one window, so the speed-up is
a ratio from one run. Beyond the precision's stated tolerance the cell keeps its numbers
and carries a warning: a faster cell that changes answers is not a win.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from harness.api import (
    Cell,
    Driver,
    EngineError,
    Evidence,
    Headline,
    MonotonicClock,
    OpenEngine,
    Paired,
    Rate,
    ReportSpec,
    RunSettings,
    TensorEngine,
    registry,
    settings_of,
    stats,
    summarize_stream,
)
from workloads.lib import inputs, modelset
from workloads.lib.generative import make_requests, model_dir, open_generative, vocab_size
from workloads.lib.precision import (
    TOKEN_TOLERANCE,
    TOLERANCES,
    agreement,
    interleaved,
    speedup,
    token_agreement,
)
from workloads.lib.usermodel import fixed_batch, user_model

PRECISIONS = ("fp16", "bf16", "int8")
EMBEDDED = ("tiny-cnn", "tiny-encoder")  # as named in the tiny set (workloads.lib.modelset)
CLASSIFIERS = ("tiny-cnn",)
BATCH = 8
POOL = 8


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function.__name__ != "test_precision":
        return
    names = ["user-model"] if settings_of(metafunc.config).model else list(EMBEDDED)
    grid = [(m, p) for m in names for p in PRECISIONS]
    metafunc.parametrize(("model", "precision"), grid, ids=[f"{m}-{p}" for m, p in grid])


def embedded_dims(model: str, settings: RunSettings) -> dict[str, int]:
    """Sizes of an embedded model's dynamic dims (batch aside): the encoder at a quarter of
    its positions (64 tiny, 128 BERT-base), where text encoders are usually measured."""
    if model not in EMBEDDED:
        return {}
    top = modelset.sizes(model, settings).max_sequence
    return {"sequence": top // 4} if top else {}


def _options(engine: str, precision: str, device: str) -> tuple[dict[str, str], dict[str, str]]:
    factory = registry.load(engine)
    declared = getattr(factory, "precision_options", None)
    if declared is None:
        pytest.skip(f"{engine} declares no precision_options: it runs models as they are")
    try:
        return declared("fp32", device), declared(precision, device)
    except ValueError as exc:
        pytest.skip(str(exc))


def _tensor(engine: Any) -> TensorEngine:
    if not isinstance(engine, TensorEngine):
        raise EngineError(f"{engine.name} is not a tensor engine")
    return engine


# Both paths of a cell are ranked (without SLO: their rates come from p50 latency or one
# request at a time); a reduced precision beyond its tolerance is never recommended.
REFERENCE_PATH = "its fp32 reference path"
ANSWERS_CHANGED = ("precision ",)  # the warnings _finish gives past the tolerance
PRECISION = ReportSpec(
    paired=Paired(
        own=Rate(metric="throughput.reduced_items_per_s", unit="items/s", counts="items"),
        reference=Rate(metric="throughput.reference_items_per_s", unit="items/s", counts="items"),
        reference_label=REFERENCE_PATH,
    ),
    scenario=("model",),
    answer_checks=ANSWERS_CHANGED,
)
PRECISION_GENERATIVE = ReportSpec(
    paired=Paired(
        own=Rate(metric="reduced.throughput.requests_per_s", unit="req/s", counts="requests"),
        reference=Rate(
            metric="reference.throughput.requests_per_s", unit="req/s", counts="requests"
        ),
        reference_label=REFERENCE_PATH,
    ),
    answer_checks=ANSWERS_CHANGED,
)


@pytest.mark.requires(family="tensor")
@pytest.mark.report_spec(PRECISION)
def test_precision(
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    model: str,
    precision: str,
) -> None:
    settings = harness_settings
    ref_options, low_options = _options(cell.engine, precision, settings.device)
    user = user_model(settings, cell.engine)
    embedded = None if user else modelset.embedded(model, settings)
    path = user.path if user else embedded.path  # type: ignore[union-attr]
    reference = _tensor(open_engine(path, options=ref_options))
    reference_info = cell.engine_info
    reduced = _tensor(open_engine(path, options=low_options))
    cell.engine_info = {**cell.engine_info, "reference": reference_info}
    if embedded is not None:
        cell.engine_info["embedded_model"] = embedded.describe()
    if user is not None:
        cell.engine_info["user_model"] = user.describe()
    dims = {**embedded_dims(model, settings), **settings.dims}
    # answers are compared row by row: a model with a fixed batch is fed that batch
    batch = fixed_batch(reference.input_specs()) or BATCH
    rng = np.random.default_rng(settings.seed)
    pool = [inputs.synthesize(reference.input_specs(), dims, rng, batch=batch) for _ in range(POOL)]
    for engine in (reference, reduced):
        engine.warmup(pool[0], settings.profile.warmup_iterations)
    found = agreement(
        [reference.infer(b) for b in pool], [reduced.infer(b) for b in pool], model in CLASSIFIERS
    )
    tolerance = TOLERANCES[precision]
    breaches = tolerance.breaches(found)
    timed = interleaved(
        reference.infer,
        reduced.infer,
        pool,
        window_s=settings.profile.window_s,
        min_samples=settings.profile.policy.min_samples,
        budget_s=settings.cell_timeout_s / 3,
    )
    _finish(cell, settings, precision, timed, found, breaches, tolerance, batch)
    assert found["outputs"], "the model returned no outputs"


def _finish(
    cell: Cell,
    settings: RunSettings,
    precision: str,
    timed: Any,
    found: dict[str, Any],
    breaches: list[str],
    tolerance: Any,
    batch: int,
) -> None:
    ref, low = np.asarray(timed.reference), np.asarray(timed.reduced)
    first = next(iter(found["outputs"].values()))
    metrics = {
        "precision": precision,
        "reference": stats.to_json(stats.summarize(ref)),
        "reduced": stats.to_json(stats.summarize(low)),
        "speedup": speedup(timed),
        "throughput": {
            "reference_items_per_s": batch / stats.nearest_rank(ref, 50.0),
            "reduced_items_per_s": batch / stats.nearest_rank(low, 50.0),
        },
        "agreement": found | {"first": first},
        "tolerance": {
            "top1_agreement": tolerance.top1_agreement,
            "cosine_min": tolerance.cosine_min,
        },
        "within_tolerance": not breaches,
        "breaches": breaches,
        "batch": batch,
    }
    agree_metric = (
        "agreement.first.top1_agreement"
        if "top1_agreement" in first
        else "agreement.first.cosine_min"
    )
    cell.finish(
        metrics=metrics,
        evidence=Evidence(
            samples=min(len(ref), len(low)),
            failed=0,
            window_s=timed.window_s,
            notes=tuple(f"precision {precision} vs fp32: {b}" for b in breaches),
            span=timed.span,  # both variants, interleaved: the energy of that window
        ),
        headline=[
            Headline(
                label="fp32 p50",
                metric="reference.p50",
                unit="ms",
                scale=1e3,
                ci="reference.ci95.p50",
            ),
            Headline(
                label=f"{precision} p50",
                metric="reduced.p50",
                unit="ms",
                scale=1e3,
                ci="reduced.ci95.p50",
            ),
            Headline(label="speed-up", metric="speedup.p50_ratio", unit="x", ci="speedup.ci95"),
            Headline(
                label="top-1" if "top1_agreement" in first else "cos min",
                metric=agree_metric,
                unit="%" if "top1_agreement" in first else "",
                scale=100 if "top1_agreement" in first else 1,
            ),
            Headline(label="max|d|", metric="agreement.first.max_abs", unit=""),
        ],
        samples={
            "reference_latency": stats.as_samples(ref),
            "reduced_latency": stats.as_samples(low),
        },
        window={
            "duration_s": timed.window_s,
            "calls_each": int(min(len(ref), len(low))),
            "warmup_iterations": settings.profile.warmup_iterations,
        },
        seeds={"inputs": settings.seed, "model": settings.seed},
    )


GEN_PRECISIONS = ("fp16", "bf16")
GEN_PROMPT, GEN_OUTPUT = (32, 16, 64), (32, 32, 32)  # (median, low, high) token lengths


@pytest.mark.requires(family="generative")
@pytest.mark.report_spec(PRECISION_GENERATIVE)
@pytest.mark.parametrize("precision", GEN_PRECISIONS)
def test_precision_generative(
    request: pytest.FixtureRequest,
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    aio: asyncio.Runner,
    precision: str,
) -> None:
    """fp32 then the reduced dtype, one after the other (two LLM engines do not share a
    machine well): greedy tokens compared request by request, TPOT and E2E side by side."""
    settings = harness_settings
    ref_options, low_options = _options(cell.engine, precision, settings.device)
    model = model_dir(settings)
    seed = settings.seed + 2000
    n = max(16, settings.profile.policy.min_samples)  # each phase a valid sample on its own
    reqs = make_requests(n, seed, vocab_size(model), GEN_PROMPT, GEN_OUTPUT)
    phases = {}
    for name, options in (("fp32", ref_options), (precision, low_options)):
        engine = open_generative(request, open_engine, cell, model, options)
        phases[name] = aio.run(_phase(engine, reqs, settings))
        phases[name]["info"] = cell.engine_info
    ref_tokens, low_tokens = phases["fp32"]["tokens"], phases[precision]["tokens"]
    found = token_agreement(ref_tokens, low_tokens)
    floor = TOKEN_TOLERANCE[precision]
    share = found["prefix_share_mean"]
    breaches = []
    if share < floor:
        breaches.append(f"greedy tokens: mean share before divergence {share:.1%} < {floor:.0%}")
    cell.engine_info = {**phases[precision]["info"], "reference": phases["fp32"]["info"]}
    _finish_generative(cell, settings, precision, phases, found, breaches, floor)


async def _phase(engine: Any, reqs: list[Any], settings: RunSettings) -> dict[str, Any]:
    driver = Driver(engine, MonotonicClock(), settings.reliability.request_timeout_s)
    await driver.closed_loop(reqs[:2], 1)  # warm-up
    records = await driver.closed_loop(reqs, 1)
    tokens = []
    for req in reqs[: min(8, len(reqs))]:
        ids: list[int] = []
        async for chunk in engine.generate(req):
            ids.extend(chunk.token_ids)
        tokens.append(ids)
    return {"records": records, "tokens": tokens}


def _finish_generative(
    cell: Cell,
    settings: RunSettings,
    precision: str,
    phases: dict[str, Any],
    found: dict[str, Any],
    breaches: list[str],
    floor: float,
) -> None:
    summaries = {k: summarize_stream(v["records"], (), None) for k, v in phases.items()}
    ref, low = summaries["fp32"].metrics, summaries[precision].metrics
    metrics = {
        "precision": precision,
        "reference": {k: ref[k] for k in ("tpot", "e2e", "ttft", "throughput")},
        "reduced": {k: low[k] for k in ("tpot", "e2e", "ttft", "throughput")},
        "speedup": {
            "tpot_p50_ratio": ref["tpot"]["p50"] / low["tpot"]["p50"],
            "e2e_p50_ratio": ref["e2e"]["p50"] / low["e2e"]["p50"],
            "measured": "sequentially: fp32 first, then the reduced dtype, one request at a time",
        },
        "agreement": found,
        "tolerance": {"prefix_share_mean": floor},
        "within_tolerance": not breaches,
        "breaches": breaches,
    }
    evidence = summaries[precision].evidence
    cell.finish(
        metrics=metrics,
        evidence=Evidence(
            samples=min(summaries["fp32"].evidence.samples, evidence.samples),
            failed=summaries["fp32"].evidence.failed + evidence.failed,
            window_s=min(summaries["fp32"].evidence.window_s, evidence.window_s),
            notes=tuple(f"precision {precision} vs fp32: {b}" for b in breaches),
            # one window only: the reduced dtype's phase (a span over both phases would
            # count the reduced engine's loading between them)
            span=evidence.span,
        ),
        headline=[
            Headline(label="fp32 TPOT", metric="reference.tpot.p50", unit="ms", scale=1e3),
            Headline(label=f"{precision} TPOT", metric="reduced.tpot.p50", unit="ms", scale=1e3),
            Headline(label="speed-up", metric="speedup.tpot_p50_ratio", unit="x"),
            Headline(
                label="same tokens", metric="agreement.prefix_share_mean", unit="%", scale=100
            ),
        ],
        window={"requests": len(phases["fp32"]["records"])},
        seeds={"requests": settings.seed + 2000, "model": settings.seed},
    )
