"""Plots of a run set: what a reader would rather look at than read.

Each plot is a pure function of the records, rendered by matplotlib (Agg) to SVG for the
HTML page and to SVG and PNG files for documents. Rendering is made deterministic (no
dates or software versions in the files, fixed SVG ids), so the same records give the
same bytes. Only ok cells are drawn: a cell that is not ok has no numbers to show.

Which plots a cell appears in is what its workload declared (``ReportSpec.plots``,
harness.results.reportspec): this module knows how to draw each kind, not which
workload wants which.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import matplotlib as mpl

mpl.use("Agg")
from matplotlib import pyplot as plt
from matplotlib.figure import Figure

from harness.load.capacity import LoadPoint
from harness.metrics.slo import BUILT_IN, parse_slos
from harness.report.runset import RunSet
from harness.results.records import CellRecord, Status, format_param
from harness.results.reportspec import (
    CdfPlot,
    HistogramPlot,
    LoadCurvePlot,
    LoadSearch,
    PlotSpec,
    PolicyCurvePlot,
    ReportSpec,
    StagesPlot,
)

P = TypeVar("P", bound=PlotSpec)

CDF_POINTS = 400
"""Quantiles drawn per CDF: enough for a smooth curve, few enough for a small page."""
MAX_LINES = 12
"""Lines per plot beyond which a plot is split: a legend of twenty is not read."""


@dataclass(frozen=True)
class Plot:
    """One figure: ``name`` is its file stem, ``svg`` inline markup, ``png`` the bytes."""

    name: str
    section: str
    title: str
    caption: str
    svg: str
    png: bytes


@dataclass(frozen=True)
class Cell:
    """An ok record, the matrix column it belongs to, and its workload's declaration."""

    column: str
    record: CellRecord
    spec: ReportSpec

    def declared(self, kind: type[P]) -> list[P]:
        """The plots of ``kind`` the workload declared."""
        return [p for p in self.spec.plots if isinstance(p, kind)]

    @property
    def label(self) -> str:
        params = ", ".join(f"{k}={format_param(v)}" for k, v in self.record.params.items())
        return f"{self.column} {params}".strip()


def ok_cells(runs: RunSet) -> list[Cell]:
    out = []
    for run in runs.runs:
        for rec in run.records:
            if rec.status is Status.OK:
                out.append(Cell(runs.column(run, rec.engine), rec, rec.reporting()))
    return sorted(out, key=lambda c: (c.record.workload, c.column, c.record.cell_id))


@contextmanager
def _figure(salt: str) -> Iterator[Figure]:
    style: Any = {
        "svg.hashsalt": salt,  # ids derive from it, not from a random source
        "svg.fonttype": "none",
        "font.size": 9,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "figure.dpi": 100,
    }
    with mpl.rc_context(style):
        fig = plt.figure(figsize=(7.5, 4.2))
        try:
            yield fig
        finally:
            plt.close(fig)


def _render(fig: Figure) -> tuple[str, bytes]:
    fig.tight_layout()
    svg, png = io.StringIO(), io.BytesIO()
    fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None})
    fig.savefig(png, format="png", metadata={"Software": None})
    text = svg.getvalue()
    return text[text.index("<svg") :], png.getvalue()


def make_plot(
    name: str, section: str, title: str, caption: str, draw: Callable[[Figure], None]
) -> Plot:
    with _figure(name) as fig:
        draw(fig)
        fig.suptitle(title, fontsize=10)
        svg, png = _render(fig)
    return Plot(name, section, title, caption, svg, png)


def slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text).strip("-").lower()


def legend(ax: Any) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best", framealpha=0.8)


# -- latency vs throughput ---------------------------------------------------------------


def _search(cell: Cell) -> LoadSearch | None:
    """The load search whose curve the workload asked for."""
    return cell.spec.search if cell.declared(LoadCurvePlot) else None


def _points(cell: Cell) -> list[LoadPoint]:
    search = _search(cell)
    pts = cell.record.metric(search.points) if search is not None else None
    if isinstance(pts, list) and pts:
        return [cast(LoadPoint, p) for p in pts if isinstance(p, dict)]
    return []


def _slo_lines(cell: Cell) -> list[float]:
    search = _search(cell)
    objective = cell.record.metric(search.objective) if search and search.objective else None
    if not isinstance(objective, str):
        return []
    return [s.threshold_s for s in parse_slos(objective) if s.metric == "e2e"]


def _knee(cell: Cell) -> float | None:
    search = _search(cell)
    value = cell.record.metric(f"{search.settled}.load") if search is not None else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _curve(ax: Any, cell: Cell) -> None:
    pts = sorted(_points(cell), key=lambda p: float(p.get("load", 0.0)))
    xs = [float(p["throughput"]) for p in pts]
    ys = [float(v) * 1e3 for p in pts if (v := p.get("latency_p99_s")) is not None]
    if len(ys) != len(xs):
        return
    (line,) = ax.plot(xs, ys, marker="o", ms=3, label=cell.label)
    knee = _knee(cell)
    at = [i for i, p in enumerate(pts) if knee is not None and math.isclose(p["load"], knee)]
    if at:
        ax.plot([xs[at[0]]], [ys[at[0]]], marker="*", ms=14, color=line.get_color(), ls="")
        ax.annotate("knee", (xs[at[0]], ys[at[0]]), textcoords="offset points", xytext=(6, 6))


