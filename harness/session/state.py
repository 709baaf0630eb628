"""The state of one run in one pytest process: its directory, plan, records and incidents.

Used by the plugin in every role: in-process, as the controller of workers (it is the
``Recorder`` of harness.session.isolation), and inside a worker, where each record it writes is
also announced to the controller.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.exceptions import RecordError, RecordExists, RunLocked, StorageError, UsageError
from harness.results import provenance, reading, store
from harness.results.environment import fingerprint
from harness.results.lock import RunLock, acquire
from harness.results.records import (
    CellRecord,
    Manifest,
    ParamValue,
    PlannedCell,
    Status,
    slot,
)
from harness.results.redact import redact_text
from harness.results.reportspec import ReportSpec
from harness.session import traffic
from harness.session.cell import ENGINE_SETTING_MARK, REPORT_SPEC_MARK, Cell, make_cell_id
from harness.session.config import RunSettings
from harness.session.execution import Dist
from harness.session.grid import CONFIG_PARAM
from harness.session.worker import EventSink

ENGINE_ARG = "engine_name"
CONFIG_ARG = "engine_config"
"""The fixture parametrized with a cell's ``--engine-grid`` configuration (its label)."""


def register_markers(config: pytest.Config) -> None:
    for line in (
        "requires(**capabilities): engine capabilities a cell needs",
        f"{REPORT_SPEC_MARK}(spec): what the workload's reports need"
        " (harness.results.reportspec.ReportSpec; docs/writing-a-workload.md)",
        f"{ENGINE_SETTING_MARK}(*params): parameters that set the engine, so that cells"
        " setting it alike run together (docs/writing-a-workload.md)",
    ):
        config.addinivalue_line("markers", line)


def is_cell(item: pytest.Item) -> bool:
    return isinstance(item, pytest.Function) and "cell" in item.fixturenames


def engine_of(item: pytest.Item) -> str | None:
    spec = getattr(item, "callspec", None)
    engine = spec.params.get(ENGINE_ARG) if spec else None
    return str(engine) if engine is not None and is_cell(item) else None


def config_of(item: pytest.Item) -> str | None:
    """The cell's engine configuration (``--engine-grid``); None outside a grid run."""
    spec = getattr(item, "callspec", None)
    label = spec.params.get(CONFIG_ARG) if spec else None
    return str(label) if label is not None and is_cell(item) else None


def run_order(settings: RunSettings, item: pytest.Item) -> tuple[int, int]:
    """Cells by engine, in ``--engine`` order, and within it by configuration: an engine
    (or its server) starts once per configuration."""
    engine = engine_of(item) or ""
    labels = settings.engine_grid.labels(engine)
    config = config_of(item)
    place = labels.index(config) if config in labels else -1
    return (settings.engines.index(engine) if engine in settings.engines else -1), place


def setting_key(item: pytest.Item) -> tuple[tuple[str, str], ...]:
    """The values of a cell's parameters that its workload names ``engine_setting``."""
    spec = getattr(item, "callspec", None)
    if spec is None or not is_cell(item):
        return ()
    names = sorted({str(n) for mark in item.iter_markers(ENGINE_SETTING_MARK) for n in mark.args})
    return tuple((n, str(spec.params[n])) for n in names if n in spec.params)


def setting_places(items: Sequence[pytest.Item]) -> dict[str, int]:
    """Each item's place in the run (by node id; ``items`` in collection order): a cell
    that sets the engine takes the place of the first cell that sets it alike, every other
    item keeps its own. ``run_order``'s tie-breaker: the prefix cache off for every
    workload, then on, rather than a server restarted for each workload that switches it,
    and nothing else moves."""
    first: dict[tuple[tuple[str, str], ...], int] = {}
    places = {}
    for place, item in enumerate(items):
        key = setting_key(item)
        places[item.nodeid] = first.setdefault(key, place) if key else place
    return places


def _params(item: pytest.Function) -> dict[str, ParamValue]:
    spec = getattr(item, "callspec", None)
    params = dict(spec.params) if spec else {}
    params.pop(ENGINE_ARG, None)
    if CONFIG_ARG in params:  # first: the configuration is what the engine runs as
        params = {CONFIG_PARAM: params.pop(CONFIG_ARG), **params}
    for key, value in params.items():
        if not isinstance(value, str | int | float | bool | type(None)):
            raise pytest.UsageError(
                f"{item.nodeid}: cell parameter {key}={value!r} must be a scalar"
            )
    return params


def planned_cell(item: pytest.Function) -> PlannedCell:
    engine = engine_of(item) or "?"
    params = _params(item)
    workload = item.originalname.removeprefix("test_")  # test_batching -> batching
    return PlannedCell(
        cell_id=make_cell_id(workload, engine, params),
        workload=workload,
        engine=engine,
        params=params,
        nodeid=item.nodeid,
        report_spec=report_spec_of(item),
    )


