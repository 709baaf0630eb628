"""Image preprocessing: DALI vs PIL vs OpenCV, stage by stage, alone and before inference.

``preprocessing`` cells (backend x batch size x worker threads): images/s and batch
latency of back-to-back batches, the time per image of decode, resize (+ crop) and
normalize, and this process's CPU use: near all cores busy, preprocessing alone would
starve an accelerator.

``preprocessing_e2e`` cells (backend x batch x mode): the embedded classifier (or an
image ``--model``) on the cell's engine after preprocessing, ``serial`` (preprocess, then
infer) or ``pipelined`` (a producer thread keeps up to two preprocessed batches in a
queue while inference runs). Latency per batch from its preprocessing start.

Both compare every backend's output, image by image over the whole corpus, with the
reference (PIL): max and mean absolute difference and, in e2e cells, the classifier's
top-1 agreement. Beyond ``TOLERANCE`` the cell carries a warning: shown, not hidden.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from harness.api import (
    Cell,
    Evidence,
    Headline,
    OpenEngine,
    ProfileName,
    ReportSpec,
    RunSettings,
    StagesPlot,
    TensorEngine,
    TensorSpec,
    settings_of,
    stats,
)
from workloads.lib import pipeline, reporting
from workloads.lib.backends import BACKENDS, REFERENCE, make
from workloads.lib.pipeline import Corpus, Limits, Tolerance, Window
from workloads.lib.preprocess import Preprocessor, Transform, Unavailable
from workloads.lib.usermodel import open_model

TOLERANCE = Tolerance()
MODEL = "tiny-cnn"
MODES = ("serial", "pipelined")

# (batch sizes, worker threads) for the preprocessing cells; batch sizes for e2e cells.
GRIDS: dict[ProfileName, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {
    ProfileName.QUICK: ((1, 8), (1, 2), (8,)),
    ProfileName.FULL: ((1, 8, 32), (1, 2, 4), (8, 32)),
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    name = metafunc.function.__name__
    if name not in ("test_preprocessing", "test_preprocessing_e2e"):
        return
    batches, threads, e2e_batches = GRIDS[settings_of(metafunc.config).profile.name]
    if name == "test_preprocessing":
        grid: list[tuple[str, int, Any]] = [
            (b, n, t) for b in BACKENDS for n in batches for t in threads
        ]
        ids = [f"{b}-b{n}-t{t}" for b, n, t in grid]
        metafunc.parametrize(("backend", "batch", "threads"), grid, ids=ids)
    else:
        grid = [(b, n, m) for b in BACKENDS for n in e2e_batches for m in MODES]
        ids = [f"{b}-b{n}-{m}" for b, n, m in grid]
        metafunc.parametrize(("backend", "batch", "mode"), grid, ids=ids)


@pytest.fixture(scope="module")
def corpus(harness_settings: RunSettings) -> Corpus:
    return pipeline.load_corpus(harness_settings.images, harness_settings.seed)


@contextlib.contextmanager
def _open(name: str, transform: Transform, threads: int) -> Iterator[Preprocessor]:
    try:
        backend = make(name, transform, threads)
    except Unavailable as exc:
        pytest.skip(str(exc))
    try:
        yield backend
    finally:
        backend.close()


def _limits(settings: RunSettings) -> Limits:
    profile = settings.profile
    # a third of the cell's deadline: a slow backend ends short (and invalid), not killed
    return Limits(profile.window_s, profile.policy.min_samples, settings.cell_timeout_s / 3)


def _latency(window: Window) -> dict[str, Any]:
    per_batch = np.asarray(window.latency)
    return {
        "latency": stats.to_json(stats.summarize(per_batch)),
        "item_latency": stats.to_json(stats.summarize(per_batch / window.batch)),
        "throughput": {
            "images_per_s": window.images / window.wall_s if window.wall_s > 0 else 0.0,
            "batches": len(window.latency),
            "images": window.images,
        },
        "cpu": window.cpu(),
    }


def _stage_times(staged: Window) -> dict[str, Any]:
    """Wall seconds per image of each stage, from ``staged`` runs over the corpus."""
    total = sum(sum(v) for v in staged.spans.values())
    return {
        stage: {"per_image_s": sum(v) / staged.images, "share": sum(v) / total if total else None}
        for stage, v in staged.spans.items()
    }


def _evidence(window: Window, found: dict[str, Any]) -> Evidence:
    notes = tuple(f"parity vs {REFERENCE}: {b}" for b in found["breaches"])
    return Evidence(
        samples=len(window.latency),
        failed=0,
        window_s=window.wall_s,
        notes=notes,
        span=window.span,  # the measured window alone: not the parity and staged passes
    )


def _finish(
    cell: Cell,
    window: Window,
    found: dict[str, Any],
    metrics: dict[str, Any],
    headline: list[Headline],
    settings: RunSettings,
) -> None:
    cell.finish(
        metrics=metrics | {"parity": found},
        evidence=_evidence(window, found),
        headline=headline,
        samples={"batch_latency": stats.as_samples(window.latency)}
        | {f"span_{k}": stats.as_samples(v) for k, v in window.spans.items()},
        window={
            "duration_s": window.wall_s,
            "batches": len(window.latency),
            "images": window.images,
        },
        seeds={"corpus": settings.seed},
    )


PARITY_HEADLINE = [
    Headline(label="max|d|", metric="parity.max_abs", unit=""),
    Headline(label="mean|d|", metric="parity.mean_abs", unit=""),
]

# What competes is the library doing the preprocessing (``engine/backend``); one whose
# output differs from the reference beyond tolerance is never recommended.
PREPROCESSING_E2E = ReportSpec(
    throughput=reporting.IMAGES, contender=("backend",), answer_checks=("parity vs ",)
)
PREPROCESSING = PREPROCESSING_E2E.model_copy(
    update={
        "plots": (
            StagesPlot(
                metric="stage_times",
                per="per_image_s",
                name="preprocessing-stages",
                section="Preprocessing stages",
                title="preprocessing: where the time goes, per image",
                caption="Decode, resize and normalize measured stage by stage over the corpus.",
                xlabel="ms per image",
                scale=1e3,
            ),
        )
    }
)


@pytest.mark.requires(family="tensor")
@pytest.mark.report_spec(PREPROCESSING)
def test_preprocessing(
    cell: Cell,
    harness_settings: RunSettings,
    corpus: Corpus,
    backend: str,
    batch: int,
    threads: int,
) -> None:
    transform = Transform()
    with _open(backend, transform, threads) as pre:
        cell.engine_info["preprocessing"] = pre.describe()
        reference = pipeline.reference_outputs(corpus, transform, REFERENCE)
        out = pipeline.run_over(pre, corpus, batch)  # also the warm-up
        found = pipeline.compare(out, reference, corpus.names, None, TOLERANCE)
        staged = pipeline.stage_pass(pre, corpus, batch)
        window = pipeline.preprocess_only(pre, corpus, batch, _limits(harness_settings))
    metrics = _latency(window) | {
        "stage_times": _stage_times(staged),
        "corpus": corpus.describe(),
        "warmup": {"parity_pass": 1, "staged_passes": 1},
    }
    headline = [
        Headline(label="tput", metric="throughput.images_per_s", unit="img/s"),
        Headline(label="p50", metric="latency.p50", unit="ms", scale=1e3, ci="latency.ci95.p50"),
        Headline(label="p99", metric="latency.p99", unit="ms", scale=1e3, ci="latency.ci95.p99"),
        *(
            Headline(label=s, metric=f"stage_times.{s}.per_image_s", unit="ms/img", scale=1e3)
            for s in ("decode", "resize", "normalize")
        ),
        Headline(label="cpu", metric="cpu.cores_busy", unit="cores"),
        *PARITY_HEADLINE,
    ]
    _finish(cell, window, found, metrics, headline, harness_settings)
    assert out.shape == (len(corpus.data), 3, transform.crop, transform.crop)
    assert set(staged.spans) == {"decode", "resize", "normalize"}


def image_input(specs: tuple[TensorSpec, ...]) -> tuple[str, Transform]:
    """The model's image input and the transform that fits it; skips a non-image model."""
    shaped = [s for s in specs if len(s.shape) == 4 and s.shape[1] == 3]
    if len(specs) != 1 or not shaped or shaped[0].dtype != np.float32:
        got = ", ".join(f"{s.name}{list(s.shape)} {s.dtype}" for s in specs)
        pytest.skip(
            f"preprocessing needs one float32 [N, 3, H, W] image input; the model has {got}"
        )
    height, width = shaped[0].shape[2:]
    if isinstance(height, int) and isinstance(width, int) and height > 0:
        if height != width:
            pytest.skip(f"the center-crop contract is square; the model takes {height}x{width}")
        default = Transform()
        return shaped[0].name, Transform(
            shorter=round(height * default.shorter / default.crop), crop=height
        )
    return shaped[0].name, Transform()