def latency_throughput(cells: Sequence[Cell]) -> list[Plot]:
    """p99 latency against achieved throughput along each load sweep; the knee starred
    and the SLO as a dashed line."""
    swept = [c for c in cells if _points(c)]
    plots = []
    for workload, group in _by_workload(swept):

        def draw(fig: Figure, group: list[Cell] = group) -> None:
            ax = fig.add_subplot()
            for cell in group:
                _curve(ax, cell)
            for threshold in sorted({t for c in group for t in _slo_lines(c)}):
                ax.axhline(threshold * 1e3, ls="--", color="crimson", lw=1)
                ax.annotate(
                    f"SLO e2e p99 {threshold * 1e3:g} ms",
                    (0.01, threshold * 1e3),
                    xycoords=("axes fraction", "data"),
                    color="crimson",
                    va="bottom",
                )
            ax.set(xlabel="achieved throughput (req/s)", ylabel="e2e p99 (ms)", yscale="log")
            legend(ax)

        plots.append(
            make_plot(
                f"latency-throughput-{slug(workload)}",
                "Latency vs throughput",
                f"{workload}: p99 latency vs throughput",
                "Each point is one offered load of the sweep; the star is the knee "
                "(the last load the system kept up with), the dashed line the SLO.",
                draw,
            )
        )
    for workload, group in _by_workload(c for c in cells if c.declared(PolicyCurvePlot)):
        plots += _policy_curves(workload, group)
    return plots


def _policy_curves(workload: str, cells: Sequence[Cell]) -> list[Plot]:
    """One line per configuration (the parameters but ``over``), a point per ``over``."""
    decl = cells[0].declared(PolicyCurvePlot)[0]
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for cell in cells:
        rec = cell.record
        tput, p99 = rec.metric(decl.throughput), rec.metric(decl.latency)
        if tput is None or p99 is None:
            continue
        policy = {k: v for k, v in rec.params.items() if k != decl.over}
        key = f"{cell.column} " + ", ".join(f"{k}={format_param(v)}" for k, v in policy.items())
        series[key].append((float(tput), float(p99) * 1e3))
    if not series:
        return []

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        for key in sorted(series):
            xs, ys = zip(*sorted(series[key]), strict=True)
            ax.plot(xs, ys, marker="o", ms=4, label=key)
        ax.set(xlabel="achieved throughput (req/s)", ylabel="e2e p99 (ms)", yscale="log")
        legend(ax)

    return [
        make_plot(
            f"latency-throughput-{slug(workload)}",
            "Latency vs throughput",
            f"{workload}: p99 latency vs throughput per {decl.per}",
            decl.caption,
            draw,
        )
    ]


# -- CDFs --------------------------------------------------------------------------------


def _by_workload(cells: Iterable[Cell]) -> list[tuple[str, list[Cell]]]:
    groups: dict[str, list[Cell]] = defaultdict(list)
    for cell in cells:
        groups[cell.record.workload].append(cell)
    return sorted(groups.items())


def _chunks(cells: list[Cell]) -> list[list[Cell]]:
    return [cells[i : i + MAX_LINES] for i in range(0, len(cells), MAX_LINES)]


def cdfs(cells: Sequence[Cell], metric: str, what: str) -> list[Plot]:
    """Empirical CDF of ``metric``'s raw samples, one line per cell, per workload."""
    with_samples = [c for c in cells if len(c.record.samples.get(metric, ())) > 1]
    plots = []
    for workload, group in _by_workload(with_samples):
        for part, chunk in enumerate(_chunks(group), start=1):

            def draw(fig: Figure, chunk: list[Cell] = chunk) -> None:
                ax = fig.add_subplot()
                probs = [i / (CDF_POINTS - 1) for i in range(CDF_POINTS)]
                for cell in chunk:
                    xs = _quantiles(cell.record.samples[metric], probs)
                    ax.plot([x * 1e3 for x in xs], probs, lw=1.2, label=cell.label)
                ax.set(xlabel=f"{metric} (ms, log)", ylabel="fraction of requests", xscale="log")
                ax.set_ylim(0, 1)
                legend(ax)

            suffix = f" ({part}/{len(_chunks(group))})" if len(group) > MAX_LINES else ""
            plots.append(
                make_plot(
                    f"cdf-{metric}-{slug(workload)}-{part}",
                    f"{what} distributions",
                    f"{workload}: {what} CDF{suffix}",
                    f"Share of requests at or below each {metric}; the tail is on the right.",
                    draw,
                )
            )
    return plots


def _quantiles(samples: Sequence[float], probs: Sequence[float]) -> list[float]:
    finite = sorted(x for x in samples if math.isfinite(x))
    if not finite:
        return [math.nan] * len(probs)
    n = len(finite)
    return [finite[min(n - 1, max(0, math.ceil(p * n) - 1))] for p in probs]


