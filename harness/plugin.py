"""pytest wiring: options, the ``cell``/``open_engine`` fixtures, and result hooks.

A *cell* is any test that requests the ``cell`` fixture; it is parametrized over the
selected engines, planned in the run manifest at collection, and leaves exactly one
record whatever happens to it (ok, invalid, failed, skipped).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import pytest

from harness import registry, report, store
from harness.cell import Cell, make_cell_id
from harness.config import ProfileName, RunSettings, UsageError, parse_settings
from harness.engine import Engine, EngineConfig, EngineError
from harness.environment import fingerprint
from harness.pool import EnginePool
from harness.records import Manifest, ParamValue, PlannedCell, Status

SETTINGS = pytest.StashKey[RunSettings]()
RUN = pytest.StashKey["RunState"]()
CELL = pytest.StashKey[Cell]()
OUTCOME = pytest.StashKey[list[tuple[str, str, str]]]()

ENGINE_ARG = "engine_name"
NO_RESULT = "the workload ended without reporting a result (Cell.finish was never called)"


@dataclass
class RunState:
    run_dir: Path
    manifest: Manifest
    planned: dict[str, PlannedCell] = field(default_factory=dict)
    written: dict[str, Status] = field(default_factory=dict)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "inference benchmark harness")
    group.addoption(
        "--engine",
        action="append",
        metavar="NAME[,NAME]",
        help="engine(s) to benchmark; repeat or comma-separate (default: onnxruntime)",
    )
    group.addoption(
        "--model", metavar="PATH", help="run a local model instead of the embedded default"
    )
    group.addoption("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    group.addoption(
        "--results-dir",
        default="results/runs",
        metavar="DIR",
        help="where run directories are created (default: results/runs)",
    )
    group.addoption(
        "--profile",
        default="quick",
        help=f"{' | '.join(p.value for p in ProfileName)}: quick keeps cells to seconds,"
        " full uses windows worth trusting (default: quick)",
    )
    group.addoption("--seed", type=int, default=0, help="seed for inputs and arrivals (default: 0)")
    group.addoption(
        "--window", type=float, metavar="SECONDS", help="override the profile's measured window"
    )
    group.addoption(
        "--requests", type=int, metavar="N", help="override the profile's closed-loop request count"
    )
    group.addoption(
        "--dim",
        action="append",
        metavar="NAME=SIZE",
        help="size for a named dynamic dimension of a --model's inputs",
    )
    group.addoption(
        "--slo",
        metavar="METRIC_pNN=DURATION[,...]",
        help="SLOs for goodput and verdicts, e.g. ttft_p99=200ms,tpot_p99=50ms",
    )
    group.addoption(
        "--engine-opt",
        action="append",
        metavar="ENGINE.KEY=VALUE",
        help="adapter option, e.g. onnxruntime.intra_op_threads=2",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires(**capabilities): engine capabilities a cell needs")
    try:
        settings = parse_settings(
            engines=config.getoption("engine"),
            device=config.getoption("device"),
            profile=config.getoption("profile"),
            results_dir=config.getoption("results_dir"),
            seed=config.getoption("seed"),
            model=config.getoption("model"),
            window=config.getoption("window"),
            requests=config.getoption("requests"),
            dims=config.getoption("dim"),
            engine_options=config.getoption("engine_opt"),
            slo=config.getoption("slo"),
        )
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[SETTINGS] = settings


def settings_of(config: pytest.Config) -> RunSettings:
    return config.stash[SETTINGS]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if ENGINE_ARG in metafunc.fixturenames:
        engines = settings_of(metafunc.config).engines
        metafunc.parametrize(ENGINE_ARG, engines, ids=list(engines))


def _is_cell(item: pytest.Item) -> bool:
    return isinstance(item, pytest.Function) and "cell" in item.fixturenames


def _workload(item: pytest.Function) -> str:
    """The workload is the test function: ``test_batching`` -> ``batching``."""
    return item.originalname.removeprefix("test_")


def _params(item: pytest.Function) -> dict[str, ParamValue]:
    spec = getattr(item, "callspec", None)
    params = dict(spec.params) if spec else {}
    params.pop(ENGINE_ARG, None)
    for key, value in params.items():
        if not isinstance(value, str | int | float | bool | type(None)):
            raise pytest.UsageError(
                f"{item.nodeid}: cell parameter {key}={value!r} must be a scalar"
            )
    return cast(dict[str, ParamValue], params)


def _planned(item: pytest.Function) -> PlannedCell:
    engine = item.callspec.params.get(ENGINE_ARG, "?") if hasattr(item, "callspec") else "?"
    params = _params(item)
    workload = _workload(item)
    cell_id = make_cell_id(workload, str(engine), params)
    return PlannedCell(
        cell_id=cell_id, workload=workload, engine=str(engine), params=params, nodeid=item.nodeid
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group cells by engine, in ``--engine`` order, so each engine starts once and runs
    alone (a server or engine of the next one is not yet up and polling)."""
    order = {name: i for i, name in enumerate(settings_of(config).engines)}

    def engine_rank(item: pytest.Item) -> int:
        spec = getattr(item, "callspec", None)
        engine = spec.params.get(ENGINE_ARG) if spec else None
        return order.get(str(engine), -1)

    items.sort(key=engine_rank)  # stable: the workloads' own order is kept within an engine


