"""Live progress (issue 22): the load generators' counters, the plain and rich displays,
the controller's view of the cell in flight, and real runs into a log and onto a terminal."""

from __future__ import annotations

import asyncio
import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from harness.exceptions import UsageError
from harness.load.clock import MonotonicClock
from harness.load.livecounters import LIVE, LoadCounter, LoadSnapshot
from harness.load.serving import NoBatching, serve_open_loop
from harness.load.streamdriver import Driver
from harness.session.liveprogress import ProgressView, WorkerSampler
from harness.session.progressview import (
    CellView,
    Mode,
    PlainDisplay,
    Reading,
    RichDisplay,
    Screen,
    parse_mode,
    plain_line,
    resolve,
    rich_line,
)
from tests.support.fakes import FakeClock
from tests.support.once import once
from tests.support.runner import REPO
from tests.test_genload import FakeStreamingEngine, reqs

pytest_plugins = ["pytester"]

CELL_ID = "streaming.vllm.load=open.level=12"


class Now:
    """A clock the test moves."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def view(index: int = 3, total: int = 12, started: float = 100.0, **kw: Any) -> CellView:
    return CellView(f"w.py::t[{index}]", CELL_ID, index, total, started, **kw)


# -- the counters -------------------------------------------------------------------------


def test_a_window_restarts_the_counts_and_times_itself():
    now = Now(5.0)
    counter = LoadCounter(now)
    assert counter.snapshot() == LoadSnapshot()  # nothing started: no window
    counter.sent, counter.completed = 3, 2  # a warm-up's requests
    counter.begin_window(planned_s=10.0, planned_requests=120)
    counter.sent += 2
    counter.completed += 1
    counter.failed += 1
    counter.lag_s = 0.0012
    now.t = 13.1
    snap = counter.snapshot()
    assert (snap.sent, snap.completed, snap.failed, snap.lag_s) == (2, 1, 1, 0.0012)
    assert (snap.window_s, snap.planned_s, snap.planned_requests) == (pytest.approx(8.1), 10, 120)
    assert LoadSnapshot.from_json(snap.to_json()) == snap
    counter.end_window()
    now.t = 20.0
    assert counter.snapshot().window_s == pytest.approx(8.1)  # the loop is over
    assert counter.snapshot().ended
    counter.reset()
    assert counter.snapshot() == LoadSnapshot()


def test_a_malformed_event_reads_as_defaults_not_an_error():
    got = LoadSnapshot.from_json({"sent": "7", "completed": 4, "failed": True, "lag_s": None})
    assert got == LoadSnapshot(sent=0, completed=4, failed=0)


def test_the_stream_driver_counts_what_it_sends_and_how_it_ended():
    engine = FakeStreamingEngine(step=0.001, fail_every=3)
    offsets = np.linspace(0.0, 0.05, 6)
    asyncio.run(Driver(engine, MonotonicClock(), 5.0).open_loop(reqs(6), offsets))
    snap = LIVE.snapshot()
    assert (snap.sent, snap.completed, snap.failed) == (6, 4, 2)
    assert (snap.planned_s, snap.planned_requests) == (pytest.approx(0.05), 6)
    assert snap.lag_s is not None
    assert 0 <= snap.lag_s < 0.05
    assert snap.window_s is not None
    assert snap.window_s >= 0.05


def test_a_closed_loop_with_a_duration_plans_time_not_a_count():
    engine = FakeStreamingEngine(step=0.001)
    asyncio.run(Driver(engine, MonotonicClock(), 5.0).closed_loop(reqs(50), 2, 0.01, 4))
    snap = LIVE.snapshot()
    assert (snap.planned_s, snap.planned_requests) == (0.01, None)
    assert snap.sent == snap.completed >= 4


def test_the_serving_loop_counts_batches_by_their_requests():
    clock = FakeClock()

    def run_batch(indices: Any) -> float:
        if 1 in indices:
            raise RuntimeError("injected failure")
        clock.advance(0.001)
        return 0.001

    offsets = np.array([0.0, 0.01, 0.02])
    serve_open_loop(offsets, NoBatching(), run_batch, clock)
    snap = LIVE.snapshot()
    assert (snap.sent, snap.completed, snap.failed) == (3, 2, 1)
    assert (snap.planned_s, snap.planned_requests) == (0.02, 3)
    assert snap.lag_s == 0.0  # the fake clock wakes exactly on time


# -- what it looks like -------------------------------------------------------------------


def test_plain_line_names_the_cell_its_window_counts_and_lag():
    reading = Reading(LoadSnapshot(97, 95, 0, 0.0012, 8.1, 10.0, None), at=114.2)
    assert plain_line(view(), reading, now=114.2) == (
        f"[progress] cell 3/12 {CELL_ID}: 14.2 s, window 8.1/10.0 s,"
        " sent 97 completed 95 failed 0, lag 1.20 ms"
    )
    # between readings the window's clock goes on; at the end it stands at the last reading
    later = plain_line(view(), reading, now=115.2)
    assert "15.2 s, window 9.1/10.0 s" in later
    final = plain_line(view(), reading, now=115.2, final=True)
    assert f"cell 3/12 {CELL_ID}: ended after 15.2 s, window 8.1/10.0 s" in final
    failed = plain_line(view(), reading, now=115.2, final=True, outcome="failed")
    assert f"cell 3/12 {CELL_ID}: ended after 15.2 s (failed), window 8.1/10.0 s" in failed
    # a loop that has ended: its window stays, while the cell goes on (summaries, records)
    ended = Reading(LoadSnapshot(120, 120, 0, 0.001, 10.0, 10.0, 120, ended=True), at=116.0)
    assert "20.0 s, window 10.0/10.0 s, sent 120/120" in plain_line(view(), ended, now=120.0)


def test_plain_line_before_any_request_and_without_a_plan():
    nothing = Reading(LoadSnapshot(), at=100.0)
    assert plain_line(view(total=0), nothing, now=103.0) == (
        f"[progress] cell 3 {CELL_ID}: 3.0 s, no requests counted yet"
    )
    open_ended = Reading(LoadSnapshot(5, 5, 0, None, 2.0, None, 40), at=103.0)
    line = plain_line(view(repeat=2, repeats=3), open_ended, now=103.0)
    assert f"cell 3/12 {CELL_ID} (repeat 2/3): 3.0 s, window 2.0 s, sent 5/40" in line
    assert "lag" not in line


def test_plain_display_writes_every_ten_seconds_and_at_the_end():
    now = Now(100.0)
    stream = io.StringIO()
    display = PlainDisplay(Screen(stream, lambda: None, lambda: False), now)
    reading = Reading(LoadSnapshot(1, 1, 0, 0.0, 1.0, 30.0, None), at=100.0)
    for t in np.arange(100.0, 125.0, 1.0):
        now.t = float(t)
        display.show(view(), reading)
    display.end(view(), reading, "")
    lines = stream.getvalue().splitlines()
    assert [line.split(": ")[1].split(",")[0] for line in lines] == [
        "10.0 s",
        "20.0 s",
        "ended after 24.0 s",
    ]
    assert all(line.startswith(f"[progress] cell 3/12 {CELL_ID}") for line in lines)


class FakeReporter:
    """pytest's terminal reporter, as much as the screen uses of it."""

    def __init__(self, column: int) -> None:
        self._tw = SimpleNamespace(width_of_current_line=column)
        self.written: list[str] = []

    def write(self, text: str) -> None:
        self.written.append(text)
        self._tw.width_of_current_line = len(text.rsplit("\n", 1)[-1])

    def flush(self) -> None:
        return None


