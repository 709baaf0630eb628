"""What the live progress of a run looks like: plain lines for logs, rich's live display for
terminals, and the terminal both share with pytest's own reporter.

Pure formatting (``plain_line``, ``rich_line``) takes the time as an argument, so it is
tested with a fake clock; the displays only decide when to show what.
"""

from __future__ import annotations

import contextlib
import enum
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from rich.console import Console, Group, RenderableType
from rich.control import Control
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from harness.exceptions import UsageError
from harness.load.livecounters import LoadSnapshot

PLAIN_EVERY_S = 10.0
"""A plain line per cell this often (plus one at its end): enough to see a long cell move,
few enough to keep a CI log small."""
RICH_REFRESH_HZ = 4.0
BAR_WIDTH = 20


class Mode(enum.StrEnum):
    AUTO = "auto"
    RICH = "rich"
    PLAIN = "plain"
    OFF = "off"


def parse_mode(value: str) -> Mode:
    try:
        return Mode(value.strip().lower())
    except ValueError:
        choices = ", ".join(m.value for m in Mode)
        raise UsageError(f"--progress: expected one of {choices}, got {value!r}") from None


def resolve(mode: Mode, isatty: bool, term: str) -> Mode:
    """``auto``: the live display on a terminal that can move its cursor, else plain lines."""
    if mode is not Mode.AUTO:
        return mode
    return Mode.RICH if isatty and term != "dumb" else Mode.PLAIN


@dataclass(frozen=True)
class CellView:
    """The cell in flight, as the controller numbers it: ``index`` of ``total`` cell runs
    this session (0: not known), started at ``started`` (the display's clock)."""

    nodeid: str
    cell_id: str
    index: int
    total: int
    started: float
    repeat: int = 1
    repeats: int = 1
    workload: str = ""
    """The cell's workload and engine (empty: not known, the id names the cell)."""
    engine: str = ""
    params: str = ""
    """Its parameters as ``k=v k=v``: what tells it from the cells around it."""

    def _of(self) -> str:
        return f"{self.index}/{self.total}" if self.total else f"{self.index}"

    def _again(self) -> str:
        return f" (repeat {self.repeat}/{self.repeats})" if self.repeats > 1 else ""

    @property
    def title(self) -> str:
        """``cell 3/12 ID``: the whole id, for a log line (which is never cut)."""
        return f"cell {self._of()} {self.cell_id}{self._again()}"

    @property
    def heading(self) -> str:
        """For the terminal: the parameters first, since they are what differs from one
        cell to the next, then the workload and engine, once: ``rate=100 mode=none ·
        batching on onnxruntime, cell 3/12``."""
        if not self.workload:
            return self.title
        where = f"{self.workload} on {self.engine}, cell {self._of()}{self._again()}"
        return f"{self.params} · {where}" if self.params else where


@dataclass(frozen=True)
class Reading:
    """The counters, and when (the display's clock) they were taken: the window's elapsed
    time goes on from there between two readings."""

    load: LoadSnapshot
    at: float

    def window_s(self, now: float) -> float | None:
        if self.load.window_s is None or self.load.ended:
            return self.load.window_s
        return self.load.window_s + max(0.0, now - self.at)


def _seconds(value: float) -> str:
    return f"{value:.1f}"


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.2f} ms" if abs(ms) < 10 else f"{ms:.0f} ms"


def window_text(reading: Reading, now: float, final: bool) -> str:
    """``8.1/10.0 s`` (elapsed of planned), ``8.1 s`` with no plan; at the end, the window
    as it stood at the last reading, not extrapolated."""
    window = reading.load.window_s if final else reading.window_s(now)
    if window is None:  # before the load, or a workload whose own loop counts nothing
        return "no requests counted" if final else "no requests counted yet"
    planned = reading.load.planned_s
    return f"{_seconds(window)}/{_seconds(planned)} s" if planned else f"{_seconds(window)} s"


def counts_text(load: LoadSnapshot) -> str:
    sent = f"{load.sent}/{load.planned_requests}" if load.planned_requests else f"{load.sent}"
    lag = "" if load.lag_s is None else f", lag {_ms(load.lag_s)}"
    return f"sent {sent} completed {load.completed} failed {load.failed}{lag}"