def pytest_collection_finish(session: pytest.Session) -> None:
    cells = [item for item in session.items if _is_cell(item)]
    if not cells or session.config.option.collectonly:
        return
    settings = settings_of(session.config)
    planned = [_planned(cast(pytest.Function, item)) for item in cells]
    run_dir = store.new_run_dir(settings.results_dir)
    manifest = Manifest(
        run_id=run_dir.name,
        state="running",
        created_at=store.utcnow(),
        command=tuple(sys.argv),
        settings=settings.to_json(),
        environment=fingerprint(),
        planned=tuple(planned),
    )
    store.write_manifest(run_dir, manifest)
    state = RunState(run_dir, manifest, {c.nodeid: c for c in planned})
    session.config.stash[RUN] = state


@pytest.fixture(scope="session")
def harness_settings(pytestconfig: pytest.Config) -> RunSettings:
    """The validated run settings (engines, device, profile, seed, ...)."""
    return settings_of(pytestconfig)


@pytest.fixture
def engine_name() -> str:
    """The engine of this cell; parametrized from --engine by pytest_generate_tests."""
    raise RuntimeError("engine_name is parametrized by the harness plugin; is it loaded?")


@pytest.fixture
def cell(
    request: pytest.FixtureRequest, harness_settings: RunSettings, engine_name: str
) -> Iterator[Cell]:
    """This test's matrix cell; skips with the reason when the engine cannot serve it."""
    item = cast(pytest.Function, request.node)
    state = request.config.stash.get(RUN, None)
    if state is None:
        raise RuntimeError("cells need a run directory; was collection bypassed?")
    planned = state.planned[item.nodeid]
    new = Cell(
        run_id=state.manifest.run_id,
        cell_id=planned.cell_id,
        workload=planned.workload,
        engine=planned.engine,
        params=dict(planned.params),
        policy=harness_settings.profile.policy,
        environment=fingerprint(),
    )
    item.stash[CELL] = new
    _skip_if_unable(item, planned.engine, harness_settings.device)
    yield new
    call_passed = ("call", "passed") in [(w, o) for w, o, _ in item.stash.get(OUTCOME, [])]
    if call_passed and new.result is None:
        # The pytest outcome must agree with the record: no result is a failed cell.
        raise RuntimeError(NO_RESULT)


def _skip_if_unable(item: pytest.Function, engine: str, device: str) -> None:
    status = registry.status(engine, device)
    if not status.availability.available:
        pytest.skip(status.availability.reason)
    factory = registry.load(engine)
    for marker in item.iter_markers("requires"):
        lacking = factory.capabilities.missing(marker.kwargs)
        if lacking:
            pytest.skip(f"{engine} lacks capability {', '.join(lacking)} that this workload needs")


class OpenEngine(Protocol):
    def __call__(
        self, model: Path, *, options: Mapping[str, str] | None = None, shared: bool = False
    ) -> Engine: ...


@pytest.fixture(scope="session")
def aio() -> Iterator[asyncio.Runner]:
    """One event loop for the whole session: shared async engines stay bound to it."""
    with asyncio.Runner() as runner:
        yield runner


@pytest.fixture(scope="session")
def engine_pool(aio: asyncio.Runner) -> Iterator[EnginePool]:
    pool = EnginePool()
    yield pool
    errors = pool.close_all()
    if errors:
        raise EngineError("closing shared engines failed: " + "; ".join(errors))