def test_screen_ends_the_reporters_line_once_and_writes_through_it_when_it_can():
    reporter = FakeReporter(column=27)
    on_main = [False]
    stream = io.StringIO()
    screen = Screen(stream, lambda: reporter, lambda: on_main[0])
    screen.line("one")  # from the sampling thread, while a test's output is captured
    screen.line("two")
    assert stream.getvalue() == "\none\ntwo\n"
    on_main[0] = True
    reporter._tw.width_of_current_line = 28  # the reporter wrote a letter meanwhile
    screen.line("three")
    assert reporter.written == ["\nthree\n"]


def structured(**kw: Any) -> CellView:
    """The view the controller makes of CELL_ID: its workload, engine and parameters."""
    fields = {"workload": "streaming", "engine": "vllm", "params": "load=open level=12"}
    return view(**(fields | kw))


def test_rich_line_renders_the_cell_bar_and_counts():
    console = Console(file=io.StringIO(), width=160, force_terminal=False)
    reading = Reading(LoadSnapshot(97, 95, 1, 0.0012, 8.1, 10.0, 120), at=114.2)
    console.print(rich_line(structured(), reading, now=114.2, width=160))
    heading, line = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert heading == "load=open level=12 · streaming on vllm, cell 3/12"
    assert "8.1/10.0 s  sent 97/120 completed 95 failed 1, lag 1.20 ms  elapsed 14.2 s" in line
    assert "━" in line  # the bar
    narrow = Console(file=io.StringIO(), width=72, force_terminal=False)
    narrow.print(rich_line(structured(), reading, now=114.2, width=72))
    heading, line = narrow.file.getvalue().rstrip("\n").splitlines()  # type: ignore[attr-defined]
    # short of room: the bar goes, then the end of the counts; the cell's name stays whole
    assert heading == "load=open level=12 · streaming on vllm, cell 3/12"
    assert line.startswith("8.1/10.0 s  sent 97/120 completed 95 failed 1, lag 1.20 ms  elap")
    assert "━" not in line
    assert len(line) == 72


