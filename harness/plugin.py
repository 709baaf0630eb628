"""pytest wiring: options, the ``cell``/``open_engine`` fixtures, and result hooks.

A *cell* is any test that requests the ``cell`` fixture; it is parametrized over the
selected engines, planned in the run manifest at collection, and leaves exactly one
record whatever happens to it (ok, invalid, failed, skipped).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, cast

import pytest

from harness.dist import raydist
from harness.engine import Engine, EngineConfig, EngineError, eventloop, is_fatal, registry
from harness.exceptions import RecordError, UsageError
from harness.metrics.telemetry import Telemetry
from harness.report import matrix
from harness.results import store
from harness.results.records import Status
from harness.results.redact import redact_text
from harness.session import benchbridge, failtext, keywords, liveprogress, neighbours, summary
from harness.session.cell import Cell
from harness.session.config import RunSettings, check_writable_dir
from harness.session.execution import Dist, Isolation
from harness.session.opening import merge_options, start_info
from harness.session.outcome import run_exit
from harness.session.passes import run_isolated
from harness.session.pool import EnginePool, NewEngineInstance
from harness.session.pytestoptions import OPTION_NAMES, add_options, check_rootdir, settings_from
from harness.session.resume import Resume, resumable, select_for_resume
from harness.session.slocheck import SloCheck
from harness.session.state import (
    CONFIG_ARG,
    ENGINE_ARG,
    RunState,
    is_cell,
    planned_cell,
    register_markers,
    resume_run,
    run_order,
    setting_places,
    start_run,
)
from harness.session.worker import (
    EventSink,
    WorkerSession,
    WorkerSpec,
    become_worker,
    collect_paths,
)

SETTINGS = pytest.StashKey[RunSettings]()
RUN = pytest.StashKey[RunState]()
CELL = pytest.StashKey[Cell]()
WORKER = pytest.StashKey[tuple[WorkerSpec, EventSink]]()
RESUME = pytest.StashKey[Resume]()
RESTORE_SIGTERM = pytest.StashKey[Any]()
SHARED = pytest.StashKey["Shared"]()
RECORDED = pytest.StashKey[bool]()
TELEMETRY = pytest.StashKey[Telemetry]()
COLLECTED_AT = pytest.StashKey[int]()
COLLECTED = pytest.StashKey[bool]()

NO_RESULT = "the workload ended without reporting a result (Cell.finish was never called)"


class Shared:
    """The session's event loop and engine pool, closed by the plugin after the last cell
    (not as fixture teardown, which would charge a failing close to the last cell)."""

    def __init__(self, fresh_process_per_instance: bool) -> None:
        self.runner = eventloop.runner()
        self.pool = EnginePool(fresh_process_per_instance)
        self.starts: dict[tuple[str, ...], float] = {}
        """Seconds each engine configuration took to load (by pool key)."""

    def close(self) -> list[str]:
        errors = self.pool.close_all()
        try:
            self.runner.close()
        except Exception as exc:  # the pool's errors must still be reported
            errors.append(f"closing the event loop: {type(exc).__name__}: {exc}")
        return errors


def _shared(config: pytest.Config) -> Shared:
    if SHARED not in config.stash:
        config.stash[SHARED] = Shared(fresh_process_per_instance=WORKER in config.stash)
    return config.stash[SHARED]


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    register_markers(config)
    try:
        _configure(config)
    except pytest.UsageError as exc:  # it echoes option values: a URL with a password too
        raise pytest.UsageError(redact_text(str(exc))) from None


def _configure(config: pytest.Config) -> None:
    if not config.getoption("harness_worker"):
        check_rootdir(config)
    neighbours.check_configure(config, OPTION_NAMES)
    neighbours.watch_xdist(config)
    settings = settings_from(config)
    keywords.accept_cell_id_spelling(config)
    config.stash[SETTINGS] = settings
    liveprogress.register(config, settings, lambda: config.stash.get(RUN, None))
    spec_path = config.getoption("harness_worker")
    if spec_path:
        become_worker()
        spec = WorkerSpec.load(Path(spec_path))
        sink = EventSink(config.getoption("harness_events_fd"))
        config.stash[WORKER] = (spec, sink)
        config.pluginmanager.register(WorkerSession(config, spec, sink), "harness-worker")
        if benchbridge.active(config):
            benchbridge.make_inert(config)  # only the controller writes benchmark files
        return
    if not config.getoption("harness_only"):  # a Ray node's one cell: checked by its driver
        SloCheck.register(config, settings)
    resume = settings.reliability.resume
    try:
        if not config.option.collectonly:
            check_writable_dir(
                resume or settings.results_dir, "--resume" if resume else "--results-dir"
            )
        if resume is not None:
            config.stash[RESUME] = resumable(resume, settings)
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[RESTORE_SIGTERM] = signal.signal(signal.SIGTERM, _terminated)
    if benchbridge.active(config):
        benchbridge.register(config, lambda: config.stash.get(RUN, None))


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: finished cells kept, the cell in flight recorded."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated("SIGTERM")


def pytest_unconfigure(config: pytest.Config) -> None:
    previous = config.stash.get(RESTORE_SIGTERM, None)
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return keywords.header(config)


def settings_of(config: pytest.Config) -> RunSettings:
    return config.stash[SETTINGS]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if ENGINE_ARG not in metafunc.fixturenames:
        return
    settings = settings_of(metafunc.config)
    engines = settings.engines
    if not settings.engine_grid or CONFIG_ARG not in metafunc.fixturenames:
        metafunc.parametrize(ENGINE_ARG, engines, ids=list(engines))
        return
    pairs = [(e, label) for e in engines for label in settings.engine_grid.labels(e)]
    metafunc.parametrize([ENGINE_ARG, CONFIG_ARG], pairs, ids=[f"{e}-{c}" for e, c in pairs])


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> bool | None:
    """A Ray node's run of one cell collects that cell's file only (see worker.collect_paths)."""
    only = session.config.getoption("harness_only")
    if not only or WORKER in session.config.stash:
        return None
    collect_paths(session, [session.config.rootpath / only.split("::")[0]])
    return True


def pytest_itemcollected(item: pytest.Item) -> None:
    """Remember the collection order, which the run keeps (``pytest_collection_modifyitems``)."""
    seen = item.config.stash.get(COLLECTED_AT, 0)
    item.config.stash[COLLECTED_AT] = item.stash[COLLECTED_AT] = seen + 1


@pytest.hookimpl(wrapper=True, tryfirst=True, specname="pytest_collection_modifyitems")
def pytest_collection_accepted(config: pytest.Config) -> Generator[None, None, None]:
    """A run starts only once every plugin has accepted the collection: a bad ``-k``
    expression (pytest's usage error) is raised after collection, yet before
    ``pytest_collection_finish``, which pytest calls whatever happened."""
    config.stash[COLLECTED] = False
    yield
    config.stash[COLLECTED] = True


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group cells by engine, in ``--engine`` order, so each engine starts once and runs
    alone (a server or engine of the next one is not yet up and polling); within an
    engine (and configuration), cells that set it alike run together (``engine_setting``),
    and otherwise keep their collection order whatever reordered them (pytest-randomly).
    Resuming, keep only the run's planned cells that have no ok record."""
    settings = settings_of(config)
    cells = [item for item in items if is_cell(item)]
    if cells and neighbours.drop_cells_in_xdist_worker(config, items, cells):
        cells = []
    if cells:
        neighbours.check_cells(config, cells)
        if WORKER in config.stash:
            neighbours.unbind_timeouts(config, cells)
        keywords.add_cell_ids(cells, lambda item: planned_cell(cast(pytest.Function, item)))

    collected = sorted(items, key=lambda item: item.stash.get(COLLECTED_AT, 0))
    places = setting_places(collected)

    def order(item: pytest.Item) -> tuple[int, int, int, int]:
        return (*run_order(settings, item), places[item.nodeid], item.stash.get(COLLECTED_AT, 0))

    items.sort(key=order)  # stable sort: tests that are not cells keep their order
    only = config.getoption("harness_only")
    if only:  # a Ray node runs one cell of the driver's run (harness.dist.remotecell)
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid != only])
        items[:] = [i for i in items if i.nodeid == only]
    resume = config.stash.get(RESUME, None)
    if resume is not None:
        repeats = settings_of(config).repeats
        select_for_resume(config, items, resume.manifest, resume.latest, repeats)


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    cells = [cast(pytest.Function, item) for item in session.items if is_cell(item)]
    if config.option.collectonly or not config.stash.get(COLLECTED, False):
        return  # listing only, or a usage error after collection: no run to write
    if cells:  # again: a conftest's own modifyitems may have marked cells flaky since
        neighbours.check_cells(config, cells)
    worker = config.stash.get(WORKER, None)
    resume = config.stash.get(RESUME, None)
    settings = settings_of(config)
    if worker is not None:
        spec, sink = worker
        manifest = store.read_manifest(spec.run_dir)
        state = RunState(spec.run_dir, manifest, settings, {c.nodeid: c for c in manifest.planned})
        state.sink = sink
        state.repeat = spec.repeat
    elif resume is not None:
        state = resume_run(resume.run_dir, settings, resume.manifest, resume.latest, resume.lock)
        collected = {c.nodeid for c in cells}
        state.missing = [
            c.cell_id
            for c in resume.manifest.planned
            if c.nodeid not in collected
            and not all(state.done(c.cell_id, r) for r in range(1, settings.repeats + 1))
        ]
    elif cells:
        planned = [planned_cell(item) for item in cells]
        state = start_run(settings, planned, neighbours.active(config))
    else:
        return
    config.stash[RUN] = state


