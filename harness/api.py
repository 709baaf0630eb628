"""What a workload imports: the one documented entry point to the harness.

A workload (a pytest test in ``workloads/``) asks the ``cell`` fixture for its identity
and parameters, opens its engine through ``open_engine``, drives load, summarizes what it
measured and hands the metrics to ``Cell.finish``. Everything it needs for that is here;
the modules behind these names are the harness's own business and may move.

* the engine contract: ``TensorEngine``, ``GenerativeEngine``, ``TensorSpec``,
  ``GenerationRequest``, ``EngineConfig``, ``EngineError``, ``Family``, ``registry``;
* the session: ``Cell``, ``RunSettings`` (with the ``ModelSet`` of the embedded models),
  ``settings_of``, ``OpenEngine``, ``merge_options``, ``cache_root``, and ``announce``
  (a line for the user's terminal from wherever the cell runs);
* load: clocks, arrival schedules, the serving loop and batching policies, the streaming
  driver, capacity search and sweeps (with their over-saturation early stop), client
  processes (local and on Ray), a request mix over LoRA adapters (``adapters``);
* pooling (embeddings, scores, reranking): the contract's ``PoolingRequest`` and
  ``PoolingResult``, the ``PoolDriver`` and ``summarize_pooling``;
* summaries and statistics: ``summarize_trace``, ``summarize_stream``, ``stats``,
  ``Evidence`` / ``judge``, ``SlowLog``, ``Telemetry``, and a
  server's own metrics over a cell (``servermetrics``, for an ``ExposesMetricsText``
  engine);
* SLOs: ``SLO`` / ``parse_slos``, ``slos_on`` (those on the latencies a cell measures),
  ``slo_verdicts`` (a cell's ``metrics.slo``), and the latencies the harness's summaries
  hold requests to (``SERVED_LATENCIES``, ``STREAM_LATENCIES``);
* what a cell reports: ``Headline``, and what the reports need to know of the workload:
  ``ReportSpec`` (declared with ``@pytest.mark.report_spec(ReportSpec(...))``) with its
  parts ``Rate``, ``Latency``, ``Paired``, ``LoadSearch`` and the plot kinds (``CdfPlot``,
  ``HistogramPlot``, ``StagesPlot``, ``PolicyCurvePlot``, ``LoadCurvePlot``).
"""

from __future__ import annotations

from harness.dist.rayclients import RayActors
from harness.engine import (
    EngineConfig,
    EngineError,
    ExposesCounters,
    ExposesMetricsText,
    Family,
    GenerationRequest,
    GenerativeEngine,
    ImageInput,
    Message,
    PoolingEngine,
    PoolingRequest,
    PoolingResult,
    RequestKind,
    TensorEngine,
    TensorSpec,
    counter_delta,
    device_spans,
    registry,
)
from harness.exceptions import UsageError
from harness.load import adapters, noopserver
from harness.load.arrivals import Arrivals, OpenLoop, RateShape, Schedule, ShapedLoad
from harness.load.capacity import (
    CapacityResult,
    KneeRule,
    Point,
    SearchPolicy,
    Stop,
    SweepResult,
    capacity_search,
    sweep,
)
from harness.load.clients import (
    ClosedShare,
    Deadlines,
    Launcher,
    OpenShare,
    Share,
    SharedLoad,
    is_network_client,
    run_shared,
)
from harness.load.clock import Clock, MonotonicClock, gc_paused
from harness.load.localclients import LocalProcesses
from harness.load.pooldriver import POOLED_LATENCIES, PoolDriver, PoolTrace, summarize_pooling
from harness.load.saturation import EarlyStop, EarlyStopRule, Watch
from harness.load.serve_summary import SERVED_LATENCIES, summarize_trace
from harness.load.serving import (
    BatchPolicy,
    DynamicBatching,
    NoBatching,
    StaticBatching,
    serve_open_loop,
)
from harness.load.sessions import Session, Turn, active_sessions, run_sessions
from harness.load.sessions import durations as session_durations
from harness.load.stream_summary import summarize_stream
from harness.load.streamdriver import Driver
from harness.load.streamstop import NO_EARLY_STOP_CLIENTS, open_loop_watched, with_early_stop
from harness.metrics import servermetrics, stats
from harness.metrics.slo import SLO, parse_slos, slo_verdicts, slos_on
from harness.metrics.slowlog import SlowLog
from harness.metrics.streamtiming import STREAM_LATENCIES, RequestRecord
from harness.metrics.telemetry import Telemetry
from harness.metrics.validity import DRIFTED, Evidence, Policy, Verdict, judge
from harness.plugin import OpenEngine, settings_of
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
from harness.session.config import (
    AUTO_CLIENTS,
    IMAGE_SUFFIXES,
    ModelSet,
    ProfileName,
    RunSettings,
    cache_root,
)
from harness.session.execution import ClientsOn
from harness.session.opening import merge_options
from harness.session.traffic import SessionSpec

__all__ = [
    "AUTO_CLIENTS",
    "DRIFTED",
    "IMAGE_SUFFIXES",
    "NO_EARLY_STOP_CLIENTS",
    "POOLED_LATENCIES",
    "SERVED_LATENCIES",
    "SLO",
    "STREAM_LATENCIES",
    "Arrivals",
    "BatchPolicy",
    "CapacityResult",
    "CdfPlot",
    "Cell",
    "ClientsOn",
    "Clock",
    "ClosedShare",
    "Deadlines",
    "Driver",
    "DynamicBatching",
    "EarlyStop",
    "EarlyStopRule",
    "EngineConfig",
    "EngineError",
    "Evidence",
    "ExposesCounters",
    "ExposesMetricsText",
    "Family",
    "GenerationRequest",
    "GenerativeEngine",
    "Headline",
    "HistogramPlot",
    "ImageInput",
    "KneeRule",
    "Latency",
    "Launcher",
    "LoadCurvePlot",
    "LoadSearch",
    "LocalProcesses",
    "Message",
    "ModelSet",
    "MonotonicClock",
    "NoBatching",
    "OpenEngine",
    "OpenLoop",
    "OpenShare",
    "Paired",
    "Point",
    "Policy",
    "PolicyCurvePlot",
    "PoolDriver",
    "PoolTrace",
    "PoolingEngine",
    "PoolingRequest",
    "PoolingResult",
    "ProfileName",
    "Rate",
    "RateShape",
    "RayActors",
    "ReportSpec",
    "RequestKind",
    "RequestRecord",
    "RunSettings",
    "Schedule",
    "SearchPolicy",
    "Session",
    "SessionSpec",
    "ShapedLoad",
    "Share",
    "SharedLoad",
    "SlowLog",
    "StagesPlot",
    "StaticBatching",
    "Stop",
    "SweepResult",
    "Telemetry",
    "TensorEngine",
    "TensorSpec",
    "TrafficPlot",
    "Turn",
    "UsageError",
    "Verdict",
    "Watch",
    "active_sessions",
    "adapters",
    "announce",
    "cache_root",
    "capacity_search",
    "counter_delta",
    "device_spans",
    "gc_paused",
    "is_network_client",
    "judge",
    "merge_options",
    "noopserver",
    "open_loop_watched",
    "parse_slos",
    "registry",
    "run_sessions",
    "run_shared",
    "serve_open_loop",
    "servermetrics",
    "session_durations",
    "settings_of",
    "slo_verdicts",
    "slos_on",
    "stats",
    "summarize_pooling",
    "summarize_stream",
    "summarize_trace",
    "sweep",
    "with_early_stop",
]
