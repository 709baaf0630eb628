"""Live progress of a run: which cell is running (n of N), its elapsed and planned window,
requests sent, completed and failed, and the load generator's current lag.

Where each part runs:

* the cell's process keeps the counters (``harness.load.livecounters.LIVE``): the load
  generators bump them, and nothing else of this enters their loops;
* under process isolation, a worker's ``WorkerSampler`` sends them to the controller as
  a "progress" event once a second, from a thread of its own; the controller's
  ``ProgressView`` shows them (harness.session.isolation hands them over with ``forward``);
* with ``--isolation=none`` the ``ProgressView`` samples them itself, from a thread,
  since the session's own thread is busy measuring.

``--progress auto`` (the default) shows rich's live display on a terminal and plain lines
anywhere else (a CI log); ``rich`` or ``plain`` force one, ``off`` shows nothing. A Ray run
shows none: its cells report only when they have ended.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import pytest

from harness.exceptions import UsageError
from harness.load.livecounters import LIVE, LoadSnapshot
from harness.results.records import PlannedCell, format_param
from harness.results.redact import redact_text
from harness.session import announce
from harness.session.config import RunSettings
from harness.session.execution import Dist, Isolation
from harness.session.progressview import (
    RICH_REFRESH_HZ,
    CellView,
    Display,
    Mode,
    PlainDisplay,
    Reading,
    RichDisplay,
    Screen,
    parse_mode,
    resolve,
)
from harness.session.state import RunState, is_cell

NAME = "harness-progress"
SAMPLE_S = 1.0
"""How often the counters are read: often enough for a display, rarely enough that the
measured process never notices the reading thread."""
IN_PROCESS_REFRESH_HZ = 1.0
"""Rendering in the measured process itself (``--isolation=none``) shares its interpreter
lock with the load generator: once a second there, not ``RICH_REFRESH_HZ``."""

RunGetter = Callable[[], RunState | None]


class Ticker:
    """Calls ``tick`` every ``interval_s`` seconds from a daemon thread, once started."""

    def __init__(self, interval_s: float, tick: Callable[[], None], name: str) -> None:
        self.interval_s = interval_s
        self.tick = tick
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


class WorkerSampler:
    """A worker's half: the counters of its cell in flight, to the controller (over the
    run state's events pipe)."""

    def __init__(self, run: RunGetter, interval_s: float = SAMPLE_S) -> None:
        self.run = run
        self.nodeid: str | None = None
        self.ticker = Ticker(interval_s, self.send, "harness-progress")

    def send(self) -> None:
        nodeid = self.nodeid
        state = self.run()
        if nodeid is not None and state is not None and state.sink is not None:
            state.sink.send("progress", nodeid=nodeid, **LIVE.snapshot().to_json())

    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        LIVE.reset()
        self.nodeid = nodeid
        self.ticker.start()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The measured part is over: its final counts go before its report."""
        if report.when == "call" and report.nodeid == self.nodeid:
            self.send()
            self.nodeid = None

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        self.nodeid = None

    def pytest_unconfigure(self) -> None:
        self.ticker.stop()


def planned_runs(state: RunState, items: Sequence[pytest.Item]) -> int:
    """The cell runs this session has to make: each collected cell once per repeat it
    has no ok record of (a resumed run's finished ones are not run again)."""
    repeats = range(1, state.settings.repeats + 1)
    return sum(
        not state.done(state.planned[item.nodeid].cell_id, r)
        for item in items
        if is_cell(item) and item.nodeid in state.planned
        for r in repeats
    )


def cell_view(
    nodeid: str, planned: PlannedCell, *, number: int, total: int, now: float, state: RunState
) -> CellView:
    """The cell as the display names it; a grid configuration may name a secret, so its
    id and parameters are shown redacted."""
    params = " ".join(f"{k}={format_param(v, none='none')}" for k, v in planned.params.items())
    return CellView(
        nodeid,
        redact_text(planned.cell_id),
        number,
        total,
        now,
        state.repeat,
        state.settings.repeats,
        workload=planned.workload,
        engine=planned.engine,
        params=redact_text(params),
    )


class ProgressView:
    """The controller's half: numbers the cells as they start and shows the latest
    reading of the one in flight. Its display gets out of the reporter's way before each
    report, and shows nothing more of a cell after its measured part."""

    def __init__(
        self,
        display: Display,
        run: RunGetter,
        *,
        sample: bool,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.display = display
        self.run = run
        self.now = now
        self.total = 0
        self.numbers: dict[tuple[str, int], int] = {}
        self.view: CellView | None = None
        self.reading = Reading(LoadSnapshot(), 0.0)
        self.closed = True
        self.holding = False
        self.outcome = ""
        self.lock = threading.RLock()
        self.ticker = Ticker(SAMPLE_S, self._sample, "harness-progress") if sample else None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        state = self.run()
        if state is not None:
            self.total = planned_runs(state, session.items)

    @pytest.hookimpl(trylast=True)  # after the reporter has written the cell's line
    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        state = self.run()
        planned = state.planned.get(nodeid) if state is not None else None
        if state is None or planned is None:
            return
        number = self.numbers.setdefault((nodeid, state.repeat), len(self.numbers) + 1)
        now = self.now()
        with self.lock:
            self.view = cell_view(
                nodeid, planned, number=number, total=self.total, now=now, state=state
            )
            self.reading = Reading(LoadSnapshot(), now)
            self.closed = False
            self.outcome = ""
        if self.ticker is not None:
            LIVE.reset()
            self.ticker.start()

    def update(self, data: Mapping[str, Any]) -> None:
        """A worker's "progress" event."""
        self._show(data.get("nodeid"), LoadSnapshot.from_json(data))

    def _sample(self) -> None:
        view = self.view
        if view is not None:
            self._show(view.nodeid, LIVE.snapshot())

    def _show(self, nodeid: object, load: LoadSnapshot) -> None:
        with self.lock:
            view = self.view
            if view is None or self.closed or self.holding or nodeid != view.nodeid:
                return
            self.reading = Reading(load, self.now())
            self.display.show(view, self.reading)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> Generator[None, None, None]:
        """The reporter writes to the terminal: the display steps aside until it is done,
        for good after the measured part (or a setup that did not pass)."""
        with self.lock:
            self.holding = True
            self.display.pause()
            mine = self.view is not None and report.nodeid == self.view.nodeid
            if mine and report.when == "call" and self.ticker is not None:
                self.reading = Reading(LIVE.snapshot(), self.now())  # this process measured
            if mine and not report.passed:
                self.outcome = self.outcome or report.outcome
        try:
            return (yield)
        finally:
            with self.lock:
                self.holding = False
                self.closed = self.closed or (mine and (report.when == "call" or not report.passed))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logfinish(
        self, nodeid: str, location: tuple[str, int | None, str]
    ) -> Generator[None, None, None]:
        """The cell's last line, after whatever the reporter adds at its end."""
        with self.lock:
            view = self.view
            if view is not None and view.nodeid == nodeid:
                self.view = None
            self.display.pause()
        try:
            return (yield)
        finally:
            if view is not None and view.nodeid == nodeid:
                self.display.end(view, self.reading, self.outcome)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self) -> None:
        """Before the summary (an interrupted cell never reaches its logfinish)."""
        self._stop()

    def pytest_keyboard_interrupt(self) -> None:
        self._stop()

    def _stop(self) -> None:
        with self.lock:
            self.view = None
            self.closed = True
            self.display.pause()
        if self.ticker is not None:
            self.ticker.stop()

    def pytest_unconfigure(self) -> None:
        if self.ticker is not None:
            self.ticker.stop()
        self.display.close()


def forward(config: pytest.Config, data: Mapping[str, Any]) -> None:
    """A worker's "progress" event, to the controller's view (if it shows progress)."""
    view = config.pluginmanager.get_plugin(NAME)
    if isinstance(view, ProgressView):
        view.update(data)


def say(config: pytest.Config, text: str) -> None:
    """A line for the user (``harness.session.announce``), from this session or from a
    worker's "note" event: written where the view's display is, which steps aside."""
    view = config.pluginmanager.get_plugin(NAME)

    def step_aside() -> None:
        if isinstance(view, ProgressView):
            with view.lock:
                view.display.pause()

    announce.to_terminal(config, text, step_aside)


def _install_announcer(config: pytest.Config, run: RunGetter) -> None:
    if not config.getoption("harness_worker"):
        announce.install(config, lambda text: say(config, text))
        return

    def send(text: str) -> None:
        state = run()
        if state is not None and state.sink is not None:
            state.sink.send("note", text=text)
        else:  # no controller to tell (yet): the worker's log keeps it
            announce.to_stderr(text)

    announce.install(config, send)


def register(config: pytest.Config, settings: RunSettings, run: RunGetter) -> None:
    """The progress plugin of this session's role: a worker's sampler, or the view of a
    session that runs cells here or in workers; and where announcements go."""
    _install_announcer(config, run)
    try:
        mode = parse_mode(str(config.getoption("harness_progress")))
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    if mode is Mode.OFF or config.option.collectonly:
        return
    if config.getoption("harness_worker"):
        config.pluginmanager.register(WorkerSampler(run), NAME)
        return
    if config.getoption("harness_only") or settings.dist.mode is Dist.RAY:
        return
    in_process = settings.reliability.isolation is Isolation.NONE
    display = _display(config, mode, in_process)
    config.pluginmanager.register(ProgressView(display, run, sample=in_process), NAME)


def _display(config: pytest.Config, mode: Mode, in_process: bool) -> Display:
    screen = Screen.of_stdout(lambda: config.pluginmanager.get_plugin("terminalreporter"))
    chosen = resolve(mode, screen.isatty(), os.environ.get("TERM", ""))
    if chosen is Mode.RICH:
        refresh = IN_PROCESS_REFRESH_HZ if in_process else RICH_REFRESH_HZ
        return RichDisplay(screen, time.monotonic, force=mode is Mode.RICH, refresh_hz=refresh)
    return PlainDisplay(screen, time.monotonic)