def report_spec_of(item: pytest.Item) -> ReportSpec | None:
    """What the workload declared with ``@pytest.mark.report_spec(ReportSpec(...))``."""
    marker = item.get_closest_marker(REPORT_SPEC_MARK)
    if marker is None:
        return None
    if len(marker.args) != 1 or marker.kwargs or not isinstance(marker.args[0], ReportSpec):
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.{REPORT_SPEC_MARK} takes one ReportSpec"
            f" (harness.results.reportspec), got {marker.args!r} {marker.kwargs!r}"
        )
    return marker.args[0]


@dataclass
class RunState:
    run_dir: Path
    manifest: Manifest
    settings: RunSettings
    planned: dict[str, PlannedCell] = field(default_factory=dict)  # by nodeid
    written: dict[str, Status] = field(default_factory=dict)  # by slot, latest attempt
    incidents: list[str] = field(default_factory=list)
    fatal_error: str | None = None
    sink: EventSink | None = None
    missing: list[str] = field(default_factory=list)
    lock: RunLock | None = None
    """The controller's hold on the run directory (harness.results.lock); workers have none."""
    repeat: int = 1
    """The repeat (``--repeats``) being measured now: the controller's current pass, or
    the one a worker was started for."""

    @property
    def attempt(self) -> int:
        return self.manifest.attempt

    def new_cell(self, planned: PlannedCell) -> Cell:
        return Cell(
            run_id=self.manifest.run_id,
            cell_id=planned.cell_id,
            workload=planned.workload,
            engine=planned.engine,
            params=dict(planned.params),
            policy=self.settings.profile.policy,
            environment=fingerprint(),
            attempt=self.attempt,
            repeat=self.repeat,
            report_spec=planned.report_spec,
        )

    def write(
        self, cell: Cell, status: Status | None, reasons: Sequence[str], **extra: Any
    ) -> None:
        record = cell.record(status, reasons, **extra)
        try:
            store.write_record(self.run_dir, record)
        except StorageError as exc:
            self.fatal(
                f"{exc}. Finished records are kept; free space, then finish the run"
                f" with --resume {self.run_dir}"
            )
            stop = redact_text(self.fatal_error or str(exc))
            pytest.exit(stop, returncode=pytest.ExitCode.INTERRUPTED)
        self.note(record.cell_id, record.status, record.repeat)
        if self.sink is not None:
            self.sink.send(
                "record",
                cell_id=record.cell_id,
                status=record.status.value,
                repeat=record.repeat,
            )

    def adopt(self, record: CellRecord) -> None:
        """A record measured elsewhere (a Ray node, harness.dist.raydist) joins this run."""
        try:
            store.write_record(self.run_dir, record)
        except RecordExists:
            self.incident(f"{record.cell_id}: a record of this attempt exists; kept it")
            return
        except StorageError as exc:
            self.fatal(f"{exc}. Finished records are kept; finish the run with --resume")
            return
        self.note(record.cell_id, record.status, record.repeat)

    def done(self, cell_id: str, repeat: int) -> bool:
        """Whether that repeat of the cell has an ok record (then a resume skips it)."""
        return self.written.get(slot(cell_id, repeat)) is Status.OK

    # -- the Recorder protocol of harness.session.isolation ------------------------------------
    def note(self, cell_id: str, status: Status, repeat: int = 1) -> None:
        self.written[slot(cell_id, repeat)] = status

    def lost(
        self, item: pytest.Item, status: Status, reasons: list[str], tail: Sequence[str]
    ) -> bool:
        cell = self.new_cell(self.planned[item.nodeid])
        try:
            self.write(cell, status, reasons, stderr_tail=tail)
        except RecordExists:
            return False
        return True

    def incident(self, text: str) -> None:
        self.incidents.append(text[:4000])
        if self.sink is not None:
            self.sink.send("incident", text=text[:4000])

    def fatal(self, text: str) -> None:
        self.fatal_error = text
        if self.sink is not None:
            self.sink.send("fatal", text=text)

    # -- the manifest ------------------------------------------------------------------
    @property
    def unrecorded(self) -> list[str]:
        """Planned cells (and repeats, as ``<cell-id>@N``) without a record of any attempt,
        in plan order."""
        slots = (
            slot(c.cell_id, r)
            for c in self.manifest.planned
            for r in range(1, self.settings.repeats + 1)
        )
        return [s for s in slots if s not in self.written]

    def finish(self, interrupted: bool) -> Manifest:
        complete = not self.unrecorded and not interrupted
        final = self.manifest.model_copy(
            update={
                "state": "complete" if complete else "incomplete",
                "finished_at": store.utcnow(),
                "statuses": dict(sorted(self.written.items())),
                "incidents": (*self.manifest.incidents, *self.incidents),
            }
        )
        return Manifest.model_validate(final.model_dump())


def _unique_ids(cells: Sequence[PlannedCell]) -> None:
    seen: dict[str, str] = {}
    for c in cells:
        if c.cell_id in seen:
            raise pytest.UsageError(
                f"{seen[c.cell_id]} and {c.nodeid} map to the same cell id {c.cell_id!r};"
                " give their parameters distinct values"
            )
        seen[c.cell_id] = c.nodeid


def measured_inputs(settings: RunSettings) -> dict[str, Any]:
    return provenance.collect(
        model=settings.model, images=settings.images, environment=fingerprint()
    )


