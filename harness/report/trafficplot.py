"""The traffic a generative cell carried, beside its latency plots: histograms of the
input tokens sent, the output tokens received (over what was asked, so replies that ended
before their cap show), and the time between scheduled arrivals, from the samples a
workload stores (``TrafficPlot`` in harness.results.reportspec)."""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.figure import Figure

from harness.report.plots import Cell, Plot, legend, make_plot, slug
from harness.results.reportspec import TrafficPlot

TRAFFIC_BINS = 40
"""Bins per traffic histogram at most (token counts get one bin per value below it)."""
WIDE_SPREAD = 100.0
"""Largest over smallest inter-arrival time beyond which its axis is logarithmic."""


@dataclass(frozen=True)
class Bars:
    """One histogram of a panel: ``counts[i]`` values fell in ``[edges[i], edges[i+1])``
    (the last bin closed) of the panel's edges."""

    label: str
    counts: tuple[int, ...]

    @property
    def n(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class Panel:
    """One axis of a traffic figure: its histograms share ``edges`` (in ``xlabel``'s
    unit); the first is filled, the others outlined over it."""

    key: str
    title: str
    xlabel: str
    edges: tuple[float, ...]
    bars: tuple[Bars, ...]
    log_x: bool = False


@dataclass(frozen=True)
class Traffic:
    """What a cell's traffic figure draws, and why a panel is not there (``notes``)."""

    name: str
    title: str
    panels: tuple[Panel, ...]
    notes: tuple[str, ...]


def _finite(cell: Cell, key: str, notes: list[str], what: str) -> list[float] | None:
    raw = cell.record.samples.get(key)
    if not raw:
        notes.append(f"no {key} samples ({what})" if raw is None else f"{key} is empty")
        return None
    values = [float(v) for v in raw if math.isfinite(v)]
    if len(values) < len(raw):
        notes.append(f"{len(raw) - len(values)} non-finite {key} values left out")
    return values or None


def _count(values: Sequence[float], edges: Sequence[float]) -> tuple[int, ...]:
    """Values per bin of ``edges`` (sorted), the last bin closed; none fall outside."""
    counts = [0] * (len(edges) - 1)
    for v in values:
        counts[min(len(counts) - 1, max(0, bisect.bisect_right(edges, v) - 1))] += 1
    return tuple(counts)


def _token_edges(values: Sequence[float]) -> tuple[float, ...]:
    """Bins of whole tokens, centred on them: one per value while they fit."""
    lo, hi = math.floor(min(values)), math.ceil(max(values))
    width = max(1, math.ceil((hi - lo + 1) / TRAFFIC_BINS))
    bins = math.ceil((hi - lo + 1) / width)
    return tuple(lo - 0.5 + i * width for i in range(bins + 1))


def _gap_edges(values: Sequence[float]) -> tuple[tuple[float, ...], bool]:
    """Bins (ms) of inter-arrival times, and whether they are logarithmic: when the
    spread is wide and no gap is zero (simultaneous arrivals have no place on a log
    axis)."""
    lo, hi = min(values), max(values)
    if lo > 0 and hi / lo > WIDE_SPREAD:
        ratio = (hi / lo) ** (1 / TRAFFIC_BINS)
        inner = [lo * ratio**i for i in range(1, TRAFFIC_BINS)]
        return (lo, *inner, hi), True
    if hi == lo:  # a constant rate: one bin around it
        half = lo / 2 or 0.5
        return (lo - half, hi + half), False
    step = (hi - lo) / TRAFFIC_BINS
    return (lo, *(lo + i * step for i in range(1, TRAFFIC_BINS)), hi), False


def _short(output: Sequence[float], asked: Sequence[float]) -> str:
    """How many replies stopped before the ``max_tokens`` they asked for, where the two
    can be paired: one asked value per reply, or one cap for all."""
    if len(asked) == len(output):
        short = sum(o < a for o, a in zip(output, asked, strict=True))
    elif len(set(asked)) == 1:
        short = sum(o < asked[0] for o in output)
    else:
        return ""
    return f", {short} short of max_tokens"


def traffic(cell: Cell, decl: TrafficPlot) -> Traffic | None:
    """The histograms of ``cell``'s traffic figure (None: it has none of the samples)."""
    notes: list[str] = []
    panels = []
    sent = _finite(cell, decl.input_tokens, notes, "not recorded")
    if sent is not None:
        edges = _token_edges(sent)
        panels.append(
            Panel(
                decl.input_tokens,
                f"input tokens, {len(sent)} requests",
                "tokens",
                edges,
                (Bars("input", _count(sent, edges)),),
            )
        )
    got = _finite(cell, decl.output_tokens, notes, "not recorded")
    asked = _finite(cell, decl.asked_tokens, notes, "not recorded")
    if got is not None or asked is not None:
        edges = _token_edges([*(got or ()), *(asked or ())])
        bars = tuple(
            Bars(label, _count(values, edges))
            for label, values in (("output", got), ("asked (max_tokens)", asked))
            if values is not None
        )
        title = f"output tokens, {len(got)} replies" if got is not None else "asked tokens"
        if got is not None and asked is not None:
            title += _short(got, asked)
        panels.append(Panel(decl.output_tokens, title, "tokens", edges, bars))
    gaps = _finite(cell, decl.interarrival, notes, "a closed loop schedules no arrivals")
    if gaps is not None:
        edges, log_x = _gap_edges([g * 1e3 for g in gaps])
        counts = _count([g * 1e3 for g in gaps], edges)
        panels.append(
            Panel(
                decl.interarrival,
                f"between arrivals, {len(gaps)} gaps",
                "ms, log" if log_x else "ms",
                edges,
                (Bars("scheduled", counts),),
                log_x,
            )
        )
    if not panels:
        return None
    label = cell.label
    name = "-".join(
        part for part in f"traffic-{slug(cell.record.workload)}-{slug(label)}".split("-") if part
    )
    if len(name) > 120:  # a file name, not a sentence: long parameter lists are hashed
        name = f"{name[:100]}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"
    title = f"{cell.record.workload}: {label}: traffic carried"
    return Traffic(name, title, tuple(panels), tuple(notes))


def draw_traffic(fig: Figure, figure: Traffic) -> None:
    fig.set_size_inches(max(7.5, 3.4 * len(figure.panels)), 3.6)
    for index, panel in enumerate(figure.panels, start=1):
        ax = fig.add_subplot(1, len(figure.panels), index)
        for i, bars in enumerate(panel.bars):
            if i == 0:
                ax.stairs(bars.counts, panel.edges, fill=True, alpha=0.6, label=bars.label)
            else:
                ax.stairs(bars.counts, panel.edges, lw=1.4, label=bars.label)
        ax.set(xlabel=panel.xlabel, ylabel="requests", xscale="log" if panel.log_x else "linear")
        ax.set_title(panel.title, fontsize=8)
        if len(panel.bars) > 1:
            legend(ax)


def traffic_plots(cells: Sequence[Cell]) -> list[Plot]:
    """Histograms of the tokens each cell's requests sent and received (the tokens
    asked for beside them) and of the time between their scheduled arrivals: a figure
    per cell declaring a ``TrafficPlot`` whose record holds any of its samples."""
    plots = []
    names: set[str] = set()
    for cell in cells:
        for decl in cell.declared(TrafficPlot):
            figure = traffic(cell, decl)
            if figure is None:
                continue
            name, again = figure.name, 1
            while name in names:  # the same cell from two runs, or two declarations
                again += 1
                name = f"{figure.name}-{again}"
            names.add(name)
            caption = (
                "Requests per bin: tokens sent, tokens received (the max_tokens each "
                "request asked for outlined over them: replies left of it ended on their "
                "own), and the time between consecutive scheduled arrivals."
            )
            if figure.notes:
                caption += " Not drawn: " + "; ".join(figure.notes) + "."

            def draw(fig: Figure, figure: Traffic = figure) -> None:
                draw_traffic(fig, figure)

            plots.append(make_plot(name, "Traffic carried", figure.title, caption, draw))
    return plots
