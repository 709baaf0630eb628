"""Process isolation, controller side: cells run in spawned workers, never in the controller.

The cells of one engine run, in order, in one worker process (harness.session.worker), so that
load generator and engine share a process and measurement costs nothing extra. The
controller replays the worker's reports to pytest and watches it:

* a worker that dies with a cell in flight (signal, exit, out of memory) leaves that
  cell ``crashed`` with the tail of its output; a cell past its deadline is ``timeout``
  (the worker is asked for its stacks, then killed). Either way the worker is restarted
  for the engine's remaining cells, at most ``max_restarts`` times; after that they are
  ``failed`` with the reason, so nothing is silently dropped;
* the deadline of a cell excludes engine loading, which has its own (``load_timeout``);
* Ctrl-C or SIGTERM stops the worker and records the cell in flight as ``failed``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import psutil
import pytest

from harness.results.records import Status
from harness.results.store import LOGS
from harness.session import failtext, liveprogress
from harness.session.child import Child, Event, describe_exit, spawn
from harness.session.execution import Reliability
from harness.session.worker import WorkerSpec, worker_argv

POLL_S = 0.5
MEMORY_SHARE = 0.9  # default worker limit: act before the kernel's OOM killer picks a victim
NORMAL_EXITS = (0, 1)  # pytest: all passed / some failed; anything else is abnormal
STOPPED = 2  # pytest's "interrupted": normal when the worker stopped itself on purpose


class Recorder(Protocol):
    """What the controller needs from the plugin's run state."""

    def note(self, cell_id: str, status: Status, repeat: int = 1) -> None: ...

    def lost(
        self, item: pytest.Item, status: Status, reasons: list[str], tail: Sequence[str]
    ) -> bool:
        """Write the record of a cell its worker could not finish; False if one exists."""
        ...

    def incident(self, text: str) -> None: ...

    def fatal(self, text: str) -> None: ...


@dataclass(frozen=True)
class Group:
    engine: str | None  # None: not a cell, runs in the controller
    items: tuple[pytest.Item, ...]


def groups(
    items: Sequence[pytest.Item], engine_of: Callable[[pytest.Item], str | None]
) -> Iterator[Group]:
    """Consecutive items of the same engine form one group (items come sorted by engine)."""
    run: list[pytest.Item] = []
    current: str | None = None
    for item in items:
        engine = engine_of(item)
        if run and engine != current:
            yield Group(current, tuple(run))
            run = []
        current = engine
        run.append(item)
    if run:
        yield Group(current, tuple(run))


@dataclass
class Attempt:
    """What one worker process got through."""

    finished: set[str] = field(default_factory=set)
    lost: pytest.Item | None = None
    status: Status | None = None
    reason: str = ""
    abnormal: str = ""
    fatal: bool = False
    never_ready: bool = False
    requeued: bool = False
    recycled: bool = False  # the worker stopped itself after a crash-like error
    tail: tuple[str, ...] = ()
    started: float | None = None


def _last_failure(attempt: Attempt) -> str:
    if attempt.abnormal:
        return attempt.abnormal
    if attempt.lost is not None:
        return f"{attempt.reason} ({attempt.lost.nodeid})"
    return "the worker restarted itself after a crash-like error in a cell"


@dataclass
class InFlight:
    item: pytest.Item
    started: float
    recorded: bool = False


