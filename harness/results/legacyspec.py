"""The report declaration of a record that carries none: what the reports assumed about
every workload before workloads declared it (harness.results.reportspec).

Records written before then (schema 6 and older), and records of a workload that
declares nothing, are reported as they always were: the throughput is the first of the
conventional rate paths the record has, a record holding sweep or search points is a
load search, and so on. These rules are frozen: a new workload declares its own spec
instead of adding a rule here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from harness.results.reportspec import (
    CdfPlot,
    HistogramPlot,
    LoadCurvePlot,
    LoadSearch,
    Paired,
    PlotSpec,
    PolicyCurvePlot,
    Rate,
    ReportSpec,
    StagesPlot,
)

Lookup = Callable[[str], Any]
"""A record's dotted-path lookup into its metrics (``CellRecord.metric``)."""

REQUESTS = Rate(
    metric="throughput.requests_per_s",
    unit="req/s",
    counts="requests",
    ci="throughput.requests_per_s_ci95",
    completed="requests.ok",
)
RATES = (REQUESTS, Rate(metric="throughput.images_per_s", unit="img/s", counts="images"))
"""The first one a record has is its throughput."""

PAIRS = (
    Paired(
        own=Rate(metric="throughput.reduced_items_per_s", unit="items/s", counts="items"),
        reference=Rate(metric="throughput.reference_items_per_s", unit="items/s", counts="items"),
        reference_label="its fp32 reference path",
    ),
    Paired(
        own=Rate(metric="reduced.throughput.requests_per_s", unit="req/s", counts="requests"),
        reference=Rate(
            metric="reference.throughput.requests_per_s", unit="req/s", counts="requests"
        ),
        reference_label="its fp32 reference path",
    ),
)
"""A record with ``reference`` and ``reduced`` metrics measured both side by side: the
first pair whose two rates it has."""

SEARCHES = (
    LoadSearch(points="sweep.points", settled="knee", full="at_knee", objective="objective"),
    LoadSearch(
        points="search.points", settled="capacity", full="at_capacity", objective="objective"
    ),
)
"""A record with a list of points (maybe empty) under one of these is a load search."""

SCENARIO = ("model", "rate", "load", "level", "shape")
CONTENDER = ("backend",)
ANSWER_CHECKS = ("parity vs ", "precision ")
TIMING_FLOOR = "lag.p99"
TOKENS = "throughput.output_tokens_per_s"

CDFS = (CdfPlot(samples="ttft", what="TTFT"), CdfPlot(samples="e2e", what="E2E latency"))
BATCH_SIZES = HistogramPlot(
    histogram="batch_size",
    name="batch-sizes",
    section="Batch sizes",
    title="batch-size histograms",
    caption="Share of dispatched batches of each size: a static batch waits to fill, "
    "a dynamic one closes early at low load.",
    xlabel="batch size",
    ylabel="share of batches",
)
STAGES = StagesPlot(
    metric="stage_times",
    per="per_image_s",
    name="preprocessing-stages",
    section="Preprocessing stages",
    title="preprocessing: where the time goes, per image",
    caption="Decode, resize and normalize measured stage by stage over the corpus.",
    xlabel="ms per image",
    scale=1e3,
)
POLICY_CURVES: Mapping[str, PolicyCurvePlot] = {
    "batching": PolicyCurvePlot(
        over="rate",
        per="policy",
        caption="One line per batching policy; each point one offered rate of the batching grid.",
    ),
}
"""The one plot the reports drew by workload name."""


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def inferred(workload: str, metric: Lookup | None = None) -> ReportSpec:
    """The spec a record of ``workload`` without one is reported by; ``metric`` None for
    a planned cell that never wrote a record (only its question is needed then)."""
    search = paired = throughput = None
    if metric is not None:
        search = next((s for s in SEARCHES if _points(metric(s.points))), None)
        throughput = next((r for r in RATES if _number(metric(r.metric))), None)
        if all(isinstance(metric(k), dict) for k in ("reference", "reduced")):
            found = (
                p
                for p in PAIRS
                if _number(metric(p.own.metric)) and _number(metric(p.reference.metric))
            )
            paired = next(found, None)
    plots: list[PlotSpec] = [LoadCurvePlot()] if search is not None else []
    if workload in POLICY_CURVES:
        plots.append(POLICY_CURVES[workload])
    plots += [*CDFS, BATCH_SIZES, STAGES]
    return ReportSpec(
        throughput=throughput,
        tokens=TOKENS,
        paired=paired,
        search=search,
        scenario=SCENARIO,
        contender=CONTENDER,
        answer_checks=ANSWER_CHECKS,
        timing_floor=TIMING_FLOOR,
        plots=tuple(plots),
    )


def _points(value: object) -> bool:
    return isinstance(value, list)
