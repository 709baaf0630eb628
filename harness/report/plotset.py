"""Every figure of a report, in the order the page shows them: load curves, the declared
latency CDFs, the traffic carried, the server's view over time beside the client's, the
figures under other tools' definitions, histograms, stage stacks, telemetry."""

from __future__ import annotations

from harness.report import peersplot, plots, serverplot, trafficplot
from harness.report.plots import Plot
from harness.report.runset import RunSet


def all_plots(runs: RunSet) -> list[Plot]:
    cells = plots.ok_cells(runs)
    return [
        *plots.latency_throughput(cells),
        *plots.declared_cdfs(cells),
        *trafficplot.traffic_plots(cells),
        *serverplot.server_plots(cells),
        *peersplot.peer_tables(cells),
        *plots.histograms(cells),
        *plots.stages(cells),
        *plots.telemetry(cells),
    ]
