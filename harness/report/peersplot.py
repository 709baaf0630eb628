"""The numbers of a generative cell as other tools would report them: a table per cell of
TTFT, ITL, TPOT and E2E under the harness's, ``vllm bench serve``'s, AIPerf's and
GuideLLM's definitions (``metrics.peers``, harness.metrics.peers), with the differences
that explain the gaps in the caption, so a reader comparing this harness's figures with a
peer's sees where the difference comes from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from harness.report.plots import Cell, Plot, make_plot, slug

SECTION = "Numbers under other tools' definitions"
COLUMNS = (("ttft", "p50"), ("ttft", "p99"), ("itl", "p50"), ("tpot", "p50"), ("e2e", "p50"))


def _ms(value: object) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value * 1e3:.3g}"
    return "-"


def table(peers: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Row labels (the tools) and their cells (milliseconds; "-": the tool has no such
    metric, or no request gave one)."""
    tools = peers.get("tools", {})
    rows = []
    for tool in tools:
        metrics = tools[tool]
        rows.append(
            [
                _ms(metrics.get(m, {}).get(q)) if metrics.get(m, {}).get("defined", True) else "-"
                for m, q in COLUMNS
            ]
        )
    return list(tools), rows


def _draw(fig: Figure, labels: list[str], rows: list[list[str]]) -> None:
    fig.set_size_inches(7.5, 0.45 * (len(rows) + 1) + 0.4)
    ax = fig.add_subplot(1, 1, 1)
    ax.axis("off")
    header = [f"{m.upper()} {q} (ms)" for m, q in COLUMNS]
    grid = ax.table(cellText=rows, rowLabels=labels, colLabels=header, loc="center")
    grid.auto_set_font_size(False)
    grid.set_fontsize(8)


def peer_tables(cells: Sequence[Cell]) -> list[Plot]:
    out = []
    names: set[str] = set()
    for cell in cells:
        peers = cell.record.metrics.get("peers")
        if not isinstance(peers, dict) or not peers.get("tools"):
            continue
        labels, rows = table(peers)
        name = slug(f"peers-{cell.record.workload}-{cell.label}")[:120]
        while name in names:
            name += "-2"
        names.add(name)
        caption = "Where they differ: " + " ".join(str(d) for d in peers.get("differences", []))

        def draw(fig: Figure, labels: list[str] = labels, rows: list[list[str]] = rows) -> None:
            _draw(fig, labels, rows)

        title = f"{cell.record.workload}: {cell.label}: under other tools' definitions"
        out.append(make_plot(name, SECTION, title, caption, draw))
    return out
