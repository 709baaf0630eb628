"""A reduced-precision engine against its fp32 reference: the same inputs through both,
how far the outputs move, and how much faster it is, timed interleaved in one window.

Interleaving (A B B A ...) puts both variants under the same machine state, so the
speed-up is a ratio measured in one run, not two runs on a shared, noisy machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.api import stats

Outputs = Mapping[str, npt.NDArray[Any]]
Infer = Callable[[Mapping[str, npt.NDArray[Any]]], Outputs]


@dataclass(frozen=True)
class Tolerance:
    """How far a precision may move the answers and still count as the same model:
    classifiers by top-1 agreement, other outputs by the cosine similarity of each row."""

    top1_agreement: float
    cosine_min: float

    def breaches(self, found: Mapping[str, Any]) -> list[str]:
        out = []
        for name, figures in found["outputs"].items():
            top1 = figures.get("top1_agreement")
            if top1 is not None and top1 < self.top1_agreement:
                out.append(f"{name}: top-1 agreement {top1:.1%} < {self.top1_agreement:.0%}")
            if figures["cosine_min"] < self.cosine_min:
                shown = f"{figures['cosine_min']:.5f}"
                out.append(f"{name}: cosine similarity min {shown} < {self.cosine_min:g}")
        return out


# Stated before measuring, from each format's precision: fp16 keeps an 11-bit significand,
# bf16 8 bits, dynamic int8 256 levels per tensor.
TOLERANCES = {
    "fp16": Tolerance(top1_agreement=0.99, cosine_min=0.999),
    "bf16": Tolerance(top1_agreement=0.99, cosine_min=0.995),
    "int8": Tolerance(top1_agreement=0.98, cosine_min=0.98),
}


def agreement(
    reference: Sequence[Outputs], reduced: Sequence[Outputs], classifier: bool
) -> dict[str, Any]:
    """Per output: max / mean |diff|, row cosine similarity, and (for a classifier's
    [batch, classes] output) top-1 agreement, over every batch of the pool."""
    found: dict[str, Any] = {}
    for name in reference[0]:
        ref = np.concatenate([r[name] for r in reference]).astype(np.float64)
        low = np.concatenate([r[name] for r in reduced]).astype(np.float64)
        rows_ref, rows_low = ref.reshape(len(ref), -1), low.reshape(len(low), -1)
        norms = np.linalg.norm(rows_ref, axis=1) * np.linalg.norm(rows_low, axis=1)
        cosine = np.sum(rows_ref * rows_low, axis=1) / np.maximum(norms, 1e-30)
        figures: dict[str, Any] = {
            "max_abs": float(np.abs(ref - low).max()),
            "mean_abs": float(np.abs(ref - low).mean()),
            "cosine_min": float(cosine.min()),
            "cosine_mean": float(cosine.mean()),
            "rows": len(ref),
        }
        if classifier and ref.ndim == 2 and ref.shape[1] > 1:
            figures["top1_agreement"] = float((ref.argmax(1) == low.argmax(1)).mean())
        found[name] = figures
    return {"outputs": found}


@dataclass
class Timed:
    """Interleaved per-call latencies (seconds) of the reference and the reduced engine."""

    reference: list[float]
    reduced: list[float]
    window_s: float
    span: tuple[float, float] | None = None
    """The window's first and last instant on perf_counter: its energy's window."""


def interleaved(
    reference: Infer,
    reduced: Infer,
    pool: Sequence[Mapping[str, npt.NDArray[Any]]],
    *,
    window_s: float,
    min_samples: int,
    budget_s: float,
) -> Timed:
    """A B B A ... on the pool's batches in turn, until both have ``min_samples`` calls and
    the window has lasted ``window_s`` (or ``budget_s`` runs out)."""
    out = Timed([], [], 0.0)
    clock = time.perf_counter
    start = clock()
    i = 0
    while True:
        elapsed = clock() - start
        enough = elapsed >= window_s and len(out.reduced) >= min_samples
        if enough or elapsed >= budget_s:
            break
        batch = pool[i % len(pool)]
        order = ((reference, out.reference), (reduced, out.reduced))
        for infer, sink in order if i % 2 == 0 else order[::-1]:
            t0 = clock()
            infer(batch)
            sink.append(clock() - t0)
        i += 1
    end = clock()
    out.window_s, out.span = end - start, (start, end)
    return out


def speedup(timed: Timed) -> dict[str, Any]:
    """Median reference latency over median reduced latency, with a conservative 95 %
    interval from the two medians' distribution-free intervals."""
    ref = np.sort(np.asarray(timed.reference))
    low = np.sort(np.asarray(timed.reduced))
    ref_lo, ref_hi = stats.quantile_ci(ref, 50.0)
    low_lo, low_hi = stats.quantile_ci(low, 50.0)
    ratio = stats.nearest_rank(ref, 50.0) / stats.nearest_rank(low, 50.0)  # the records' p50s
    lower = ref_lo / low_hi if ref_lo is not None and low_hi else None
    upper = ref_hi / low_lo if ref_hi is not None and low_lo else None
    return {"p50_ratio": ratio, "ci95": [lower, upper]}


def token_agreement(
    reference: Sequence[Sequence[int]], reduced: Sequence[Sequence[int]]
) -> dict[str, Any]:
    """Greedy outputs compared request by request: the share of tokens before the first
    divergence (mean and min) and the share of requests that match exactly."""
    prefixes = []
    for ref, low in zip(reference, reduced, strict=True):
        same = 0
        for a, b in zip(ref, low, strict=False):
            if a != b:
                break
            same += 1
        prefixes.append(same / max(len(ref), 1))
    exact = [list(a) == list(b) for a, b in zip(reference, reduced, strict=True)]
    return {
        "requests": len(prefixes),
        "prefix_share_mean": float(np.mean(prefixes)) if prefixes else 0.0,
        "prefix_share_min": float(np.min(prefixes)) if prefixes else 0.0,
        "exact_share": float(np.mean(exact)) if exact else 0.0,
    }


# greedy decoding: the share of each output before it first departs from fp32's
TOKEN_TOLERANCE = {"fp16": 0.9, "bf16": 0.8}