class Supervisor:
    """Runs the groups of one session in workers; one worker alive at a time."""

    def __init__(
        self,
        session: pytest.Session,
        recorder: Recorder,
        limits: Reliability,
        *,
        run_dir: Path,
        attempt: int,
        cell_timeout_s: float,
    ) -> None:
        self.session = session
        self.config = session.config
        self.recorder = recorder
        self.limits = limits
        self.cell_timeout_s = cell_timeout_s
        self.run_dir = run_dir
        self.attempt_no = attempt
        self.memory_limit = limits.worker_memory_bytes or int(
            psutil.virtual_memory().total * MEMORY_SHARE
        )
        self.spawned = 0
        self.repeat = 1
        """The repeat (``--repeats``) the next workers measure; each pass has its own."""
        self.log = run_dir / LOGS
        # Worker specs are instructions, not results: they stay out of the results directory.
        self.scratch = Path(tempfile.mkdtemp(prefix="harness-workers-"))

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

    # -- one group ---------------------------------------------------------------
    def run_group(self, engine: str, items: Sequence[pytest.Item]) -> None:
        remaining = list(items)
        restarts = 0
        while remaining and not self._stopping():
            attempt = self._run_worker(engine, remaining)
            remaining = [i for i in remaining if i.nodeid not in attempt.finished]
            if attempt.fatal:
                return
            if attempt.never_ready:
                self._give_up(engine, remaining, attempt.abnormal, attempt.tail)
                return
            if attempt.lost is not None:
                self._lose(
                    attempt.lost,
                    attempt.status or Status.CRASHED,
                    attempt.reason,
                    attempt.tail,
                    attempt.started,
                )
                remaining = [i for i in remaining if i is not attempt.lost]
            if attempt.abnormal:
                self.recorder.incident(attempt.abnormal)
            if not (attempt.lost or attempt.abnormal or attempt.recycled):
                continue
            restarts += 1
            if remaining and restarts > self.limits.max_restarts:
                self._give_up(
                    engine,
                    remaining,
                    f"the {engine} worker failed {restarts} times, over the restart cap"
                    f" (--max-restarts={self.limits.max_restarts}); the last time: "
                    + _last_failure(attempt),
                    attempt.tail,
                )
                return

    def _stopping(self) -> bool:
        return bool(self.session.shouldstop or self.session.shouldfail)

    def _give_up(
        self, engine: str, items: Sequence[pytest.Item], why: str, tail: Sequence[str]
    ) -> None:
        reason = f"not run: {why}"
        for item in items:
            self._start(item)
            self._lose(item, Status.FAILED, reason, tail=tail)

    # -- one worker --------------------------------------------------------------
    def _argv(self, spec_path: Path) -> list[str]:
        return worker_argv(self.config, spec_path)

    def _spawn(self, engine: str, items: Sequence[pytest.Item]) -> Child:
        self.spawned += 1
        logs = self.run_dir / LOGS
        with contextlib.suppress(OSError):  # a full disk is reported by the record writes
            logs.mkdir(exist_ok=True)
        again = f"-repeat{self.repeat}" if self.repeat > 1 else ""
        stem = f"attempt{self.attempt_no}{again}-worker{self.spawned}-{engine}"
        spec_path = self.scratch / f"{stem}.spec.json"
        WorkerSpec(
            self.run_dir,
            tuple(i.nodeid for i in items),
            self.attempt_no,
            tuple(i.path for i in items),
            self.repeat,
        ).dump(spec_path)
        self.log = logs / f"{stem}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        return spawn(self._argv(spec_path), self.config.invocation_params.dir, env, self.log)

    def _run_worker(self, engine: str, items: Sequence[pytest.Item]) -> Attempt:
        child = self._spawn(engine, items)
        watch = Watch(self, child, {i.nodeid: i for i in items})
        try:
            return watch.run()
        except KeyboardInterrupt as exc:
            child.kill()
            if watch.flight is not None and not watch.flight.recorded:
                why = str(exc) or "SIGINT (Ctrl-C)"
                self._lose(
                    watch.flight.item,
                    Status.FAILED,
                    f"interrupted by {why} after {time.monotonic() - watch.flight.started:.1f} s;"
                    " the run stopped here (finish it with --resume)",
                    started=watch.flight.started,
                )
            raise
        finally:
            child.close()

    # -- reporting ---------------------------------------------------------------
    def _start(self, item: pytest.Item) -> None:
        self.config.hook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)

    def _lose(
        self,
        item: pytest.Item,
        status: Status,
        reason: str,
        tail: Sequence[str] = (),
        started: float | None = None,
    ) -> None:
        """Record and report a cell its worker did not finish."""
        written = self.recorder.lost(item, status, [reason], tail)
        when: Literal["call", "teardown"] = "call" if written else "teardown"
        if not written:  # the cell's record was written before the worker died
            self.recorder.incident(f"{item.nodeid}: after its record was written: {reason}")
        text = f"{status.value.upper()}: {reason}"
        if tail:
            text += "\n--- last lines of the worker's output ---\n" + "\n".join(tail)
        report = pytest.TestReport(
            nodeid=item.nodeid,
            location=item.location,
            keywords={},
            outcome="failed",
            longrepr=text,
            when=when,
            duration=time.monotonic() - started if started is not None else 0.0,
        )
        self.config.hook.pytest_runtest_logreport(report=report)
        self.config.hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


