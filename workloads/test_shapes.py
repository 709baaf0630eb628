"""Fixed vs dynamic shapes, with and without bucketing, on the same seeded requests.

Every request gets sizes for the model's dynamic dims (sequence length, or height and
width) drawn from a seeded log-normal distribution. The three modes serve the same
requests:

* ``fixed``: everything padded to the maximum, so the engine only ever sees one shape;
* ``dynamic``: each request at its own shape (no padding, many distinct shapes);
* ``bucketed``: padded up to the next of four bucket sizes per dim.

Closed loop, one request in flight, batch 1, so each latency is pure service time for
its shape. Warm-up runs the maximum shape only: the first request of every other shape
is reported apart ("first-seen") from steady state, and padding waste is counted.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from harness.api import (
    Cell,
    EngineError,
    Evidence,
    Headline,
    MonotonicClock,
    OpenEngine,
    Rate,
    ReportSpec,
    RunSettings,
    TensorEngine,
    TensorSpec,
    settings_of,
    stats,
)
from workloads.lib import inputs, models, modelset
from workloads.lib.loadgen import gc_paused
from workloads.lib.usermodel import open_model

EMBEDDED = ("tiny-encoder", "tiny-cnn-dynhw")  # as named in the tiny set (workloads.lib.modelset)
MODES = ("fixed", "dynamic", "bucketed")
INT_HIGH = models.VOCAB


def embedded_dims(model: str, settings: RunSettings) -> dict[str, int]:
    """Maximum size of each dynamic dim of the embedded model that stands for ``model``:
    the encoder's whole position table (256 tiny, 512 BERT-base); twice the side the CNN
    was built for (128 tiny, 448 ResNet-50)."""
    if model not in EMBEDDED:
        return {}
    found = modelset.sizes(model, settings)
    if found.max_sequence:
        return {"sequence": found.max_sequence}
    side = 2 * (found.image or 0)
    return {"height": side, "width": side}


def int_high(model: str, settings: RunSettings) -> int:
    """Token ids are drawn below this: the embedded encoder's vocabulary; for a user's
    model, the tiny encoder's (``INT_HIGH``: ids a text model surely has)."""
    vocab = modelset.sizes(model, settings).vocab if model in EMBEDDED else None
    return vocab or INT_HIGH


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function.__name__ != "test_shapes":
        return
    settings = settings_of(metafunc.config)
    names = ["user-model"] if settings.model else list(EMBEDDED)
    grid = [(m, mode) for m in names for mode in MODES]
    metafunc.parametrize(("model", "mode"), grid, ids=[f"{m}-{mode}" for m, mode in grid])


