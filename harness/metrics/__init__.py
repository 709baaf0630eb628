"""Measurement math, engine-neutral: latency statistics (``stats``), the timing of streamed
generation and its SLOs (``streamtiming``), the validity verdict (``validity``), the
slow-request log (``slowlog``), resource telemetry (``telemetry``), a cell's GPU energy
from its power series (``energy``) and the grouping of failed requests (``failures``).
Imports nothing of the harness but the engine contract.
"""