def plain_line(
    view: CellView, reading: Reading, now: float, final: bool = False, outcome: str = ""
) -> str:
    """``[progress] cell 3/12 ID: 14.2 s, window 8.1/10.0 s, sent 97/120 completed 95
    failed 0, lag 1.2 ms`` (``ended after 14.2 s`` at the end, with the cell's outcome
    when it is not "passed")."""
    return f"[progress] {view.title}: {_body(view, reading, now, final, outcome)}"


def _body(view: CellView, reading: Reading, now: float, final: bool, outcome: str) -> str:
    took = _seconds(max(0.0, now - view.started))
    state = f"ended after {took} s" if final else f"{took} s"
    if outcome:
        state += f" ({outcome})"
    window = window_text(reading, now, final)
    if reading.load.window_s is None:
        return f"{state}, {window}"
    return f"{state}, window {window}, {counts_text(reading.load)}"


def rich_line(view: CellView, reading: Reading, now: float, width: int) -> RenderableType:
    """Two rows of ``width`` columns: the cell's heading (its parameters first; wrapped
    onto another row, never cut, since the parameters are what tells cells apart), then
    a bar of its window's elapsed over planned time (pulsing when there is no plan), the
    window, the counts and the cell's time. Short of room, the bar goes first, then the
    end of the second row is cut."""
    window = reading.window_s(now)
    planned = reading.load.planned_s
    known = window is not None and bool(planned)
    detail = window_text(reading, now, final=False)
    if window is not None:
        detail += f"  {counts_text(reading.load)}"
    detail += f"  elapsed {_seconds(max(0.0, now - view.started))} s"
    bar_width = BAR_WIDTH if width - len(detail) - 1 >= BAR_WIDTH else 0
    grid = Table.grid(padding=(0, 1))
    cells: list[RenderableType] = []
    if bar_width:
        grid.add_column(width=bar_width, no_wrap=True)
        cells.append(
            ProgressBar(
                total=planned if known else None,
                completed=min(window or 0.0, planned or 0.0),
                width=bar_width,
                pulse=not known,
                animation_time=now,
            )
        )
    grid.add_column(width=max(1, width - (bar_width + 1 if bar_width else 0)), no_wrap=True)
    cells.append(Text(detail, overflow="ellipsis", no_wrap=True))
    grid.add_row(*cells)
    return Group(Text(view.heading, overflow="fold"), grid)


class Display(Protocol):
    def show(self, view: CellView, reading: Reading) -> None:
        """The latest reading of the cell in flight (called about once a second)."""
        ...

    def pause(self) -> None:
        """pytest's reporter is about to write: get out of its way."""
        ...

    def end(self, view: CellView, reading: Reading, outcome: str) -> None:
        """The cell has ended; ``outcome``: "failed" or "skipped", else empty."""
        ...

    def close(self) -> None: ...


class Screen:
    """The terminal (or log) that pytest's reporter writes to, shared with it.

    pytest captures fds 1 and 2 while an in-process test runs, so the display writes to a
    duplicate of fd 1 taken at configuration (when nothing is captured); lines written
    from the session's main thread between tests go through the reporter instead, which
    then knows where its line stands."""

    def __init__(
        self, stream: TextIO, reporter: Callable[[], Any], on_main: Callable[[], bool]
    ) -> None:
        self.stream = stream
        self.reporter = reporter
        """pytest's terminal reporter (None without one); asked when needed, since it is
        registered after the harness's plugin is configured."""
        self.on_main = on_main
        self.lock = threading.RLock()
        self._broke_at: int | None = None

    @classmethod
    def of_stdout(cls, reporter: Callable[[], Any]) -> Screen:
        stream = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
        main = threading.main_thread()
        return cls(stream, reporter, lambda: threading.current_thread() is main)

    def isatty(self) -> bool:
        return self.stream.isatty()

    def column(self) -> int:
        """Where the reporter's current line ends (0 when unknown)."""
        writer = getattr(self.reporter(), "_tw", None)
        width = getattr(writer, "width_of_current_line", 0)
        return width if isinstance(width, int) else 0

    def flush_reporter(self) -> None:
        """Before writing past the reporter: what it buffered goes out first."""
        reporter = self.reporter()
        if reporter is not None and self.on_main():
            reporter.flush()

    def line(self, text: str) -> None:
        with self.lock:
            reporter = self.reporter()
            if reporter is not None and self.on_main():
                # through the reporter's writer, which then knows its line is empty; not
                # write_line, whose idea of an unfinished line misses a test's letter
                lead = "\n" if self.column() else ""
                reporter.write(f"{lead}{text}\n")
                reporter.flush()  # a CI log sees it now, not when a buffer fills
                return
            column = self.column()
            # off the main thread the reporter cannot be told: end its line once
            lead = "\n" if column and column != self._broke_at else ""
            self._broke_at = column
            self.stream.write(f"{lead}{text}\n")
            self.stream.flush()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.stream.close()


