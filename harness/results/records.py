"""Versioned, self-validating result records and the run manifest.

``SCHEMA_VERSION`` is an integer of its own, separate from the package version. A
reader refuses files written by a newer schema, migrates older ones, and treats a
corrupt file as an error naming the file, never as a warning.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from harness.exceptions import NewerSchemaError, RecordError
from harness.results import legacyspec
from harness.results.frozen import Frozen
from harness.results.redact import redact
from harness.results.reportspec import ReportSpec

SCHEMA_VERSION = 8

ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,199}$")
REPEAT_SEP = "@"  # not an id character, so ``<cell-id>@N`` parses one way only

ParamValue = str | int | float | bool | None


def format_param(value: ParamValue, none: str = "-") -> str:
    """A cell parameter as text, the same in cell ids and matrices (floats without noise)."""
    if value is None:
        return none
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class Status(enum.StrEnum):
    OK = "ok"
    INVALID = "invalid"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    SKIPPED = "skipped"


def slot(cell_id: str, repeat: int = 1) -> str:
    """Where one repeat of a cell is kept: the cell id for the first, ``<cell-id>@N`` after."""
    return cell_id if repeat == 1 else f"{cell_id}{REPEAT_SEP}{repeat}"


def check_id(value: str) -> str:
    """Run and cell ids become file names: keep them inside the results directory."""
    if not ID_PATTERN.fullmatch(value):
        raise ValueError(f"{value!r} is not a safe id ([A-Za-z0-9._=-], not starting with . or -)")
    return value


class Headline(Frozen):
    """One figure the matrix shows for a cell: ``metric`` is a dotted path into metrics."""

    label: str
    metric: str
    unit: str
    scale: float = 1.0
    ci: str | None = None
    """Dotted path to the figure's 95% confidence interval, a ``[low, high]`` pair."""


class ValidityInfo(Frozen):
    verdict: Literal["valid", "invalid"]
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


class CellRecord(Frozen):
    schema_version: int = SCHEMA_VERSION
    run_id: str
    cell_id: str
    workload: str
    engine: str
    params: dict[str, ParamValue]
    status: Status
    reasons: tuple[str, ...] = ()
    started_at: str
    finished_at: str
    duration_s: float
    engine_info: dict[str, Any] = Field(default_factory=dict)
    environment: dict[str, Any] = Field(default_factory=dict)
    seeds: dict[str, int] = Field(default_factory=dict)
    window: dict[str, float | int] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    samples: dict[str, list[float]] = Field(default_factory=dict)
    histograms: dict[str, dict[str, int]] = Field(default_factory=dict)
    headline: tuple[Headline, ...] = ()
    validity: ValidityInfo | None = None
    attempt: int = 1
    """1 for the run's first try at the cell; each ``--resume`` that reruns it adds one."""
    repeat: int = 1
    """Which of the run's ``--repeats`` measurements of the cell this is (1 without
    repeats); each repeat ran in a fresh worker process."""
    stderr_tail: tuple[str, ...] = ()
    """The last lines the engine's process wrote (crashed and timed-out cells), redacted."""
    telemetry: dict[str, Any] = Field(default_factory=dict)
    """Resource use sampled during the cell (harness.metrics.telemetry): series and summary."""
    slow_requests: tuple[dict[str, Any], ...] = ()
    """Requests slower than twice the cell's p99 or over an SLO, with their stage spans,
    generator lag and the telemetry sample around them (harness.metrics.slowlog)."""
    single_stream: str | None = None
    """The ``samples`` key holding one latency per request of a cell that kept one request
    in flight at a time (None: not such a cell). Those samples feed pytest-benchmark."""
    report_spec: ReportSpec | None = None
    """What the workload declared for the reports (harness.results.reportspec); None in
    records written before workloads declared it: ``reporting()`` infers it then."""

    _ids = field_validator("run_id", "cell_id")(check_id)

    @field_validator("metrics", "slow_requests", mode="before")
    @classmethod
    def _revive_nonfinite(cls, value: Any) -> Any:
        return _revive(value)

    @model_validator(mode="after")
    def _consistent(self) -> CellRecord:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(
                f"records are built at schema {SCHEMA_VERSION}, not {self.schema_version}"
            )
        if self.status in (Status.OK, Status.INVALID):
            if self.validity is None or not self.metrics:
                raise ValueError(f"a {self.status} record needs metrics and a validity verdict")
            if (self.status is Status.OK) != (self.validity.verdict == "valid"):
                raise ValueError(
                    f"status {self.status} contradicts verdict {self.validity.verdict}"
                )
        elif not self.reasons:
            raise ValueError(f"a {self.status} record must say why")
        if self.duration_s < 0:
            raise ValueError("duration_s must be >= 0")
        if self.attempt < 1 or self.repeat < 1:
            raise ValueError("attempt and repeat count from 1")
        if self.single_stream is not None and self.single_stream not in self.samples:
            raise ValueError(f"single_stream names {self.single_stream!r}, which is not a sample")
        return self

    @property
    def slot(self) -> str:
        return slot(self.cell_id, self.repeat)

    def metric(self, path: str) -> Any:
        """Value at a dotted path in ``metrics`` (None when absent)."""
        node: Any = self.metrics
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def reporting(self) -> ReportSpec:
        """What the reports need to know about this cell's workload: the declared spec,
        or for a record without one what the reports always assumed."""
        return self.report_spec or legacyspec.inferred(self.workload, self.metric)