def test_on_a_terminal_the_parameters_come_first_and_are_never_cut():
    # issue 35: an 80-column terminal showed "cell 3/12 batching.onnx…", every cell alike
    reading = Reading(LoadSnapshot(97, 95, 1, 0.0012, 8.1, 10.0, 120), at=114.2)
    params = "rate=3500 mode=dynamic batch=8 delay_ms=2"
    cell = view(workload="batching", engine="onnxruntime", params=params, repeat=2, repeats=3)
    for width in (80, 40):
        console = Console(file=io.StringIO(), width=width, force_terminal=False)
        console.print(rich_line(cell, reading, now=114.2, width=width))
        rows = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
        heading = " ".join(" ".join(rows[:-1]).split())
        assert heading.startswith(params), rows
        assert heading.endswith("batching on onnxruntime, cell 3/12 (repeat 2/3)"), rows
        assert heading.count("batching") == 1
        assert "…" not in heading
    # a view that knows only the id (a worker's, a test's) shows the id
    console = Console(file=io.StringIO(), width=80, force_terminal=False)
    console.print(rich_line(view(), reading, now=114.2, width=80))
    assert console.file.getvalue().splitlines()[0] == f"cell 3/12 {CELL_ID}"  # type: ignore[attr-defined]


def test_rich_display_steps_below_the_reporters_line_and_back():
    stream = io.StringIO()
    reporter = FakeReporter(column=27)
    screen = Screen(stream, lambda: reporter, lambda: True)
    display = RichDisplay(screen, Now(101.0), force=True, refresh_hz=4.0)
    display.console.width = 120
    display.show(view(), Reading(LoadSnapshot(4, 3, 0, 0.001, 0.5, 2.0, 10), at=101.0))
    display.pause()
    out = stream.getvalue()
    start = out.index("cell 3/12 streaming.")
    assert out[:start].startswith("\n")  # below the reporter's unfinished line
    assert "sent 4/10 completed 3" in out
    assert out.endswith("\x1b[28G\x1b[1A")  # back after its 27 characters, one line up
    display.pause()  # paused twice: nothing more
    assert stream.getvalue() == out


def test_progress_mode_parses_and_auto_picks_by_terminal():
    assert parse_mode(" Plain") is Mode.PLAIN
    with pytest.raises(UsageError, match="--progress: expected one of auto, rich, plain, off"):
        parse_mode("sometimes")
    assert resolve(Mode.AUTO, isatty=True, term="xterm") is Mode.RICH
    assert resolve(Mode.AUTO, isatty=True, term="dumb") is Mode.PLAIN
    assert resolve(Mode.AUTO, isatty=False, term="xterm") is Mode.PLAIN
    assert resolve(Mode.RICH, isatty=False, term="") is Mode.RICH


def test_a_bad_progress_mode_is_a_usage_error(pytester):
    result = pytester.runpytest("--progress=sometimes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--progress: expected one of auto, rich, plain, off*"])


# -- the controller's view and the worker's sampler ---------------------------------------


class FakeDisplay:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def show(self, view: CellView, reading: Reading) -> None:
        self.calls.append(("show", view.title, reading.load.sent))

    def pause(self) -> None:
        self.calls.append(("pause", "", 0))

    def end(self, view: CellView, reading: Reading, outcome: str) -> None:
        self.calls.append(("end", f"{view.title} {outcome}".strip(), reading.load.sent))

    def close(self) -> None:
        self.calls.append(("close", "", 0))


def fake_run(*nodeids: str) -> SimpleNamespace:
    planned = {
        n: SimpleNamespace(
            cell_id=f"cell-{n[-2]}", workload="w", engine="e", params={"x": n[-2], "y": None}
        )
        for n in nodeids
    }
    return SimpleNamespace(planned=planned, repeat=1, settings=SimpleNamespace(repeats=1))