class PlainDisplay:
    """A line per cell every ``every_s`` seconds of its run, and one at its end."""

    def __init__(
        self, screen: Screen, now: Callable[[], float], every_s: float = PLAIN_EVERY_S
    ) -> None:
        self.screen = screen
        self.now = now
        self.every_s = every_s
        self._due: dict[str, float] = {}

    def show(self, view: CellView, reading: Reading) -> None:
        key = f"{view.index}:{view.nodeid}"
        now = self.now()
        due = self._due.setdefault(key, view.started + self.every_s)
        if now >= due:
            self._due[key] = now + self.every_s
            self.screen.line(plain_line(view, reading, now))

    def pause(self) -> None:
        return None

    def end(self, view: CellView, reading: Reading, outcome: str) -> None:
        self._due.pop(f"{view.index}:{view.nodeid}", None)
        self.screen.line(plain_line(view, reading, self.now(), final=True, outcome=outcome))

    def close(self) -> None:
        self.screen.close()


class RichDisplay:
    """rich's live display of the cell in flight, refreshed ``RICH_REFRESH_HZ`` times a
    second and erased before pytest's reporter writes, which then goes on where it was."""

    def __init__(
        self, screen: Screen, now: Callable[[], float], *, force: bool, refresh_hz: float
    ) -> None:
        self.screen = screen
        self.now = now
        self.refresh_hz = refresh_hz
        self.console = Console(
            file=screen.stream,
            force_terminal=force or None,
            highlight=False,
            markup=False,
            emoji=False,
        )
        self._live: Live | None = None
        self._state: tuple[CellView, Reading] | None = None
        self._column = 0

    def show(self, view: CellView, reading: Reading) -> None:
        with self.screen.lock:
            self._state = (view, reading)
            if self._live is None:
                self._start()

    def _render(self) -> RenderableType:
        state = self._state
        if state is None:
            return Text("")
        return rich_line(state[0], state[1], self.now(), self.console.width)

    def _start(self) -> None:
        self.screen.flush_reporter()
        with contextlib.suppress(OSError):  # not a terminal (forced): keep rich's guess
            # rich asks fds 0-2, which pytest captures while an in-process test runs
            columns = os.get_terminal_size(self.screen.stream.fileno()).columns
            if columns > 0:  # a pseudo-terminal nobody sized says 0
                self.console.width = columns
        self._column = self.screen.column()
        if self._column:
            self.console.line()  # below the reporter's unfinished line, not over it
        self._live = Live(
            get_renderable=self._render,
            console=self.console,
            refresh_per_second=self.refresh_hz,
            transient=True,
            redirect_stdout=False,  # pytest's capture owns sys.stdout during a test
            redirect_stderr=False,
        )
        self._live.start(refresh=True)

    def pause(self) -> None:
        with self.screen.lock:
            live, self._live = self._live, None
            if live is None:
                return
            live.stop()  # erased: the cursor is back at the start of its first line
            if self._column:
                width = max(1, self.console.width)
                self.console.control(Control.move_to_column(self._column % width, y=-1))
            self.screen.stream.flush()

    def end(self, view: CellView, reading: Reading, outcome: str) -> None:
        self.pause()
        self._state = None

    def close(self) -> None:
        self.pause()
        self.screen.close()