# -- batch sizes, stages, telemetry ------------------------------------------------------


def _shared(cells: Sequence[Cell], kind: type[HistogramPlot] | type[StagesPlot]) -> list[Any]:
    """(declaration, its cells) per plot ``name`` of ``kind``, in order of appearance."""
    groups: dict[str, tuple[Any, list[Cell]]] = {}
    for cell in cells:
        for decl in cell.declared(kind):
            groups.setdefault(decl.name, (decl, []))[1].append(cell)
    return list(groups.values())


def histograms(cells: Sequence[Cell]) -> list[Plot]:
    """Shares of each value of a declared histogram (how full the batches were), a bar
    per cell, the cells of every workload declaring the same plot together."""
    plots = []
    for decl, group in _shared(cells, HistogramPlot):
        plots += _histogram(decl, [c for c in group if c.record.histograms.get(decl.histogram)])
    return plots


def _histogram(decl: HistogramPlot, cells: list[Cell]) -> list[Plot]:
    plots = []
    for part, chunk in enumerate(_chunks(cells), start=1):

        def draw(fig: Figure, chunk: list[Cell] = chunk) -> None:
            ax = fig.add_subplot()
            width = 0.8 / len(chunk)
            for i, cell in enumerate(chunk):
                counts = cell.record.histograms[decl.histogram]
                total = sum(counts.values()) or 1
                xs = [int(k) + (i - (len(chunk) - 1) / 2) * width for k in counts]
                ax.bar(xs, [v / total for v in counts.values()], width, label=cell.label)
            ax.set(xlabel=decl.xlabel, ylabel=decl.ylabel)
            legend(ax)

        plots.append(make_plot(f"{decl.name}-{part}", decl.section, decl.title, decl.caption, draw))
    return plots


def stages(cells: Sequence[Cell]) -> list[Plot]:
    """Stacked time of each stage a declared stage breakdown holds, per configuration."""
    plots = []
    for decl, group in _shared(cells, StagesPlot):
        staged = [c for c in group if isinstance(c.record.metric(decl.metric), dict)]
        if staged:
            plots.append(_stages(decl, staged))
    return plots


def _stages(decl: StagesPlot, staged: list[Cell]) -> Plot:
    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        names = list(dict.fromkeys(s for c in staged for s in c.record.metric(decl.metric)))
        labels = [c.label for c in staged]
        bottom = [0.0] * len(staged)
        for stage in names:
            heights = [
                float(c.record.metric(f"{decl.metric}.{stage}.{decl.per}") or 0.0) * decl.scale
                for c in staged
            ]
            ax.barh(labels, heights, left=bottom, label=stage)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.set(xlabel=decl.xlabel)
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=6)
        legend(ax)

    return make_plot(decl.name, decl.section, decl.title, decl.caption, draw)


def telemetry(cells: Sequence[Cell]) -> list[Plot]:
    """CPU use and memory over each column's cells, laid end to end in run order."""
    plots = []
    for column in sorted({c.column for c in cells}):
        series = [c for c in cells if c.column == column and c.record.telemetry.get("series")]
        series.sort(key=lambda c: c.record.started_at)
        if not series:
            continue

        def draw(fig: Figure, series: list[Cell] = series) -> None:
            ax = fig.add_subplot()
            mem = ax.twinx()
            offset = 0.0
            for cell in series:
                s = cell.record.telemetry["series"]
                t = [offset + float(x) for x in s.get("t", [])]
                cpu = [
                    float(u) + float(v)
                    for u, v in zip(
                        s.get("cpu_user_pct", []), s.get("cpu_system_pct", []), strict=False
                    )
                ]
                ax.plot(t[1 : len(cpu) + 1], cpu, color="tab:blue", lw=0.8)
                mem.plot(
                    t,
                    [float(b) / 2**20 for b in s.get("rss_bytes", [])],
                    color="tab:orange",
                    lw=0.8,
                )
                ax.axvline(offset, color="grey", lw=0.3)
                offset = t[-1] if t else offset
            ax.set(
                xlabel="seconds of measurement (cells end to end)", ylabel="process CPU % (blue)"
            )
            mem.set_ylabel("RSS MiB (orange)")

        plots.append(
            make_plot(
                f"telemetry-{slug(column)}",
                "Telemetry",
                f"{column}: CPU and memory over the run",
                "Sampled during each cell (grey lines separate cells); idle time between "
                "cells is left out.",
                draw,
            )
        )
    return plots


def declared_cdfs(cells: Sequence[Cell]) -> list[Plot]:
    """The CDFs the workloads declared, per sample set: the harness's own latencies in
    their order (TTFT before E2E), then any other in name order."""
    groups: dict[str, list[Cell]] = defaultdict(list)
    what: dict[str, str] = {}
    for cell in cells:
        for decl in cell.declared(CdfPlot):
            groups[decl.samples].append(cell)
            what.setdefault(decl.samples, decl.what)
    order = BUILT_IN
    keys = sorted(groups, key=lambda k: (order.index(k) if k in order else len(order), k))
    return [plot for key in keys for plot in cdfs(groups[key], key, what[key])]
