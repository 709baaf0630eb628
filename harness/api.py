"""The harness's public API: what a workload author and an engine author import.

A workload (a pytest test taking the ``cell`` fixture) opens its engine through
``open_engine``, measures, summarizes, and hands its metrics to ``Cell.finish`` with the
``Headline`` figures and the ``Evidence`` the cell is judged on; ``ReportSpec`` declares
beside it what the reports need. An engine adapter implements the engine contract.
docs/api.md says what each name is for; everything else in ``harness`` is the harness's
own and may move (the built-in workloads' library, ``workloads.lib``, may use it).
"""

from __future__ import annotations

from harness.engine import (
    Arrays,
    Availability,
    Capabilities,
    Chunk,
    EngineConfig,
    EngineError,
    EngineUnavailable,
    Family,
    GenerationRequest,
    GenerativeEngine,
    ImageInput,
    Message,
    PoolingEngine,
    PoolingRequest,
    PoolingResult,
    RequestError,
    TensorEngine,
    TensorSpec,
    registry,
)
from harness.engine.synthetic import synthetic_inputs
from harness.exceptions import UsageError
from harness.load.arrivals import OpenLoop
from harness.load.clock import MonotonicClock
from harness.load.livecounters import counting
from harness.load.stream_summary import summarize_stream
from harness.load.streamdriver import Driver
from harness.metrics import stats
from harness.metrics.slo import slo_verdicts
from harness.metrics.streamtiming import RequestRecord
from harness.metrics.validity import Evidence
from harness.results.records import Headline
from harness.results.reportspec import (
    CdfPlot,
    HistogramPlot,
    Latency,
    LoadCurvePlot,
    LoadSearch,
    Paired,
    PolicyCurvePlot,
    Rate,
    ReportSpec,
    StagesPlot,
    TrafficPlot,
)
from harness.session.announce import announce
from harness.session.cell import Cell
from harness.session.config import ProfileName, RunSettings, cache_root
from harness.session.fixtures import OpenEngine
from harness.session.stash import settings_of

# the cell, its settings and its finish
__all__ = [
    "Cell",
    "Evidence",
    "Headline",
    "OpenEngine",
    "ProfileName",
    "RunSettings",
    "UsageError",
    "announce",
    "cache_root",
    "settings_of",
]

# what the reports need to know of the workload
__all__ += [
    "CdfPlot",
    "HistogramPlot",
    "Latency",
    "LoadCurvePlot",
    "LoadSearch",
    "Paired",
    "PolicyCurvePlot",
    "Rate",
    "ReportSpec",
    "StagesPlot",
    "TrafficPlot",
]

# the engine contract
__all__ += [
    "Availability",
    "Capabilities",
    "EngineConfig",
    "EngineError",
    "EngineUnavailable",
    "Family",
    "GenerativeEngine",
    "PoolingEngine",
    "RequestError",
    "TensorEngine",
    "registry",
]

# requests, results and records
__all__ += [
    "Arrays",
    "Chunk",
    "GenerationRequest",
    "ImageInput",
    "Message",
    "PoolingRequest",
    "PoolingResult",
    "RequestRecord",
    "TensorSpec",
    "synthetic_inputs",
]

# measuring: streamed load, live progress, summaries, statistics and SLO verdicts
__all__ += [
    "Driver",
    "MonotonicClock",
    "OpenLoop",
    "counting",
    "slo_verdicts",
    "stats",
    "summarize_stream",
]
