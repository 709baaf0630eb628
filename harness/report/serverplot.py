"""The server's view of a cell beside the client's, on one time axis: each request's TTFT
and E2E (as the client measured them, from the scheduled time) at its scheduled time,
above the server's own requests running and waiting and its KV-cache usage, as scraped
from its Prometheus metrics while the cell ran (``metrics.server``,
harness.metrics.servermetrics). A figure per ok cell that carries the series."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.figure import Figure

from harness.report.plots import Cell, Plot, legend, make_plot, slug

SECTION = "Server over time"
LOG_SPREAD = 50.0
"""Largest over smallest client latency beyond which the latency axis is logarithmic."""


@dataclass(frozen=True)
class Points:
    """One client latency per successful request, at its scheduled time (seconds)."""

    label: str
    t: tuple[float, ...]
    ms: tuple[float, ...]


@dataclass(frozen=True)
class ServerOverTime:
    """What a cell's figure draws; ``notes``: what it could not."""

    name: str
    title: str
    client: tuple[Points, ...]
    t: tuple[float, ...]
    gauges: Mapping[str, tuple[float | None, ...]]
    notes: tuple[str, ...]
    gap: str


GAUGE_LABELS = {
    "requests_running": "running",
    "requests_waiting": "waiting",
}


def _numbers(values: Sequence[Any]) -> tuple[float | None, ...]:
    return tuple(None if v is None else float(v) for v in values)


def _client(cell: Cell, scheduled: Sequence[Any], notes: list[str]) -> tuple[Points, ...]:
    t = tuple(float(x) for x in scheduled)
    out = []
    for key in ("ttft", "e2e"):
        values = cell.record.samples.get(key)
        if values is None or len(values) != len(t):
            notes.append(f"client {key}: no samples in the order of metrics.server.scheduled")
            continue
        out.append(Points(key.upper(), t, tuple(float(v) * 1e3 for v in values)))
    return tuple(out)


def _gap(server: Mapping[str, Any]) -> str:
    """The client's mean minus the server's, as the caption says it."""
    found = server.get("client_vs_server")
    gaps = found.get("gap", {}) if isinstance(found, dict) else {}
    parts = [
        f"{what.upper()} {float(gaps[f'{what}_s']) * 1e3:+.1f} ms"
        for what in ("ttft", "e2e")
        if f"{what}_s" in gaps
    ]
    return "Client mean minus the server's own: " + ", ".join(parts) + "." if parts else ""


def _name(cell: Cell) -> str:
    name = "-".join(
        p for p in f"server-{slug(cell.record.workload)}-{slug(cell.label)}".split("-") if p
    )
    if len(name) > 120:  # a file name, not a sentence: long parameter lists are hashed
        name = f"{name[:100]}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"
    return name


def server_over_time(cell: Cell) -> ServerOverTime | None:
    """The figure of ``cell`` (None: its record carries no server series with a gauge)."""
    server = cell.record.metric("server")
    series = server.get("series") if isinstance(server, dict) else None
    if not isinstance(series, dict) or not series.get("t"):
        return None
    gauges = {k: _numbers(series[k]) for k in (*GAUGE_LABELS, "kv_cache_usage") if k in series}
    if not gauges:
        return None
    notes: list[str] = []
    client = _client(cell, server.get("scheduled") or (), notes)
    title = f"{cell.record.workload}: {cell.label}: client and server over time"
    t = tuple(float(x) for x in series["t"])
    return ServerOverTime(_name(cell), title, client, t, gauges, tuple(notes), _gap(server))


def _segments(t: Sequence[float], values: Sequence[float | None]) -> tuple[list[float], ...]:
    """The points with a value (a failed or partial scrape leaves a hole)."""
    pairs = [(x, v) for x, v in zip(t, values, strict=False) if v is not None]
    return [x for x, _ in pairs], [v for _, v in pairs]


def draw_server(fig: Figure, figure: ServerOverTime) -> None:
    fig.set_size_inches(7.5, 5.6)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for points in figure.client:
        top.plot(points.t, points.ms, ls="", marker=".", ms=3, alpha=0.7, label=points.label)
    values = [v for p in figure.client for v in p.ms if v > 0 and math.isfinite(v)]
    wide = bool(values) and max(values) / min(values) > LOG_SPREAD
    top.set(ylabel="client latency (ms, log)" if wide else "client latency (ms)")
    top.set_yscale("log" if wide else "linear")
    legend(top)
    for key, label in GAUGE_LABELS.items():
        if key in figure.gauges:
            xs, ys = _segments(figure.t, figure.gauges[key])
            bottom.step(xs, ys, where="post", lw=1.2, label=f"server: {label}")
    bottom.set(xlabel="seconds from the first scheduled request", ylabel="requests")
    if "kv_cache_usage" in figure.gauges:
        kv = bottom.twinx()
        xs, ys = _segments(figure.t, figure.gauges["kv_cache_usage"])
        kv.plot(xs, [y * 100 for y in ys], color="tab:red", lw=1, label="KV cache used")
        kv.set_ylabel("KV cache used (%, red)")
        kv.set_ylim(0, max(100.0, *(y * 100 for y in ys)) if ys else 100.0)
        kv.grid(False)
    legend(bottom)


def _peak(figure: ServerOverTime) -> str:
    used = [v for v in figure.gauges.get("kv_cache_usage", ()) if v is not None]
    return f" (at most {max(used) * 100:.3g} %)" if used else ""


def server_plots(cells: Sequence[Cell]) -> list[Plot]:
    """A figure per ok cell whose record carries the server's series over time."""
    plots = []
    names: set[str] = set()
    for cell in cells:
        figure = server_over_time(cell)
        if figure is None:
            continue
        name, again = figure.name, 1
        while name in names:  # the same cell from two runs
            again += 1
            name = f"{figure.name}-{again}"
        names.add(name)
        caption = (
            "Above: each request's TTFT and E2E as the client measured them (from its "
            "scheduled time), at its scheduled time. Below, on the same axis: the requests "
            "the server ran and queued and how full its KV cache was"
            f"{_peak(figure)}, from its own metrics scraped while the cell ran. {figure.gap}"
        ).strip()
        if figure.notes:
            caption += " Not drawn: " + "; ".join(figure.notes) + "."

        def draw(fig: Figure, figure: ServerOverTime = figure) -> None:
            draw_server(fig, figure)

        plots.append(make_plot(name, SECTION, figure.title, caption, draw))
    return plots
