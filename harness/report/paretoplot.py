"""The Pareto plot of each decision (harness.report.decision): rate against p99 latency,
a panel per latency (TTFT and E2E for generative cells, E2E for tensor ones), every
configuration a labeled point, the Pareto front a step line, the recommendation a star.

Drawn like every other plot (harness.report.plots): matplotlib to SVG for the page and
SVG and PNG files for documents, the same decision giving the same bytes. The front's
line and the recommended point carry SVG ids (``<plot>-front-<metric>``,
``<plot>-recommended-<metric>``), so a reader of the file can find them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.figure import Figure

from harness.report import pareto
from harness.report.decision import Decision, Plane, Question
from harness.report.plots import Plot, legend, make_plot

SECTION = "Decision"
LOG_SPREAD = 20.0
"""Latencies spanning more than this factor are drawn on a log axis."""
FRONT_COLOR, OTHER_COLOR, PICK_COLOR = "tab:blue", "0.55", "crimson"
LABEL_SIZE = 6.5
"""Font size of a point's label (points); a character is about ``CHAR_WIDTH`` wide."""
CHAR_WIDTH, LINE_HEIGHT = 3.7, 9.0
SLOTS: tuple[tuple[float, float], ...] = (
    (7, 7), (7, -7), (-7, 7), (-7, -7), (7, 19), (-7, 19), (7, -19), (-7, -19),
    (7, 31), (-7, 31), (7, -31), (-7, -31),
)  # fmt: skip
"""Where a label may go from its point (points right and up), nearest first; a label
right of its point starts there, one left of it ends there."""
SLO_REACH = 3.0
"""An SLO line is drawn when it is within this factor of the slowest point's latency."""
MARKER = 5.0
"""Half the side of the square a point's marker covers (points)."""
Box = tuple[float, float, float, float]
"""x0, y0, x1, y1 in points from the axes' lower left corner."""


def pareto_plots(decision: Decision, shown: Callable[[str], str] = str) -> list[Plot]:
    """One plot per question with a front, in the decision's order; ``shown`` rewrites
    the text drawn (titles and labels may name a path: harness.report.publicpaths)."""
    return [_plot(q, q.plot, shown) for q in decision.questions if q.plot is not None]


def _plot(q: Question, name: str, shown: Callable[[str], str]) -> Plot:
    def draw(fig: Figure) -> None:
        fig.set_size_inches(6.0 * len(q.planes) + 1.5, 4.6)
        for i, plane in enumerate(q.planes, start=1):
            _panel(fig.add_subplot(1, len(q.planes), i), plane, name, shown)

    rate = q.planes[0].rate.split(" (")[0]
    off = f" Not on the plot: {'; '.join(q.off_plot)}." if q.off_plot else ""
    caption = (
        f"Each point is one configuration: its {rate} against its p99 latency. The step"
        " line is the Pareto front (no other configuration has at least its rate and at"
        " most its latency, one of them strictly better); filled points are on it, grey"
        " ones are beaten; the star is the recommendation, the dashed line the SLO." + off
    )
    title = shown(f"{q.title}: {rate} vs p99 latency")
    return make_plot(name, SECTION, title, caption, draw)


def _panel(ax: Any, plane: Plane, name: str, shown: Callable[[str], str]) -> None:
    pts = plane.points
    xs, ys = [p.latency_s * 1e3 for p in pts], [p.rate for p in pts]
    _points(ax, plane, xs, ys, name)
    limit = _slo_line(ax, plane, max(xs))
    x_axis = _Axis.around([*xs, *limit], pad=0.12)
    y_axis = _Axis.around(ys, pad=0.18, log=False)
    if x_axis.log:
        ax.set_xscale("log")
    ax.set_xlim(x_axis.low, x_axis.high)
    ax.set_ylim(y_axis.low, y_axis.high)
    ax.set(xlabel=f"{plane.title} (ms)", ylabel=plane.rate, title=plane.title)
    _labels(ax, plane, x_axis, y_axis, shown)
    legend(ax)


def _slo_line(ax: Any, plane: Plane, slowest_ms: float) -> list[float]:
    """The SLO as a dashed line where it is near the points (then the axis must reach
    it), else a note that it lies beyond them: a far line would squeeze every point
    into a corner."""
    if plane.threshold_s is None:
        return []
    limit = plane.threshold_s * 1e3
    if limit <= SLO_REACH * slowest_ms:
        ax.axvline(limit, ls="--", color=PICK_COLOR, lw=1, label="SLO")
        return [limit]
    ax.annotate(
        f"SLO {limit:g} ms: beyond the right edge",
        (0.99, 0.02),
        xycoords="axes fraction",
        ha="right",
        fontsize=LABEL_SIZE,
        color=PICK_COLOR,
    )
    return []