def start_run(
    settings: RunSettings,
    cells: Sequence[PlannedCell],
    pytest_plugins: dict[str, Any] | None = None,
) -> RunState:
    _unique_ids(cells)
    run_dir = store.new_run_dir(settings.results_dir)
    created = store.utcnow()
    lock = acquire(run_dir, created)  # a fresh directory: nobody else has it
    manifest = Manifest(
        run_id=run_dir.name,
        state="running",
        created_at=created,
        command=tuple(sys.argv),
        settings=settings.to_json(),
        environment=fingerprint(),
        planned=tuple(cells),
        provenance=measured_inputs(settings),
        pytest_plugins=pytest_plugins or {},
    )
    store.write_manifest(run_dir, manifest)
    return RunState(run_dir, manifest, settings, {c.nodeid: c for c in cells}, lock=lock)


def read_run(run_dir: Path) -> tuple[Manifest, dict[str, Status]]:
    """A run's manifest and the latest status of each cell's repeat (by slot); a bad,
    planted or foreign file is a usage error (resuming would build on it)."""
    try:
        contents = reading.read_run_dir(run_dir)
        manifest = contents.manifest
        if manifest.run_id != run_dir.name:
            raise RecordError(f"{run_dir}: manifest names run {manifest.run_id!r}")
    except reading.DamagedRunError as exc:
        listed = "".join(f"\n  {d}" for d in exc.damaged)
        raise UsageError(
            f"--resume {run_dir}: damaged results files would be built on:{listed}\n"
            "move them out of cells/ (or start a new run), then resume"
        ) from None
    except (RecordError, OSError) as exc:
        raise UsageError(f"--resume {run_dir}: {exc}") from None
    latest = {r.slot: r.status for rs in contents.repeats.values() for r in rs}
    return manifest, latest


SETTINGS_ADDED_LATER: dict[str, object] = {
    "clients": 1,
    "clients_on": "local",
    "dynamic_batch": False,
    "repeats": 1,
    "traffic": traffic.DEFAULT_JSON,
    "engine_grid": {},
    "model_set": "tiny",
    "early_stop": False,
}
"""Settings newer than some run directories, with the value older runs measured with."""


def check_resumable(manifest: Manifest, settings: RunSettings) -> None:
    """A resumed run must measure what the original did, the way it did, or its matrix
    would mix two measurements: the same options, and the same model and image content,
    engine packages, machine and code behind them."""
    options = _changed_options(manifest, settings)
    inputs = provenance.differences(
        _provenance_of(manifest),
        measured_inputs(settings),
        same_machine=settings.dist.mode is Dist.LOCAL and _ran_here(manifest),
    )
    if options or inputs:
        listing = "".join(f"\n  - {line}" for line in (*options, *inputs))
        raise UsageError(
            f"--resume {manifest.run_id}: this session would not measure what the run did;"
            f" it differs in:{listing}\nResume with the same options and inputs, or start a"
            " new run"
        )


def _changed_options(manifest: Manifest, settings: RunSettings) -> list[str]:
    skip = ("results_dir", "dist")  # where results land and where cells run may change
    before = SETTINGS_ADDED_LATER | {k: v for k, v in manifest.settings.items() if k not in skip}
    now = settings.measurement()
    changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    return [f"option {k}: was {before.get(k)!r}, now {now.get(k)!r}" for k in changed]


def _provenance_of(manifest: Manifest) -> dict[str, Any]:
    """The run's recorded inputs; a run from before they were recorded is checked on what
    its fingerprint holds (packages, hardware, code), its files cannot be."""
    if manifest.provenance:
        return manifest.provenance
    return provenance.collect(model=None, images=None, environment=manifest.environment)


def _ran_here(manifest: Manifest) -> bool:
    """Cells of a --cells-on=ray run were measured on the cluster's nodes, not the driver."""
    dist = manifest.settings.get("dist")
    return not isinstance(dist, dict) or dist.get("mode", "local") == "local"


def lock_run(run_dir: Path) -> RunLock:
    """The resumed run's directory, for this session alone (before its manifest is read)."""
    try:
        return acquire(run_dir, store.utcnow())
    except RunLocked as exc:
        raise UsageError(f"--resume: {exc}") from None
    except OSError as exc:
        raise UsageError(f"--resume {run_dir}: cannot lock it: {exc.strerror or exc}") from None


def resume_run(
    run_dir: Path,
    settings: RunSettings,
    manifest: Manifest,
    latest: dict[str, Status],
    lock: RunLock,
) -> RunState:
    for stale in (run_dir / store.CELLS).glob(".tmp-*"):
        stale.unlink()  # a writer killed before its link: never a record, only litter
    resumed = manifest.model_copy(update={"state": "running", "attempt": manifest.attempt + 1})
    resumed = Manifest.model_validate(resumed.model_dump())
    store.write_manifest(run_dir, resumed)
    planned = {c.nodeid: c for c in resumed.planned}
    return RunState(run_dir, resumed, settings, planned, written=dict(latest), lock=lock)