def draw_sizes(maxima: dict[str, int], n: int, rng: np.random.Generator) -> list[dict[str, int]]:
    """Per request, a size for each dim: log-normal around max/3, clipped to [max/8, max]."""
    drawn = {
        name: inputs.lengths(rng, n, top / 3.0, max(1, top // 8), top)
        for name, top in maxima.items()
    }
    return [{k: v[i] for k, v in drawn.items()} for i in range(n)]


def buckets_for(top: int) -> list[int]:
    return [max(1, top // 8), max(1, top // 4), max(1, top // 2), top]


def target_shape(mode: str, size: dict[str, int], maxima: dict[str, int]) -> dict[str, int]:
    if mode == "fixed":
        return dict(maxima)
    if mode == "dynamic":
        return dict(size)
    if mode == "bucketed":
        return {k: next(b for b in buckets_for(maxima[k]) if b >= v) for k, v in size.items()}
    raise ValueError(f"unknown shape mode {mode!r}")


def _shape_key(shape: dict[str, int]) -> str:
    return "x".join(f"{shape[k]}" for k in sorted(shape))


def _maxima(specs: tuple[TensorSpec, ...], model: str, settings: RunSettings) -> dict[str, int]:
    names = inputs.dim_names(specs)
    if not names:
        shapes = "; ".join(f"{s.name} {list(s.shape)}" for s in specs)
        pytest.skip(
            f"the model has no dynamic non-batch dims ({shapes}): there are no shapes to vary"
        )
    defaults = embedded_dims(model, settings)
    missing = [n for n in names if n not in settings.dims and n not in defaults]
    if missing:
        raise EngineError(
            "give the maximum size of each dynamic dim: "
            + " ".join(f"--dim {n}=MAX" for n in missing)
        )
    return {n: settings.dims.get(n, defaults.get(n, 0)) for n in names}


# One request in flight: no load generator lag to floor a comparison, no load to serve.
REPORT = ReportSpec(
    throughput=Rate(metric="throughput.requests_per_s", unit="req/s", counts="requests"),
    scenario=("model",),
)


@pytest.mark.requires(family="tensor", dynamic_shapes=True)
@pytest.mark.report_spec(REPORT)
def test_shapes(
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    model: str,
    mode: str,
) -> None:
    seed = harness_settings.seed
    engine: TensorEngine = open_model(open_engine, cell, harness_settings, model)
    specs = engine.input_specs()
    maxima = _maxima(specs, model, harness_settings)
    rng = np.random.default_rng(seed)
    sizes = draw_sizes(maxima, harness_settings.profile.requests, rng)
    high = int_high(model, harness_settings)
    warm = inputs.synthesize(specs, maxima, rng, int_high=high)
    engine.warmup(warm, harness_settings.profile.warmup_iterations)
    seen = {_shape_key(maxima)}

    targets = [target_shape(mode, size, maxima) for size in sizes]
    requests = [
        inputs.pad_to(inputs.synthesize(specs, size, rng, int_high=high), specs, target)
        for size, target in zip(sizes, targets, strict=True)
    ]
    with gc_paused():
        run = _serve_sequence(
            engine, sizes, targets, requests, seen, harness_settings.profile.window_s
        )
    latency = np.asarray(run.latency)
    first_seen = np.asarray(run.first_seen, dtype=bool)
    n, window = int(latency.size), run.window
    # A synchronous call cannot be abandoned; one answered after the request timeout has
    # failed all the same (its client gave up), and one that never returns meets the
    # cell's deadline.
    timeout = harness_settings.reliability.request_timeout_s
    late = latency > timeout
    failed = int(late.sum())

    steady = latency[~first_seen]
    cold = latency[first_seen]
    per_shape = _per_shape(run.keys, latency, first_seen)
    metrics = {
        "latency": stats.to_json(stats.summarize(latency[~late], failed)),
        "errors": {f"timeout after {timeout:g} s": failed} if failed else {},
        "steady": stats.to_json(stats.summarize(steady)),
        "first_seen": {
            **stats.to_json(stats.summarize(cold)),
            "ratio_to_steady_p50": _cold_ratio(per_shape),
        },
        "per_shape": per_shape,
        "shapes": {"distinct": len(per_shape), "dims": maxima},
        "padding": {
            "real_elements": run.real,
            "padded_elements": run.padded,
            "waste": 1.0 - run.real / run.padded if run.padded else 0.0,
        },
        "throughput": {"requests_per_s": n / window, "real_elements_per_s": run.real / window},
    }
    cell.finish(
        metrics=metrics,
        evidence=Evidence(
            samples=n - failed,
            failed=failed,
            window_s=window,
            negative_durations=int(np.sum(latency < 0)),
            span=run.span,
        ),
        headline=[
            Headline(label="p50", metric="latency.p50", unit="ms", scale=1e3),
            Headline(label="p99", metric="latency.p99", unit="ms", scale=1e3),
            Headline(label="first-seen p50", metric="first_seen.p50", unit="ms", scale=1e3),
            Headline(label="shapes", metric="shapes.distinct", unit=""),
            Headline(label="padding", metric="padding.waste", unit="%", scale=100.0),
            Headline(label="tput", metric="throughput.real_elements_per_s", unit="elem/s"),
        ],
        # Each headline statistic's samples, as compare recomputes it from them:
        # ``first_seen`` holds the latencies of the first requests of new shapes (what
        # first_seen.p50 summarizes), not the 0/1 flags of which requests those were.
        samples={
            "latency": stats.as_samples(latency[~late]),
            "first_seen": stats.as_samples(cold),
        },
        window={
            "duration_s": window,
            "requests": n,
            "distinct_requests": len(sizes),
            "warmup_iterations": harness_settings.profile.warmup_iterations,
        },
        seeds={"sizes": seed, "inputs": seed, "model": seed},
        single_stream="latency",  # one request in flight: each sample is one request's time
    )


@dataclass
class _Run:
    latency: list[float] = field(default_factory=list)
    first_seen: list[bool] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    real: int = 0
    padded: int = 0
    window: float = 0.0
    span: tuple[float, float] | None = None
    """The window's first and last instant on perf_counter: its energy's window."""


def _serve_sequence(
    engine: TensorEngine,
    sizes: list[dict[str, int]],
    targets: list[dict[str, int]],
    requests: list[dict[str, Any]],
    seen: set[str],
    window_s: float,
) -> _Run:
    """One request in flight, in order; the same sequence for every mode, repeated until
    the window is filled so that the fast modes are measured as long as the slow ones."""
    clock = MonotonicClock()
    run = _Run()
    t_start = clock.now()
    while not run.latency or clock.now() - t_start < window_s:
        for size, target, request in zip(sizes, targets, requests, strict=True):
            key = _shape_key(target)
            run.first_seen.append(key not in seen)
            seen.add(key)
            run.keys.append(key)
            run.real += int(np.prod(list(size.values())))
            run.padded += int(np.prod(list(target.values())))
            t0 = clock.now()
            engine.infer(request)
            run.latency.append(clock.now() - t0)
    t_end = clock.now()
    run.window, run.span = t_end - t_start, (t_start, t_end)
    return run


def _per_shape(
    keys: list[str], latency: np.ndarray[Any, Any], first: np.ndarray[Any, Any]
) -> dict[str, Any]:
    groups: dict[str, list[int]] = defaultdict(list)
    for i, key in enumerate(keys):
        groups[key].append(i)
    out: dict[str, Any] = {}
    for key in sorted(groups, key=lambda k: [int(p) for p in k.split("x")]):
        idx = np.asarray(groups[key])
        warm = latency[idx][~first[idx]]
        cold = latency[idx][first[idx]]
        summary = stats.summarize(warm)
        out[key] = {
            "count": int(idx.size),
            "first_seen": float(cold[0]) if cold.size else None,
            "steady_p50": summary.percentiles.get("p50"),
            "steady_max": summary.max,
        }
    return out


def _cold_ratio(per_shape: dict[str, Any]) -> float | None:
    """Median over shapes of first-seen latency / that shape's steady p50."""
    ratios = [
        v["first_seen"] / v["steady_p50"]
        for v in per_shape.values()
        if v["first_seen"] is not None and v["steady_p50"]
    ]
    return float(np.median(ratios)) if ratios else None