def _points(ax: Any, plane: Plane, xs: list[float], ys: list[float], name: str) -> None:
    """The configurations (filled on the front, hollow beaten), the front as a step line
    and the recommendation as a star."""
    pts = plane.points
    beaten = [i for i, p in enumerate(pts) if not p.optimal]
    best = [i for i, p in enumerate(pts) if p.optimal]
    ax.scatter(
        [xs[i] for i in beaten],
        [ys[i] for i in beaten],
        s=28,
        facecolors="none",
        edgecolors=OTHER_COLOR,
        label="beaten",
        zorder=3,
    )
    ax.scatter(
        [xs[i] for i in best],
        [ys[i] for i in best],
        s=32,
        color=FRONT_COLOR,
        label="Pareto-optimal",
        zorder=4,
    )
    steps = pareto.staircase([plane.point(p) for p in pts])
    (line,) = ax.plot(
        [x * 1e3 for x, _ in steps],
        [y for _, y in steps],
        color=FRONT_COLOR,
        lw=1.4,
        label="Pareto front",
        zorder=2,
    )
    line.set_gid(f"{name}-front-{plane.metric}")
    picked = [i for i, p in enumerate(pts) if p.recommended]
    if picked:
        star = ax.scatter(
            [xs[picked[0]]],
            [ys[picked[0]]],
            marker="*",
            s=260,
            facecolors="none",
            edgecolors=PICK_COLOR,
            linewidths=1.5,
            label="recommended",
            zorder=5,
        )
        star.set_gid(f"{name}-recommended-{plane.metric}")


@dataclass(frozen=True)
class _Axis:
    """An axis's range, fixed before the labels are placed so their room is known."""

    low: float
    high: float
    log: bool

    @staticmethod
    def around(values: Sequence[float], pad: float, log: bool | None = None) -> _Axis:
        """The values' range and ``pad`` of it either side; log when they span more than
        ``LOG_SPREAD`` (unless ``log`` says)."""
        low, high = min(values), max(values)
        if log is None:
            log = low > 0 and high / low > LOG_SPREAD
        if log:
            span = math.log10(high / low)
            return _Axis(low / 10 ** (pad * span), high * 10 ** (pad * span), True)
        span = high - low or max(abs(high), 1.0)
        return _Axis(low - pad * span, high + pad * span, False)

    def fraction(self, value: float) -> float:
        """Where ``value`` lies along the axis, 0 at its low end and 1 at its high one."""
        if self.log:
            return math.log(value / self.low) / math.log(self.high / self.low)
        return (value - self.low) / (self.high - self.low)


def _labels(
    ax: Any, plane: Plane, x_axis: _Axis, y_axis: _Axis, shown: Callable[[str], str]
) -> None:
    """Each point's engine and configuration beside it, joined by a thin line, where it
    covers no other label and no marker (the recommendation's label placed first)."""
    box = ax.get_position()
    fig = ax.get_figure()
    width, height = box.width * fig.get_figwidth() * 72, box.height * fig.get_figheight() * 72
    at = [
        (x_axis.fraction(p.latency_s * 1e3) * width, y_axis.fraction(p.rate) * height)
        for p in plane.points
    ]
    order = sorted(range(len(at)), key=lambda i: not plane.points[i].recommended)
    taken = [(x - MARKER, y - MARKER, x + MARKER, y + MARKER) for x, y in at]
    for i in order:
        label = shown(plane.points[i].label)
        dx, dy, placed = _slot(at[i], len(label) * CHAR_WIDTH, taken, (width, height))
        taken.append(placed)
        ax.annotate(
            label,
            (plane.points[i].latency_s * 1e3, plane.points[i].rate),
            textcoords="offset points",
            xytext=(dx, dy),
            ha="left" if dx > 0 else "right",
            va="center",
            fontsize=LABEL_SIZE,
            zorder=2.5,
            arrowprops={"arrowstyle": "-", "color": OTHER_COLOR, "lw": 0.5},
        )


def _slot(
    at: tuple[float, float], width: float, taken: Sequence[Box], room: tuple[float, float]
) -> tuple[float, float, Box]:
    """The first of ``SLOTS`` where a label ``width`` wide covers the least of what is
    ``taken`` and stays inside the axes: (dx, dy) and the box it covers."""
    x, y = at
    options = []
    for dx, dy in SLOTS:
        x0 = x + dx if dx > 0 else x + dx - width
        box = (x0, y + dy - LINE_HEIGHT / 2, x0 + width, y + dy + LINE_HEIGHT / 2)
        options.append((sum(_overlap(box, o) for o in taken) + _outside(box, room), dx, dy, box))
    _, dx, dy, box = min(options, key=lambda o: o[0])  # the nearest of the least covering
    return dx, dy, box


def _overlap(a: Box, b: Box) -> float:
    wide = min(a[2], b[2]) - max(a[0], b[0])
    tall = min(a[3], b[3]) - max(a[1], b[1])
    return max(wide, 0.0) * max(tall, 0.0)


def _outside(box: Box, room: tuple[float, float]) -> float:
    """The area of ``box`` outside the axes (0, 0)-(room)."""
    area = (box[2] - box[0]) * (box[3] - box[1])
    return area - _overlap(box, (0.0, 0.0, *room))