def _load(engine_name: str, config: EngineConfig) -> Engine:
    engine = registry.load(engine_name)(config)
    try:
        engine.load()
    except BaseException:
        engine.close()
        raise
    return engine


@pytest.fixture
def open_engine(
    cell: Cell, harness_settings: RunSettings, engine_pool: EnginePool
) -> Iterator[OpenEngine]:
    """``open_engine(model, options=..., shared=...)`` -> a loaded engine of this cell.

    ``options`` add to the user's ``--engine-opt`` values (the user's win). Unshared
    engines are closed at teardown; shared ones at the end of the session.
    """
    opened: list[Engine] = []

    def _open(
        model: Path, *, options: Mapping[str, str] | None = None, shared: bool = False
    ) -> Engine:
        merged = {**(options or {}), **harness_settings.engine_options.get(cell.engine, {})}
        config = EngineConfig(model=model, device=harness_settings.device, options=merged)
        if shared:
            key = (
                cell.engine,
                str(model),
                config.device,
                *sorted(f"{k}={v}" for k, v in merged.items()),
            )
            engine = engine_pool.get(key, lambda: _load(cell.engine, config))
        else:
            engine = _load(cell.engine, config)
            opened.append(engine)
        cell.engine_info = engine.describe()
        return engine

    yield _open
    errors = []
    for engine in reversed(opened):
        try:
            engine.close()
        except Exception as exc:  # closing one engine must not skip closing the rest
            errors.append(f"{type(exc).__name__}: {exc}")
    if errors:
        raise EngineError("engine close failed: " + "; ".join(errors))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, Any]:
    rep: pytest.TestReport = yield
    if not _is_cell(item):
        return rep
    outcomes = item.stash.setdefault(OUTCOME, [])
    outcomes.append((rep.when, rep.outcome, _why(rep)))
    if rep.when == "teardown":
        _write_cell(item, outcomes)
    return rep


def _why(rep: pytest.TestReport) -> str:
    if rep.skipped and isinstance(rep.longrepr, tuple):
        return str(rep.longrepr[2]).removeprefix("Skipped: ")
    if rep.failed:
        crash = getattr(rep.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(rep.longrepr)
        return f"{rep.when}: {message}"[:2000]
    return ""


def _status(outcomes: list[tuple[str, str, str]]) -> tuple[Status | None, list[str]]:
    skipped = [why for _, outcome, why in outcomes if outcome == "skipped"]
    failed = [why for _, outcome, why in outcomes if outcome == "failed"]
    if failed:
        return Status.FAILED, failed
    if skipped:
        return Status.SKIPPED, skipped
    return None, []


def _write_cell(item: pytest.Item, outcomes: list[tuple[str, str, str]]) -> None:
    state = item.config.stash.get(RUN, None)
    if state is None:
        return
    planned = state.planned[item.nodeid]
    cell = item.stash.get(CELL, None)
    if cell is None:  # setup failed or skipped before the cell fixture ran
        cell = Cell(
            state.manifest.run_id,
            planned.cell_id,
            planned.workload,
            planned.engine,
            dict(planned.params),
            settings_of(item.config).profile.policy,
            fingerprint(),
        )
    status, reasons = _status(outcomes)
    record = cell.record(status, reasons)
    store.write_record(state.run_dir, record)
    state.written[planned.cell_id] = record.status


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(RUN, None)
    if state is None:
        return
    planned_ids = {c.cell_id for c in state.manifest.planned}
    complete = planned_ids <= set(state.written)
    final = state.manifest.model_copy(
        update={
            "state": "complete" if complete else "incomplete",
            "finished_at": store.utcnow(),
            "statuses": dict(sorted(state.written.items())),
        }
    )
    store.write_manifest(state.run_dir, Manifest.model_validate(final.model_dump()))
    report.write(state.run_dir)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(RUN, None)
    if state is None:
        return
    counts: dict[str, int] = {}
    for status in state.written.values():
        counts[status.value] = counts.get(status.value, 0) + 1
    tally = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no cells finished"
    terminalreporter.section("harness result matrix")
    md = state.run_dir / "matrix.md"
    if md.is_file():
        terminalreporter.write(md.read_text())
    terminalreporter.write_line(f"cells: {tally}")
    terminalreporter.write_line(f"run directory: {state.run_dir}")


__all__ = ["OpenEngine", "RunSettings", "settings_of"]
