"""The worker side of process isolation.

A worker is a pytest session started by the controller (harness.isolation) with the
same arguments plus a spec file: it collects the same tests, keeps only the cells the
spec lists, in that order, runs them, and reports every step over an events pipe. It
writes the records of the cells it finishes itself; the controller writes the records
of cells a worker could not finish (crashed, timed out, interrupted).
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pytest

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker is asked to do; written by the controller, read once by the worker."""

    run_dir: Path
    nodeids: tuple[str, ...]
    attempt: int

    def dump(self, path: Path) -> None:
        data = {
            "run_dir": str(self.run_dir),
            "nodeids": list(self.nodeids),
            "attempt": self.attempt,
        }
        path.write_text(json.dumps(data))

    @classmethod
    def load(cls, path: Path) -> WorkerSpec:
        data = json.loads(path.read_text())
        return cls(Path(data["run_dir"]), tuple(data["nodeids"]), data["attempt"])


class EventSink:
    """JSON lines to the controller; a vanished controller ends the worker."""

    def __init__(self, fd: int) -> None:
        self._out: TextIO = os.fdopen(fd, "w", buffering=1, encoding="utf-8")

    def send(self, kind: str, **data: Any) -> None:
        try:
            self._out.write(json.dumps({"ev": kind, **data}, default=str) + "\n")
        except BrokenPipeError:
            os._exit(3)  # nobody is listening: finishing the cell would be wasted work


def _die_with_parent() -> None:
    """An orphaned worker would keep an engine busy on cores the next run measures on."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the broken events pipe still ends it
        pass


def become_worker() -> None:
    """Process-level set-up: stacks on SIGUSR1 (asked for before a hung worker is killed)
    and on fatal signals, into the output the controller keeps."""
    _die_with_parent()
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


class WorkerSession:
    """Pytest hooks of a worker: select the spec's cells and report each step."""

    def __init__(self, config: pytest.Config, spec: WorkerSpec, sink: EventSink) -> None:
        self.config = config
        self.spec = spec
        self.sink = sink
        self.requeued: set[str] = set()

    def requeue(self, item: pytest.Item, why: str) -> None:
        """Hand ``item`` back to the controller for a fresh worker and stop after it; its
        reports here are not forwarded (for the controller it has not run yet)."""
        self.requeued.add(item.nodeid)
        self.sink.send("requeue", nodeid=item.nodeid, why=why)
        item.session.shouldstop = f"handing {item.nodeid} to a fresh worker: {why}"

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        by_id = {item.nodeid: item for item in items}
        keep = [by_id[n] for n in self.spec.nodeids if n in by_id]
        chosen = {id(i) for i in keep}
        config.hook.pytest_deselected(items=[i for i in items if id(i) not in chosen])
        items[:] = keep

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        found = {item.nodeid for item in session.items}
        self.sink.send("ready", missing=[n for n in self.spec.nodeids if n not in found])

    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        self.sink.send("logstart", nodeid=nodeid, location=location)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid in self.requeued:
            return
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self.sink.send("report", data=data)

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        if nodeid in self.requeued:
            return
        self.sink.send("logfinish", nodeid=nodeid, location=location)
