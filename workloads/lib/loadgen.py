"""The harness's internals the built-in workload tests drive, handed on from one place.

A test module in ``workloads/`` imports the harness only through ``harness.api``
(tests/test_layout.py); what the built-in workloads use beyond it (the serving loop and
its batching policies, arrival schedules and shaped load, capacity search and sweeps,
multi-turn sessions, the pooling driver, SLO parsing) it imports from here. These are
the harness's own modules: they are no public API, and may change with it.
"""

from __future__ import annotations

from harness.load.arrivals import Arrivals, RateShape, Schedule, ShapedLoad
from harness.load.capacity import KneeRule, SearchPolicy, capacity_search, sweep
from harness.load.clock import gc_paused
from harness.load.pooldriver import PoolDriver, PoolTrace, summarize_pooling
from harness.load.saturation import EarlyStopRule
from harness.load.serve_summary import summarize_trace
from harness.load.serving import (
    BatchPolicy,
    DynamicBatching,
    NoBatching,
    StaticBatching,
    serve_open_loop,
)
from harness.load.sessions import Session, Turn, active_sessions, run_sessions
from harness.load.sessions import durations as session_durations
from harness.metrics.slo import SLO, parse_slos, slos_on
from harness.session.traffic import SessionSpec

__all__ = [
    "SLO",
    "Arrivals",
    "BatchPolicy",
    "DynamicBatching",
    "EarlyStopRule",
    "KneeRule",
    "NoBatching",
    "PoolDriver",
    "PoolTrace",
    "RateShape",
    "Schedule",
    "SearchPolicy",
    "Session",
    "SessionSpec",
    "ShapedLoad",
    "StaticBatching",
    "Turn",
    "active_sessions",
    "capacity_search",
    "gc_paused",
    "parse_slos",
    "run_sessions",
    "serve_open_loop",
    "session_durations",
    "slos_on",
    "summarize_pooling",
    "summarize_trace",
    "sweep",
]