@pytest.fixture(scope="session")
def harness_settings(pytestconfig: pytest.Config) -> RunSettings:
    """The validated run settings (engines, device, profile, seed, ...)."""
    return settings_of(pytestconfig)


@pytest.fixture
def engine_name() -> str:
    """The engine of this cell; parametrized from --engine by pytest_generate_tests."""
    raise RuntimeError("engine_name is parametrized by the harness plugin; is it loaded?")


@pytest.fixture
def engine_config() -> str | None:
    """The cell's ``--engine-grid`` configuration; parametrized in a grid run."""
    return None


@pytest.fixture
def cell(
    request: pytest.FixtureRequest,
    harness_settings: RunSettings,
    engine_name: str,
    engine_config: str | None,
) -> Iterator[Cell]:
    """This test's matrix cell; skips with the reason when the engine cannot serve it.
    Resource use is sampled from here until its record is written."""
    item = cast(pytest.Function, request.node)
    state = request.config.stash.get(RUN, None)
    if state is None:
        raise RuntimeError("cells need a run directory; was collection bypassed?")
    planned = state.planned[item.nodeid]
    new = state.new_cell(planned)
    item.stash[CELL] = new
    _shared(request.config).pool.new_cell()
    _skip_if_unable(item, planned.engine, harness_settings.device)
    sampler = Telemetry()
    item.stash[TELEMETRY] = sampler
    new.sampler = sampler
    sampler.start()
    try:
        yield new
    finally:
        sampler.stop()  # already stopped when the record was written; idempotent


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
def aio(pytestconfig: pytest.Config) -> asyncio.Runner:
    """One event loop for the whole session: shared async engines stay bound to it."""
    return _shared(pytestconfig).runner