class Watch:
    """Follows one worker's events until it exits, enforcing deadlines and memory."""

    def __init__(self, sup: Supervisor, child: Child, items: dict[str, pytest.Item]) -> None:
        self.sup = sup
        self.child = child
        self.items = items
        self.limits = sup.limits
        self.attempt = Attempt()
        self.flight: InFlight | None = None
        self.deadline = time.monotonic() + self.limits.load_timeout_s
        self.phase = "starting the worker"
        self.loading_since: float | None = None
        self.paused_deadline = 0.0
        self.ready = False

    def run(self) -> Attempt:
        while True:
            now = time.monotonic()
            event = self.child.next_event(min(POLL_S, self.deadline - now))
            if event is None:
                if self._check_limits():
                    return self.attempt
                continue
            if event.kind == "exit":
                self._exited()
                return self.attempt
            self._handle(event)
            if self.attempt.fatal:
                self.child.kill()
                return self.attempt

    # -- limits --------------------------------------------------------------------
    def _check_limits(self) -> bool:
        now = time.monotonic()
        if now >= self.deadline:
            loading = self.flight is None or self.loading_since is not None
            limit = self.limits.load_timeout_s if loading else self.sup.cell_timeout_s
            self.child.dump_stacks()
            self.child.kill()
            self._fail(
                Status.TIMEOUT,
                f"timeout: {self.phase} took over {limit:g} s (--cell-timeout"
                f" {self.sup.cell_timeout_s:g} s, --load-timeout"
                f" {self.limits.load_timeout_s:g} s); worker stopped",
            )
            return True
        rss = self.child.rss_bytes()
        if rss > self.sup.memory_limit:
            self.child.kill()
            self._fail(
                Status.CRASHED,
                f"out of memory: the worker's processes held {rss / 2**30:.2f} GiB, over the"
                f" limit of {self.sup.memory_limit / 2**30:.2f} GiB (--worker-memory);"
                " worker killed",
            )
            return True
        return False

    def _fail(self, status: Status, reason: str) -> None:
        self.child.wait()
        self.child.close()
        self.attempt.tail = tuple(self.child.tail)
        if self.flight is not None:  # recorded or not: _lose tells the two apart
            self._lost(self.flight, status, reason)
            return
        self.attempt.never_ready = not self.ready
        self.attempt.abnormal = f"{reason}; last output:\n" + "\n".join(self.child.tail)

    def _lost(self, flight: InFlight, status: Status, reason: str) -> None:
        self.attempt.lost = flight.item
        self.attempt.status = status
        self.attempt.reason = reason
        self.attempt.started = flight.started

    def _exited(self) -> None:
        code = self.child.wait()
        self.child.close()
        self.attempt.tail = tuple(self.child.tail)
        what = describe_exit(code)
        flight = self.flight
        if flight is not None:
            self._lost(flight, Status.CRASHED, f"the worker died ({what}) while {self.phase}")
        elif not self.ready:
            self.attempt.never_ready = True
            self.attempt.abnormal = f"the worker failed to start ({what}); last output: " + (
                " | ".join(list(self.child.tail)[-8:])
            )
        elif code not in NORMAL_EXITS and not (code == STOPPED and self._stopped_itself()):
            self.attempt.abnormal = (
                f"the worker ended abnormally ({what}) while {self.phase}; last output:\n"
                + "\n".join(self.child.tail)
            )
        elif set(self.items) - self.attempt.finished and not self._stopped_itself():
            self.attempt.abnormal = f"the worker stopped early ({what}) while {self.phase}"

    # -- events --------------------------------------------------------------------
    def _handle(self, event: Event) -> None:
        handler = getattr(self, f"_on_{event.kind}", None)
        if handler is not None:
            handler(event.data)

    def _on_ready(self, data: dict[str, Any]) -> None:
        self.ready = True
        missing = [n for n in data.get("missing") or [] if n in self.items]
        if missing:
            reason = self._not_collected(data.get("errors") or [])
            for nodeid in missing:
                self.sup._start(self.items[nodeid])
                self.sup._lose(self.items[nodeid], Status.FAILED, reason, tuple(self.child.tail))
                self.attempt.finished.add(nodeid)  # it cannot run in any worker either
        self.phase = "waiting for the first cell"

    def _not_collected(self, errors: list[dict[str, str]]) -> str:
        """Why a worker has no such cell, in the worker's own words where it has any."""
        log = f"the worker's log: {self.sup.log}"
        if not errors:
            return (
                "not run: the worker collected no test with this node id (parametrization"
                f" that differs between processes?); {log}"
            )
        detail = "\n".join(
            f"{e.get('nodeid') or '<session>'}:\n{e.get('text', '')}" for e in errors
        )
        return f"not run: the worker could not collect it ({log}):\n{detail}"

    def _on_logstart(self, data: dict[str, Any]) -> None:
        item = self.items[data["nodeid"]]
        self.flight = InFlight(item, time.monotonic())
        self.deadline = time.monotonic() + self.sup.cell_timeout_s
        self.phase = f"running {item.nodeid}"
        self.sup._start(item)

    def _on_load(self, data: dict[str, Any]) -> None:
        now = time.monotonic()
        if data.get("state") == "begin":
            self.loading_since = now
            self.paused_deadline = self.deadline
            self.deadline = now + self.limits.load_timeout_s
            self.phase = f"loading {data.get('engine', 'the engine')}"
        elif self.loading_since is not None:
            self.deadline = self.paused_deadline + (now - self.loading_since)
            self.loading_since = None
            self.phase = f"running {self.flight.item.nodeid}" if self.flight else "between cells"

    def _on_report(self, data: dict[str, Any]) -> None:
        config = self.sup.config
        report = config.hook.pytest_report_from_serializable(config=config, data=data["data"])
        if isinstance(report.longrepr, list):  # JSON has no tuples; a skip's (path, line, why)
            report.longrepr = tuple(report.longrepr)
        failtext.shorten(report, f"the worker's log, {self.sup.log}")
        config.hook.pytest_runtest_logreport(report=report)

    def _on_record(self, data: dict[str, Any]) -> None:
        self.sup.recorder.note(
            data["cell_id"], Status(data["status"]), int(data.get("repeat", self.sup.repeat))
        )
        if self.flight is not None:
            self.flight.recorded = True

    def _on_logfinish(self, data: dict[str, Any]) -> None:
        self.attempt.finished.add(data["nodeid"])
        self.sup.config.hook.pytest_runtest_logfinish(
            nodeid=data["nodeid"], location=tuple(data["location"])
        )
        self.flight = None
        self.deadline = time.monotonic() + self.limits.load_timeout_s
        self.phase = "between cells (closing or starting an engine)"

    def _stopped_itself(self) -> bool:
        return self.attempt.requeued or self.attempt.recycled

    def _on_recycle(self, data: dict[str, Any]) -> None:
        self.attempt.recycled = True

    def _on_requeue(self, data: dict[str, Any]) -> None:
        """The worker hands the cell back: its next engine instance gets a fresh process."""
        self.attempt.requeued = True
        self.flight = None
        self.deadline = time.monotonic() + self.limits.load_timeout_s
        self.phase = f"closing before {data['nodeid']} moves to a fresh worker"

    def _on_progress(self, data: dict[str, Any]) -> None:
        liveprogress.forward(self.sup.config, data)

    def _on_note(self, data: dict[str, Any]) -> None:
        liveprogress.say(self.sup.config, str(data.get("text", "")))

    def _on_incident(self, data: dict[str, Any]) -> None:
        self.sup.recorder.incident(str(data.get("text", "")))

    def _on_fatal(self, data: dict[str, Any]) -> None:
        self.sup.recorder.fatal(str(data.get("text", "")))
        self.attempt.fatal = True
