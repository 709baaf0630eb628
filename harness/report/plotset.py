"""Every figure of a report, in the order the page shows them: load curves, the declared
latency CDFs, the traffic carried, histograms, stage stacks, telemetry."""

from __future__ import annotations

from harness.report import plots, trafficplot
from harness.report.plots import Plot
from harness.report.runset import RunSet


def all_plots(runs: RunSet) -> list[Plot]:
    cells = plots.ok_cells(runs)
    return [
        *plots.latency_throughput(cells),
        *plots.declared_cdfs(cells),
        *trafficplot.traffic_plots(cells),
        *plots.histograms(cells),
        *plots.stages(cells),
        *plots.telemetry(cells),
    ]