@pytest.fixture(scope="session")
def engine_pool(pytestconfig: pytest.Config) -> EnginePool:
    return _shared(pytestconfig).pool


def _notify(config: pytest.Config, kind: str, **data: Any) -> None:
    worker = config.stash.get(WORKER, None)
    if worker is not None:
        worker[1].send(kind, **data)


def _loader(config: pytest.Config, engine_name: str, engine_config: EngineConfig) -> Engine:
    """Load an engine; a worker tells its controller, whose cell deadline excludes loading."""
    _notify(config, "load", state="begin", engine=engine_name)
    try:
        engine = registry.load(engine_name)(engine_config)
        try:
            engine.load()
        except BaseException:
            engine.close()
            raise
    finally:
        _notify(config, "load", state="end", engine=engine_name)
    return engine


@pytest.fixture
def open_engine(
    request: pytest.FixtureRequest,
    cell: Cell,
    harness_settings: RunSettings,
    engine_pool: EnginePool,
) -> Iterator[OpenEngine]:
    """``open_engine(model, options=..., shared=...)`` -> a loaded engine of this cell.

    ``options`` are the workload's; the user's ``--engine-opt`` values and the cell's
    ``--engine-grid`` configuration add to them. Where the user fixes an option the
    workload sets to another value, the cell is skipped saying so: it would measure
    something other than its parameters say. Unshared engines are closed at teardown;
    shared ones at the end of the session. How long the engine took to start is in the
    record (``engine_info.start``), never in a measured figure.
    """
    opened: list[Engine] = []
    config = request.config
    starts = _shared(config).starts

    def _open(
        model: Path, *, options: Mapping[str, str] | None = None, shared: bool = False
    ) -> Engine:
        merged = merge_options(cell, harness_settings, options or {})
        econf = EngineConfig(model=model, device=harness_settings.device, options=merged)
        key = (
            cell.engine,
            str(model),
            econf.device,
            *(f"{k}={v}" for k, v in sorted(merged.items())),
        )
        paid: list[bool] = []

        def load() -> Engine:
            began = time.perf_counter()
            engine = _loader(config, cell.engine, econf)
            starts[key] = time.perf_counter() - began
            paid.append(True)
            return engine

        if shared:
            engine = engine_pool.get(key, load)
        else:
            engine = load()
            opened.append(engine)
        cell.engine_info = engine.describe() | {"start": start_info(starts.get(key), bool(paid))}
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
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, Any, Any]:
    """Ctrl-C or SIGTERM during an in-process cell: record it as failed, then stop."""
    try:
        return (yield)
    except KeyboardInterrupt as exc:
        state = item.config.stash.get(RUN, None)
        if state is not None and is_cell(item) and not item.stash.get(RECORDED, False):
            why = str(exc) or "SIGINT (Ctrl-C)"
            cell = item.stash.get(CELL, None) or state.new_cell(state.planned[item.nodeid])
            reason = f"interrupted by {why}; the run stopped here (finish it with --resume)"
            with contextlib.suppress(Exception):  # the interrupt must win over a full disk
                state.write(cell, Status.FAILED, [reason])
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, Any]:
    """A cell's record is written once its outcome is known: after setup when setup did
    not pass, else after the call. A failure in teardown (closing an engine) does not
    change the measured result; it is an incident of the run and a pytest error."""
    rep: pytest.TestReport = yield
    state = item.config.stash.get(RUN, None)
    if state is None or not is_cell(item):
        return rep
    if call.excinfo is not None and isinstance(call.excinfo.value, NewEngineInstance):
        _requeue(item)
        return rep
    if rep.when == "call" or (rep.when == "setup" and not rep.passed):
        _record(item, state, rep, call)
        if WORKER not in item.config.stash:  # a worker's log keeps its tracebacks
            failtext.shorten_in_process(rep, state.run_dir / store.LOGS)
    elif rep.when == "teardown" and rep.failed:
        state.incident(f"{item.nodeid}: {_why(rep)}")
    return rep


