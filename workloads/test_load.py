"""Load and capacity: the knee, the largest rate that meets an SLO, stability over time,
and behaviour under shaped load, for tensor and generative engines alike.

* sweep: raise the load step by step (request rate for tensor engines, concurrent users
  for generative ones) until latency or errors blow up or throughput stops growing; the
  knee is the last point before that.
* capacity: the largest request rate whose objective (``--slo``, else the default below)
  holds, by bracketing and bisection on measured points, with the bracketing points,
  and the capacity point measured again (the profile's ``repeats``) for its spread.
* soak: a fixed load for the profile's soak time, latency per window and memory drift.

A rate point a sweep or capacity search explores stops early when its queue and latency
grow without bound (``--early-stop``, harness.load.saturation; generative points through
harness.load.streamstop, in this process only: with ``--clients N`` they run in full and
the record says why): it is past the knee whatever its full window would show. A cell of
one fixed load always runs in full.
* shape: clumped (gamma) arrivals, a burst from base rate to peak and back, a ramp.

Every point is judged by the same validity rules as any cell; an invalid point never
becomes the knee or the capacity. Open-loop latency counts from the scheduled time.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

import numpy as np
import pytest

from harness.api import (
    Cell,
    OpenEngine,
    OpenLoop,
    ProfileName,
    ReportSpec,
    RunSettings,
    settings_of,
)
from workloads.lib import inputs, reporting
from workloads.lib.generative import load_source, model_dir, vocab_size
from workloads.lib.load import (
    GenerativeTarget,
    TensorTarget,
    finish_capacity,
    finish_shape,
    finish_soak,
    finish_sweep,
)
from workloads.lib.loadgen import (
    SLO,
    Arrivals,
    BatchPolicy,
    DynamicBatching,
    EarlyStopRule,
    KneeRule,
    NoBatching,
    RateShape,
    Schedule,
    SearchPolicy,
    ShapedLoad,
    capacity_search,
    parse_slos,
    slos_on,
    sweep,
)
from workloads.lib.usermodel import open_model

Target = TypeVar("Target", TensorTarget, GenerativeTarget)

MODEL = "tiny-cnn"
DISTINCT_INPUTS = 64

TENSOR_OBJECTIVE = "e2e_p99=10ms"
GENERATIVE_OBJECTIVE = "ttft_p99=500ms,e2e_p99=2s"
PROMPT = (32, 16, 64)  # median, min, max tokens: short requests, many of them
OUTPUT = (16, 8, 32)

RATES = {
    ProfileName.QUICK: (250.0, 500.0, 1000.0, 2000.0, 4000.0, 8000.0),
    ProfileName.FULL: tuple(round(100 * 1.5**k) * 1.0 for k in range(16)),  # 100 .. 44k
}
USERS = {
    ProfileName.QUICK: (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0),
    ProfileName.FULL: (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0),
}
TENSOR_SEARCH = {"start": 500.0, "floor": 25.0, "ceiling": 200_000.0}
GENERATIVE_SEARCH = {"start": 32.0, "floor": 0.5, "ceiling": 4096.0}
SOAK_RATE = {"tensor": 500.0, "generative": 20.0}
SHAPES = ("gamma-cv3", "burst", "ramp")
SHAPE_RATES = {"tensor": (300.0, 3000.0), "generative": (10.0, 40.0)}  # base, peak


def _objective(settings: RunSettings, family: str) -> str:
    """The user's SLOs on the latencies the family's cells measure, else its default."""
    held = reporting.SERVED if family == "tensor" else reporting.STREAMED
    slos = slos_on(settings.slos, [x.name for x in held])
    if not slos:
        slos = parse_slos(TENSOR_OBJECTIVE if family == "tensor" else GENERATIVE_OBJECTIVE)
    return ",".join(f"{s.key}={s.threshold_s * 1e3:g}ms" for s in slos)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "objective" in metafunc.fixturenames:
        family = "generative" if "generative" in metafunc.function.__name__ else "tensor"
        metafunc.parametrize("objective", [_objective(settings_of(metafunc.config), family)])


def _tensor_target(
    cell: Cell,
    open_engine: OpenEngine,
    settings: RunSettings,
    slos: tuple[SLO, ...],
    policy: BatchPolicy,
) -> TensorTarget:
    sizes = range(1, policy.max_batch + 1)
    engine = open_model(open_engine, cell, settings, MODEL, batches=sizes)
    rng = np.random.default_rng(settings.seed)
    pool = [
        inputs.synthesize(engine.input_specs(), settings.dims, rng) for _ in range(DISTINCT_INPUTS)
    ]
    for size in sorted({1, policy.max_batch}):
        engine.warmup(inputs.collate(pool[:size]), settings.profile.warmup_iterations)
    return TensorTarget(engine, pool, settings, slos, settings.seed + 3000, policy)


def _searching(target: Target, settings: RunSettings) -> Target:
    """The target with the search's early stop, unless ``--early-stop=off`` (with several
    client processes a generative target records why its points ran in full)."""
    if settings.early_stop:
        target.early_stop = EarlyStopRule.for_policy(settings.profile.policy)
    return target


def _generative_target(
    request: pytest.FixtureRequest,
    cell: Cell,
    open_engine: OpenEngine,
    settings: RunSettings,
    aio: asyncio.Runner,
    slos: tuple[SLO, ...],
) -> GenerativeTarget:
    model = model_dir(settings)
    # with --clients N, N client processes share the load (the engine here reports)
    _, source = load_source(request, open_engine, cell, model, aio)
    target = GenerativeTarget(
        source, settings, slos, vocab_size(model), settings.seed + 4000, PROMPT, OUTPUT
    )
    source.warm_up(target.requests(8), 8)  # also opens connections
    return target


def _rule(settings: RunSettings, *, plateau: bool = False) -> KneeRule:
    return KneeRule(max_error_rate=settings.profile.policy.max_error_rate, plateau=plateau)


def _search(settings: RunSettings, bounds: dict[str, float]) -> SearchPolicy:
    return SearchPolicy(
        **bounds,
        tolerance=settings.profile.search_tolerance,
        max_points=settings.profile.search_points,
    )


# A search settles on a load point of its own: its load is part of the answer. The
# capacity objective and the batching are configuration; a traffic shape is the question.
SEARCH_PLOTS = (reporting.LOAD_CURVE, reporting.E2E_CDF)
GENERATIVE_SEARCH_PLOTS = (reporting.LOAD_CURVE, reporting.TTFT_CDF, reporting.E2E_CDF)
TENSOR_SERVED = ReportSpec(
    throughput=reporting.REQUESTS,
    timing_floor=reporting.LAG_P99,
    plots=(reporting.E2E_CDF,),
    latencies=reporting.SERVED,
)
GENERATIVE_SERVED = ReportSpec(
    throughput=reporting.REQUESTS,
    tokens=reporting.TOKENS,
    timing_floor=reporting.LAG_P99,
    plots=(reporting.TTFT_CDF, reporting.E2E_CDF),
    latencies=reporting.STREAMED,
)
RATE_SWEEP = ReportSpec(search=reporting.SWEEP, plots=SEARCH_PLOTS, latencies=reporting.SERVED)
CAPACITY = ReportSpec(search=reporting.CAPACITY, plots=SEARCH_PLOTS, latencies=reporting.SERVED)
SOAK = TENSOR_SERVED
LOAD_SHAPE = TENSOR_SERVED.model_copy(update={"scenario": ("shape",)})
USERS_SWEEP = ReportSpec(
    search=reporting.SWEEP,
    tokens=reporting.TOKENS,
    plots=GENERATIVE_SEARCH_PLOTS,
    latencies=reporting.STREAMED,
)
GENERATIVE_CAPACITY = USERS_SWEEP.model_copy(update={"search": reporting.CAPACITY})
GENERATIVE_SOAK = GENERATIVE_SERVED
GENERATIVE_SHAPE = GENERATIVE_SERVED.model_copy(update={"scenario": ("shape",)})


@pytest.mark.requires(family="tensor")
@pytest.mark.report_spec(RATE_SWEEP)
def test_rate_sweep(cell: Cell, open_engine: OpenEngine, harness_settings: RunSettings) -> None:
    target = _tensor_target(
        cell, open_engine, harness_settings, harness_settings.slos, NoBatching()
    )
    _searching(target, harness_settings)
    result = sweep(target.rate_point, RATES[harness_settings.profile.name], _rule(harness_settings))
    finish_sweep(cell, result, target.points, "req/s", {"arrivals": target.seed})


@pytest.mark.requires(family="tensor")
@pytest.mark.report_spec(CAPACITY)
@pytest.mark.parametrize("batching", ["none", "dynamic-b8-2ms"])
def test_capacity(
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    objective: str,
    batching: str,
) -> None:
    policy: BatchPolicy = NoBatching() if batching == "none" else DynamicBatching(8, 0.002)
    slos = parse_slos(objective)
    target = _searching(
        _tensor_target(cell, open_engine, harness_settings, slos, policy), harness_settings
    )
    result = capacity_search(target.rate_point, _search(harness_settings, TENSOR_SEARCH))
    _finish_capacity(cell, result, target, objective, harness_settings)


def _finish_capacity(
    cell: Cell,
    result: Any,
    target: TensorTarget | GenerativeTarget,
    objective: str,
    settings: RunSettings,
) -> None:
    reps = []
    target.early_stop = None  # the capacity point's repetitions measure it in full
    if result.capacity is not None:
        kept = target.points[result.capacity.load]  # the record keeps the first measurement
        reps = [
            target.rate_point(result.capacity.load) for _ in range(settings.profile.repeats - 1)
        ]
        target.points[result.capacity.load] = kept
    off = target.early_stop_off if isinstance(target, GenerativeTarget) else None
    finish_capacity(
        cell,
        result,
        target.points,
        reps,
        objective=objective,
        seeds={"arrivals": target.seed},
        early_stop_off=off,
    )


@pytest.mark.requires(family="tensor")
@pytest.mark.report_spec(SOAK)
def test_soak(cell: Cell, open_engine: OpenEngine, harness_settings: RunSettings) -> None:
    profile = harness_settings.profile
    target = _tensor_target(
        cell, open_engine, harness_settings, harness_settings.slos, NoBatching()
    )
    run = target.serve(OpenLoop(rate=SOAK_RATE["tensor"], duration=profile.soak_s), target.seed)
    finish_soak(cell, run, profile.soak_s, profile.soak_windows, {"arrivals": target.seed})


def _shape(name: str, family: str, duration: float) -> tuple[Schedule, list[float], dict[str, Any]]:
    """The schedule, its phase edges (seconds) and a description for the record."""
    base, peak = SHAPE_RATES[family]
    third = duration / 3
    if name == "gamma-cv3":
        load: Schedule = OpenLoop(
            rate=base, duration=duration, arrivals=Arrivals.GAMMA, burstiness=3.0
        )
        edges = [0.0, duration / 2, duration]
        doc = {"arrivals": "gamma", "burstiness": 3.0, "rate": base}
    elif name == "burst":
        load = ShapedLoad(RateShape.burst(base, peak, third, third, duration))
        edges = [0.0, third, 2 * third, duration]  # before, during, after
        doc = {"base": base, "peak": peak, "burst_from_s": third, "burst_s": third}
    else:
        load = ShapedLoad(RateShape.ramp(base, peak, duration))
        edges = list(np.linspace(0.0, duration, 5))
        doc = {"from": base, "to": peak}
    return load, edges, {"name": name, "duration_s": duration, **doc}


@pytest.mark.requires(family="tensor")
@pytest.mark.report_spec(LOAD_SHAPE)
@pytest.mark.parametrize("shape", SHAPES)
def test_load_shape(
    cell: Cell, open_engine: OpenEngine, harness_settings: RunSettings, shape: str
) -> None:
    target = _tensor_target(
        cell, open_engine, harness_settings, harness_settings.slos, NoBatching()
    )
    load, edges, doc = _shape(shape, "tensor", harness_settings.profile.window_s * 2)
    run = target.serve(load, target.seed)
    finish_shape(cell, run, edges, doc, {"arrivals": target.seed})


@pytest.mark.requires(family="generative", streaming=True)
@pytest.mark.report_spec(USERS_SWEEP)
def test_generative_users_sweep(
    request: pytest.FixtureRequest,
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    aio: asyncio.Runner,
) -> None:
    target = _generative_target(
        request, cell, open_engine, harness_settings, aio, harness_settings.slos
    )
    rule = _rule(harness_settings, plateau=True)
    result = sweep(target.users_point, USERS[harness_settings.profile.name], rule)
    finish_sweep(cell, result, target.points, "users", {"requests": target.seed})


@pytest.mark.requires(family="generative", streaming=True)
@pytest.mark.report_spec(GENERATIVE_CAPACITY)
def test_generative_capacity(
    request: pytest.FixtureRequest,
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    aio: asyncio.Runner,
    objective: str,
) -> None:
    slos = parse_slos(objective)
    target = _searching(
        _generative_target(request, cell, open_engine, harness_settings, aio, slos),
        harness_settings,
    )
    result = capacity_search(target.rate_point, _search(harness_settings, GENERATIVE_SEARCH))
    _finish_capacity(cell, result, target, objective, harness_settings)


@pytest.mark.requires(family="generative", streaming=True)
@pytest.mark.report_spec(GENERATIVE_SOAK)
def test_generative_soak(
    request: pytest.FixtureRequest,
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    aio: asyncio.Runner,
) -> None:
    profile = harness_settings.profile
    target = _generative_target(
        request, cell, open_engine, harness_settings, aio, harness_settings.slos
    )
    run = target.serve(OpenLoop(rate=SOAK_RATE["generative"], duration=profile.soak_s))
    finish_soak(cell, run, profile.soak_s, profile.soak_windows, {"requests": target.seed})


@pytest.mark.requires(family="generative", streaming=True)
@pytest.mark.report_spec(GENERATIVE_SHAPE)
@pytest.mark.parametrize("shape", SHAPES)
def test_generative_shape(
    request: pytest.FixtureRequest,
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    aio: asyncio.Runner,
    shape: str,
) -> None:
    target = _generative_target(
        request, cell, open_engine, harness_settings, aio, harness_settings.slos
    )
    load, edges, doc = _shape(shape, "generative", max(harness_settings.profile.window_s * 5, 20.0))
    run = target.serve(load)
    finish_shape(cell, run, edges, doc, {"requests": target.seed})