def report(nodeid: str, when: str, outcome: str = "passed") -> pytest.TestReport:
    return pytest.TestReport(nodeid, ("w.py", 1, nodeid), {}, outcome, None, when)  # type: ignore[arg-type]


def through(wrapper: Generator[None, None, None]) -> None:
    """A hook wrapper, run around a hook that did nothing."""
    next(wrapper)
    with pytest.raises(StopIteration):
        wrapper.send(None)


def test_the_view_numbers_cells_and_shows_only_the_one_in_flight_until_measured():
    display = FakeDisplay()
    state = fake_run("w.py::t[a]", "w.py::t[b]")
    progress = ProgressView(display, lambda: state, sample=False, now=Now())  # type: ignore[arg-type]
    progress.total = 2
    loc = ("w.py", 1, "t")
    progress.pytest_runtest_logstart("w.py::t[a]", loc)
    progress.update({"nodeid": "w.py::t[a]", "sent": 3, "window_s": 0.5})
    progress.update({"nodeid": "w.py::t[b]", "sent": 99})  # not the cell in flight
    through(progress.pytest_runtest_logreport(report("w.py::t[a]", "setup")))
    progress.update({"nodeid": "w.py::t[a]", "sent": 5, "window_s": 1.0})
    through(progress.pytest_runtest_logreport(report("w.py::t[a]", "call")))
    progress.update({"nodeid": "w.py::t[a]", "sent": 6})  # after its measured part
    through(progress.pytest_runtest_logfinish("w.py::t[a]", loc))
    progress.pytest_runtest_logstart("w.py::t[b]", loc)
    through(progress.pytest_runtest_logreport(report("w.py::t[b]", "setup", "skipped")))
    progress.update({"nodeid": "w.py::t[b]", "sent": 1})  # a skipped cell shows nothing
    through(progress.pytest_runtest_logfinish("w.py::t[b]", loc))
    progress.pytest_runtest_logstart("w.py::t[a]", loc)  # handed to a fresh worker
    progress.update({"nodeid": "w.py::t[a]", "sent": 2})
    progress.pytest_sessionfinish()  # interrupted: no logfinish comes
    progress.update({"nodeid": "w.py::t[a]", "sent": 3})
    assert display.calls == [
        ("show", "cell 1/2 cell-a", 3),
        ("pause", "", 0),
        ("show", "cell 1/2 cell-a", 5),
        ("pause", "", 0),
        ("pause", "", 0),
        ("end", "cell 1/2 cell-a", 5),
        ("pause", "", 0),
        ("pause", "", 0),
        ("end", "cell 2/2 cell-b skipped", 0),
        ("show", "cell 1/2 cell-a", 2),
        ("pause", "", 0),
    ]


def test_the_view_names_the_cell_by_its_parameters_first_for_the_terminal():
    display = FakeDisplay()
    state = fake_run("w.py::t[a]")
    progress = ProgressView(display, lambda: state, sample=False, now=Now())  # type: ignore[arg-type]
    progress.total = 4
    progress.pytest_runtest_logstart("w.py::t[a]", ("w.py", 1, "t"))
    assert progress.view is not None
    assert progress.view.heading == "x=a y=none · w on e, cell 1/4"
    assert progress.view.title == "cell 1/4 cell-a"  # a log line keeps the whole id


def test_in_process_the_view_samples_the_counters_itself():
    display = FakeDisplay()
    state = fake_run("w.py::t[a]")
    progress = ProgressView(display, lambda: state, sample=True)  # type: ignore[arg-type]
    progress.ticker.interval_s = 0.01  # type: ignore[union-attr]
    progress.pytest_runtest_logstart("w.py::t[a]", ("w.py", 1, "t"))
    LIVE.begin_window(1.0, 10)
    LIVE.sent = 7
    deadline = time.monotonic() + 5.0
    while ("show", "cell 1 cell-a", 7) not in display.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    progress.pytest_unconfigure()
    assert ("show", "cell 1 cell-a", 7) in display.calls
    assert display.calls[-1] == ("close", "", 0)