@pytest.mark.requires(family="tensor")
@pytest.mark.report_spec(PREPROCESSING_E2E)
def test_preprocessing_e2e(
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    corpus: Corpus,
    backend: str,
    batch: int,
    mode: str,
) -> None:
    # the parity check classifies the whole corpus in one call
    sizes = {batch, len(corpus.data)}
    engine: TensorEngine = open_model(open_engine, cell, harness_settings, MODEL, batches=sizes)
    name, transform = image_input(engine.input_specs())

    def classify(images: np.ndarray) -> np.ndarray:
        outputs = engine.infer({name: images})
        return np.asarray(next(iter(outputs.values())))

    with _open(backend, transform, 1) as pre:
        cell.engine_info["preprocessing"] = pre.describe()
        reference = pipeline.reference_outputs(corpus, transform, REFERENCE)
        out = pipeline.run_over(pre, corpus, batch)
        engine.warmup({name: out[:batch]}, harness_settings.profile.warmup_iterations)
        found = pipeline.compare(out, reference, corpus.names, classify, TOLERANCE)
        measure = pipeline.serial if mode == "serial" else pipeline.pipelined
        window = measure(pre, classify, corpus, batch, _limits(harness_settings))
    spans = {k: np.asarray(v) for k, v in window.spans.items()}
    metrics = _latency(window) | stats.stage_breakdown(spans, np.asarray(window.latency))
    metrics |= {"corpus": corpus.describe(), "mode": {"name": mode, "queue_depth": 2}}
    headline = [
        Headline(label="p50", metric="latency.p50", unit="ms", scale=1e3, ci="latency.ci95.p50"),
        Headline(label="p99", metric="latency.p99", unit="ms", scale=1e3, ci="latency.ci95.p99"),
        Headline(label="tput", metric="throughput.images_per_s", unit="img/s"),
        Headline(label="prep", metric="time_account.preprocess.share", unit="%", scale=100),
        Headline(label="infer", metric="stages.infer.p50", unit="ms", scale=1e3),
        Headline(label="top-1", metric="parity.top1_agreement", unit="%", scale=100),
        Headline(label="cpu", metric="cpu.cores_busy", unit="cores"),
        *PARITY_HEADLINE,
    ]
    _finish(cell, window, found, metrics, headline, harness_settings)
    assert found["top1_agreement"] is not None
    assert set(window.spans) >= {"preprocess", "infer", "postprocess"}
