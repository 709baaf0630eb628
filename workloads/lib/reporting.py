"""Pieces of the workloads' report declarations (harness.results.reportspec) that several
workloads share: the metrics harness.load's summaries write (serve_summary for tensor
requests, stream_summary for generative streams), and the plots of their samples.

Each workload declares its own ``ReportSpec`` beside its test function, with
``@pytest.mark.report_spec(...)`` (docs/writing-a-workload.md).
"""

from __future__ import annotations

from harness.api import CdfPlot, Latency, LoadCurvePlot, LoadSearch, Rate, TrafficPlot
from harness.load.serve_summary import SERVED_LATENCIES
from harness.metrics.streamtiming import STREAM_LATENCIES

REQUESTS = Rate(
    metric="throughput.requests_per_s",
    unit="req/s",
    counts="requests",
    ci="throughput.requests_per_s_ci95",
    completed="requests.ok",
)
"""Completed requests per second of a served load, with its interval and count."""
IMAGES = Rate(metric="throughput.images_per_s", unit="img/s", counts="images")
TOKENS = "throughput.output_tokens_per_s"
LAG_P99 = "lag.p99"
"""The load generator's own timing error: compare calls no latency change below it."""

SERVED = tuple(Latency(name=name, samples=name) for name in SERVED_LATENCIES)
"""The latencies SLOs hold a served tensor request to (``summarize_trace``): ``e2e``, with a
sample per request."""
STREAMED = tuple(
    Latency(name=name, samples=None if name == "itl" else name) for name in STREAM_LATENCIES
)
"""The latencies SLOs hold a streamed request to (``summarize_stream``): ``ttft``, ``tpot``,
``e2e`` and ``itl``; each with its samples but ``itl`` (one sample per token, not per
request)."""

E2E_CDF = CdfPlot(samples="e2e", what="E2E latency")
TTFT_CDF = CdfPlot(samples="ttft", what="TTFT")

SWEEP = LoadSearch(points="sweep.points", settled="knee", full="at_knee")
CAPACITY = LoadSearch(
    points="search.points", settled="capacity", full="at_capacity", objective="objective"
)
LOAD_CURVE = LoadCurvePlot()


TRAFFIC = TrafficPlot()
"""Histograms of a generative cell's input, output and asked tokens and inter-arrival
times, from its samples ``input_tokens``, ``output_tokens``, ``asked_tokens`` and
``interarrival``."""
TRAFFIC_PLOTS: tuple[TrafficPlot, ...] = (TRAFFIC,)
"""The traffic a dataset or trace cell carried (filled in with the traffic plot)."""