def test_the_worker_sends_its_cells_counters_and_a_last_reading_before_its_report():
    sent: list[tuple[str, dict[str, Any]]] = []
    sink = SimpleNamespace(send=lambda kind, **data: sent.append((kind, data)))
    sampler = WorkerSampler(lambda: SimpleNamespace(sink=sink), interval_s=3600.0)  # type: ignore[arg-type, return-value]
    sampler.pytest_runtest_logstart("w.py::t[a]", ("w.py", 1, "t"))
    LIVE.begin_window(2.0, 10)
    LIVE.sent, LIVE.completed = 10, 9
    sampler.pytest_runtest_logreport(report("w.py::t[a]", "setup"))
    assert sent == []  # readings go once a second; only the measured part's end is sent at once
    sampler.pytest_runtest_logreport(report("w.py::t[a]", "call"))
    sampler.send()  # a tick after the cell's measured part: nothing
    sampler.pytest_unconfigure()
    assert len(sent) == 1
    kind, data = sent[0]
    assert kind == "progress"
    assert data["nodeid"] == "w.py::t[a]"
    assert (data["sent"], data["completed"], data["planned_requests"]) == (10, 9, 10)


# -- real runs ----------------------------------------------------------------------------

RUN = ("--engine=onnxruntime", "--window=1.2")
"""Cells just over a second: the sampler's first reading comes a second into a cell."""
ROWS, COLUMNS = 40, 160


@dataclass(frozen=True)
class Output:
    returncode: int
    text: str


@pytest.fixture(scope="module")
def real_runs(request: pytest.FixtureRequest) -> dict[str, Output]:
    return once(request, _real_runs)


def _real_runs(tmp: Path) -> dict[str, Output]:
    """Two real quick runs at once (to keep the suite short): two cells in workers into a
    log, and one cell in-process on a pseudo-terminal."""
    base = [sys.executable, "-m", "pytest", str(REPO / "workloads"), "-p", "no:cacheprovider"]
    log = tmp / "log.txt"
    with log.open("w") as out:
        in_log = subprocess.Popen(
            [
                *base,
                f"--results-dir={tmp / 'log'}",
                *RUN,
                "-k",
                "test_batching and rate100-n or rate100-s",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=_env(tmp / "log-cache"),
        )
        args = [*base, f"--results-dir={tmp / 'tty'}", *RUN, "-k", "test_batching and rate100-none"]
        # in-process: the view's own sampler (the log run covers the workers' events)
        on_tty = run_in_pty([*args, "--isolation=none"], _env(tmp / "tty-cache"))
        in_log.wait(timeout=300)
    return {"log": Output(in_log.returncode, log.read_text()), "tty": on_tty}


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "HARNESS_CACHE_DIR": os.environ.get("HARNESS_CACHE_DIR") or str(cache)}


def run_in_pty(args: list[str], env: dict[str, str], timeout_s: float = 300.0) -> Output:
    """``args`` on a pseudo-terminal of ``COLUMNS`` columns: its exit status and output."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    proc = subprocess.Popen(
        args,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        cwd=REPO,
        env={**env, "TERM": "xterm-256color"},
    )
    os.close(terminal)
    out = bytearray()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 0.2)
        if not ready:
            continue
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the terminal closed, every writer has exited
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=10)
    os.close(controller)
    return Output(proc.returncode, out.decode("utf-8", "replace"))


@pytest.mark.slow
def test_a_run_into_a_log_prints_plain_progress_lines(real_runs):
    run = real_runs["log"]
    assert run.returncode in (0, 10), run.text[-3000:]
    lines = [line for line in run.text.splitlines() if line.startswith("[progress] ")]
    assert len(lines) == 2, run.text[-3000:]
    for n, mode in ((1, "none"), (2, "static")):
        cell = f"batching.onnxruntime.rate=100.mode={mode}"
        line = next(line for line in lines if cell in line)
        assert line.startswith(f"[progress] cell {n}/2 {cell}"), line
        # the window and the counts came from the worker, over its events pipe
        assert "ended after" in line, line
        assert re.search(r"window 1\.\d/1\.\d s, sent \d+/\d+ completed \d+ failed 0, lag", line)
    assert "\x1b[" not in run.text  # no terminal codes in a log


@pytest.mark.slow
def test_a_run_on_a_terminal_shows_richs_live_display(real_runs):
    run = real_runs["tty"]
    assert run.returncode in (0, 10), run.text[-3000:]
    # the parameters first, whole; the workload once
    heading = "rate=100 mode=none batch=1 delay_ms=none · batching on onnxruntime, cell 1/1"
    assert heading in run.text, run.text[-3000:]
    assert "\x1b[?25l" in run.text  # rich hid the cursor ...
    assert "\x1b[?25h" in run.text  # ... and gave it back
    assert "━" in run.text  # the bar
    assert re.search(r"\d\.\d/1\.\d s  sent \d+/\d+ completed \d+ failed 0", run.text)
    assert "[progress]" not in run.text  # no plain lines on a terminal
