"""The harness's pytest plugin: its hook implementations (options, configuration,
collection, the record of each cell, the controller's run loop, the end of the run).

A *cell* is any test that requests the ``cell`` fixture; it is parametrized over the
selected engines, planned in the run manifest at collection, and leaves exactly one
record whatever happens to it (ok, invalid, failed, skipped). The fixtures are in
``harness.session.fixtures``, loaded with this module (``pytest_plugins``) however pytest
loads it: the ``pytest11`` entry point, ``-p harness.plugin`` or a conftest.
"""

from __future__ import annotations

import signal
from collections.abc import Generator
from pathlib import Path
from typing import Any, cast

import pytest

from harness.dist import raydist
from harness.exceptions import UsageError
from harness.results.redact import redact_text
from harness.session import (
    benchbridge,
    keywords,
    liveprogress,
    neighbours,
    recording,
    runloop,
    summary,
)
from harness.session.config import check_writable_dir
from harness.session.execution import Dist
from harness.session.passes import run_isolated
from harness.session.pytestoptions import OPTION_NAMES, add_options, check_rootdir, settings_from
from harness.session.resume import resumable, select_for_resume
from harness.session.slocheck import SloCheck
from harness.session.stash import (
    COLLECTED,
    COLLECTED_AT,
    RESTORE_SIGTERM,
    RESUME,
    RUN,
    SETTINGS,
    WORKER,
    settings_of,
)
from harness.session.state import (
    CONFIG_ARG,
    ENGINE_ARG,
    is_cell,
    planned_cell,
    register_markers,
    run_order,
    setting_places,
)
from harness.session.worker import (
    EventSink,
    WorkerSession,
    WorkerSpec,
    become_worker,
    collect_paths,
)

pytest_plugins = ["harness.session.fixtures"]


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
    runloop.open_run(session)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, Any, Any]:
    """Ctrl-C or SIGTERM during an in-process cell: record it as failed, then stop."""
    try:
        return (yield)
    except KeyboardInterrupt as exc:
        recording.record_interrupted(item, exc)
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, Any]:
    """A cell's record is written once its outcome is known: after setup when setup did
    not pass, else after the call. A failure in teardown (closing an engine) does not
    change the measured result; it is an incident of the run and a pytest error."""
    rep: pytest.TestReport = yield
    recording.record_report(item, rep, call)
    return rep


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
    run = runloop.controller_run(session)
    if run is None:
        return None
    state, settings = run
    if settings.dist.mode is Dist.RAY:
        raydist.run(session, state, settings)
    else:
        run_isolated(session, state, settings)
    runloop.stop_on_fatal(state)
    return True


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    runloop.finish_run(session, exitstatus)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(RUN, None)
    if state is not None and WORKER not in config.stash:
        summary.write(terminalreporter, state)