def _requeue(item: pytest.Item) -> None:
    session = item.config.pluginmanager.get_plugin("harness-worker")
    if not isinstance(session, WorkerSession):
        raise RuntimeError("a fresh engine instance was requested outside a worker")
    item.stash[RECORDED] = True  # the fresh worker records it
    session.requeue(item, "it needs another engine configuration than the cells before it")


def _record(
    item: pytest.Item, state: RunState, rep: pytest.TestReport, call: pytest.CallInfo[None]
) -> None:
    cell = item.stash.get(CELL, None) or state.new_cell(state.planned[item.nodeid])
    sampler = item.stash.get(TELEMETRY, None)
    if sampler is not None:
        cell.telemetry = sampler.stop()
    if rep.when == "call" and rep.passed and cell.result is None:
        # The pytest outcome must agree with the record: no result is a failed cell.
        rep.outcome = "failed"
        rep.longrepr = NO_RESULT
    status: Status | None = None
    reasons: list[str] = []
    if rep.skipped:
        status, reasons = Status.SKIPPED, [_why(rep)]
    elif rep.failed:
        exc = call.excinfo.value if call.excinfo is not None else None
        status = Status.CRASHED if exc is not None and is_fatal(exc) else Status.FAILED
        reasons = [_why(rep)]
        if status is Status.CRASHED:
            _recycle(item, state, str(exc))
    state.write(cell, status, reasons)
    item.stash[RECORDED] = True