_NONFINITE = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _revive(value: Any) -> Any:
    """JSON has no infinity: it is written as the string "Infinity" and read back here."""
    if isinstance(value, dict):
        return {k: _revive(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_revive(v) for v in value]
    if isinstance(value, str) and value in _NONFINITE:
        return _NONFINITE[value]
    return value


class PlannedCell(Frozen):
    cell_id: str
    workload: str
    engine: str
    params: dict[str, ParamValue]
    nodeid: str
    report_spec: ReportSpec | None = None
    """The workload's declaration (harness.results.reportspec), for a cell that never
    writes a record."""

    _ids = field_validator("cell_id")(check_id)

    def reporting(self) -> ReportSpec:
        """As ``CellRecord.reporting``, for the question the cell poses (no metrics)."""
        return self.report_spec or legacyspec.inferred(self.workload)


class Manifest(Frozen):
    schema_version: int = SCHEMA_VERSION
    run_id: str
    state: Literal["running", "complete", "incomplete"]
    created_at: str
    finished_at: str | None = None
    command: tuple[str, ...] = ()
    settings: dict[str, Any] = Field(default_factory=dict)
    environment: dict[str, Any] = Field(default_factory=dict)
    planned: tuple[PlannedCell, ...] = ()
    statuses: dict[str, Status] = Field(default_factory=dict)
    """By slot: the cell id, or ``<cell-id>@N`` for repeat N > 1 (``--repeats``)."""
    attempt: int = 1
    """How many sessions have worked on this run: 1, plus one per ``--resume``."""
    incidents: tuple[str, ...] = ()
    """Failures outside any cell (an engine crashing while it closed, a full disk)."""
    provenance: dict[str, Any] = Field(default_factory=dict)
    """What the run measured beyond its options (harness.results.provenance): the content of the
    user's model and images, engine packages, hardware, code; ``--resume`` checks it."""
    pytest_plugins: dict[str, Any] = Field(default_factory=dict)
    """pytest's version, the plugins of the session that started the run and what they were
    set to (harness.session.neighbours): a run under coverage or in random order shows it."""

    _ids = field_validator("run_id")(check_id)

    @model_validator(mode="after")
    def _unique(self) -> Manifest:
        ids = [c.cell_id for c in self.planned]
        if len(ids) != len(set(ids)):
            raise ValueError("planned cell ids must be unique")
        return self


M = TypeVar("M", bound=BaseModel)


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v2 added record ``attempt``/``stderr_tail`` and manifest ``attempt``/``incidents``;
    a v1 file was a first attempt with nothing of either."""
    return {**data, "schema_version": 2}


def _v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """v3 added record ``telemetry``; a v2 record sampled none."""
    return {**data, "schema_version": 3}


def _v3_to_v4(data: dict[str, Any]) -> dict[str, Any]:
    """v4 added record ``slow_requests`` and headline ``ci``; v3 kept neither."""
    return {**data, "schema_version": 4}


def _v4_to_v5(data: dict[str, Any]) -> dict[str, Any]:
    """v5 added record ``single_stream``; a v4 record declared none."""
    return {**data, "schema_version": 5}


def _v5_to_v6(data: dict[str, Any]) -> dict[str, Any]:
    """v6 added manifest ``provenance``; a v5 run recorded none (records are unchanged)."""
    return {**data, "schema_version": 6}


def _v6_to_v7(data: dict[str, Any]) -> dict[str, Any]:
    """v7 added record ``repeat``; a v6 record was the one measurement of its cell."""
    return {**data, "schema_version": 7}


def _v7_to_v8(data: dict[str, Any]) -> dict[str, Any]:
    """v8 added manifest ``pytest_plugins``; a v7 run did not record them (records are
    unchanged)."""
    return {**data, "schema_version": 8}


# schema_version -> function turning a dict of that version into the next version.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: _v1_to_v2,
    2: _v2_to_v3,
    3: _v3_to_v4,
    4: _v4_to_v5,
    5: _v5_to_v6,
    6: _v6_to_v7,
    7: _v7_to_v8,
}


def migrate(data: dict[str, Any], source: str) -> dict[str, Any]:
    version = data.get("schema_version")
    if not isinstance(version, int) or version < 1:
        raise RecordError(f"{source}: missing or bad schema_version {version!r}")
    if version > SCHEMA_VERSION:
        raise NewerSchemaError(
            f"{source}: schema_version {version} is newer than this harness reads"
            f" ({SCHEMA_VERSION}); upgrade inference-harness to read it"
        )
    while version < SCHEMA_VERSION:
        data = MIGRATIONS[version](data)
        version = data["schema_version"]
    return data


def parse(model: type[M], raw: bytes, source: str) -> M:
    """Decode, migrate and validate one results file; every failure names ``source``."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"{source}: corrupt results file (not JSON: {exc})") from exc
    if not isinstance(data, dict):
        raise RecordError(f"{source}: corrupt results file (top level is not an object)")
    data = migrate(data, source)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RecordError(f"{source}: invalid {model.__name__}: {exc}") from exc


def read(model: type[M], path: Path) -> M:
    return parse(model, path.read_bytes(), str(path))


def dump(model: BaseModel) -> bytes:
    """Stable bytes: field order is the model's, dict order the (deterministic) build order.

    Keys are not sorted so that cell parameters keep the order the workload declared,
    which is the order the matrix shows them in. Secrets from the environment are masked
    here, the one door every results file goes through.
    """
    data = redact(json.loads(model.model_dump_json()))
    return (json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode()
