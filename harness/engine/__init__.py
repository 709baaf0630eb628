"""The engine contract and what stands on it: the contract every adapter in ``engines/``
implements (``contract``, re-exported here: ``from harness.engine import TensorEngine``),
the registry that finds adapters through the ``harness.engines`` entry-point group, and
the conformance suite a third-party adapter runs (``harness.engine.conformance``).

Knows nothing of any engine, load, result or report: everything else imports it.
"""

from harness.engine.contract import (
    DEVICE_STAGES,
    PRECISIONS,
    Arrays,
    Availability,
    BatchingMode,
    Capabilities,
    Chunk,
    DeclaresPrecisions,
    Engine,
    EngineConfig,
    EngineFactory,
    ExposesCounters,
    Family,
    GenerationRequest,
    GenerativeEngine,
    JSONValue,
    ReportsDeviceTimes,
    TensorEngine,
    TensorSpec,
    check_inputs,
    counter_delta,
    device_spans,
    installed_version,
    is_fatal,
    reject_unknown_options,
)
from harness.exceptions import EngineError, EngineUnavailable, RequestError

__all__ = [
    "DEVICE_STAGES",
    "PRECISIONS",
    "Arrays",
    "Availability",
    "BatchingMode",
    "Capabilities",
    "Chunk",
    "DeclaresPrecisions",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineFactory",
    "EngineUnavailable",
    "ExposesCounters",
    "Family",
    "GenerationRequest",
    "GenerativeEngine",
    "JSONValue",
    "ReportsDeviceTimes",
    "RequestError",
    "TensorEngine",
    "TensorSpec",
    "check_inputs",
    "counter_delta",
    "device_spans",
    "installed_version",
    "is_fatal",
    "reject_unknown_options",
]