def _recycle(item: pytest.Item, state: RunState, why: str) -> None:
    """After a device or memory error the engine's process is suspect: a worker ends its
    session after this cell, and the controller starts a fresh one for the rest."""
    if state.sink is not None:
        state.sink.send("recycle", why=why[:500])
        item.session.shouldstop = f"restarting the worker after a crash-like error: {why[:200]}"


def _why(rep: pytest.TestReport) -> str:
    if rep.skipped and isinstance(rep.longrepr, tuple):
        return str(rep.longrepr[2]).removeprefix("Skipped: ")
    if rep.failed:
        crash = getattr(rep.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(rep.longrepr)
        return f"{rep.when}: {message}"[:2000]
    return ""


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Before any reporter sees it (the terminal, a worker's pipe, junitxml): every
    report's text goes through the masking that results files go through."""
    _redact_report(report)


@pytest.hookimpl(tryfirst=True)
def pytest_collectreport(report: pytest.CollectReport) -> None:
    _redact_report(report)


def _redact_report(report: pytest.TestReport | pytest.CollectReport) -> None:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        report.longrepr = (longrepr[0], longrepr[1], redact_text(str(longrepr[2])))
    elif longrepr is not None:
        text = report.longreprtext
        clean = redact_text(text)
        if clean != text:  # keep pytest's structured form where there is nothing to hide
            report.longrepr = clean
    report.sections = [(title, redact_text(body)) for title, body in report.sections]


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """Under process isolation, the controller hands each engine's cells to a worker."""
    config = session.config
    state = config.stash.get(RUN, None)
    settings = settings_of(config)
    isolated = settings.reliability.isolation is Isolation.PROCESS
    if state is None or WORKER in config.stash or not isolated or config.option.collectonly:
        return None
    if session.testsfailed and not config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
    if settings.dist.mode is Dist.RAY:
        raydist.run(session, state, settings)
        if state.fatal_error:
            pytest.exit(redact_text(state.fatal_error), returncode=pytest.ExitCode.INTERRUPTED)
        return True
    run_isolated(session, state, settings)
    if state.fatal_error:
        pytest.exit(redact_text(state.fatal_error), returncode=pytest.ExitCode.INTERRUPTED)
    return True


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = config.stash.get(RUN, None)
    shared = config.stash.get(SHARED, None)
    if shared is not None:
        errors = shared.close()
        if errors and state is not None:
            state.incident("closing shared engines failed: " + "; ".join(errors))
    if state is None or WORKER in config.stash:
        return
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    try:
        store.write_manifest(state.run_dir, state.finish(interrupted))
        matrix.write(state.run_dir)
    except (OSError, RecordError) as exc:  # a full disk; a record damaged since it was written
        state.fatal_error = state.fatal_error or str(exc)
    finally:
        if state.lock is not None:
            state.lock.release()
    session.exitstatus = run_exit(
        session.exitstatus,
        state.written.values(),
        unrecorded=bool(state.unrecorded),
        trouble=bool(state.incidents or state.fatal_error),
    )


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(RUN, None)
    if state is not None and WORKER not in config.stash:
        summary.write(terminalreporter, state)


__all__ = ["OpenEngine", "RunSettings", "settings_of"]
