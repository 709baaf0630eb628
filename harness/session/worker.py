"""The worker side of process isolation.

A worker is a pytest session started by the controller (harness.session.isolation) with the
same options plus a spec file (``worker_argv``): it collects exactly the files of the
cells the spec lists, under the controller's rootdir and config file (so every cell has
the same node id in both), keeps those cells, in that order, runs them, and reports
every step over an events pipe, collection errors included. It writes the records of
the cells it finishes itself; the controller writes the records of cells a worker could
not finish (crashed, timed out, interrupted, not collected).
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

import pytest

PR_SET_PDEATHSIG = 1


CONTROLLER_ONLY = frozenset(
    {
        "--lf",
        "--last-failed",
        "--ff",
        "--failed-first",
        "--nf",
        "--new-first",
        "--cache-clear",
        "--sw",
        "--stepwise",
        "--sw-skip",
        "--stepwise-skip",
        "--sw-reset",
        "--stepwise-reset",
    }
)
"""Options that choose or order the controller's tests from pytest's cache: a session
started for some of its cells runs exactly those, without the cache (the controller's)."""
CONTROLLER_ONLY_WITH_VALUE = frozenset({"--lfnf", "--last-failed-no-failures"})
COLLECTION_ERROR_CHARS = 3000


Drop = Literal["flag", "option"] | None
"""What to drop of a command-line option: the flag alone, the option with its value (the
next token unless given as ``--name=value``), or nothing."""


def drop_options(args: Sequence[str], drop: Callable[[str], Drop]) -> list[str]:
    """``args`` without the options ``drop`` names (by their ``--name``)."""
    out: list[str] = []
    skip_value = False
    for token in args:
        if skip_value:
            skip_value = False
            if not token.startswith("-"):
                continue
        name, eq, _ = token.partition("=")
        what = drop(name)
        if what is None:
            out.append(token)
        else:
            skip_value = what == "option" and not eq
    return out


def rerun_args(config: pytest.Config) -> list[str]:
    """The controller's arguments for another session of the same run (a worker, a Ray
    node): without the options only the controller's session may act on, and with its
    rootdir and config file pinned. Without the pin, an option value such as ``--lf`` or a
    path elsewhere could move the other session's rootdir: its node ids would then differ
    and it would collect none of the cells it was given."""

    def controller_only(name: str) -> Drop:
        if name in CONTROLLER_ONLY:
            return "flag"
        return "option" if name in CONTROLLER_ONLY_WITH_VALUE else None

    out = drop_options(config.invocation_params.args, controller_only)
    out.append(f"--rootdir={config.rootpath}")
    if config.inipath is not None:
        out.append(f"--config-file={config.inipath}")
    return out


def worker_argv(config: pytest.Config, spec_path: Path) -> list[str]:
    """How the controller starts a worker for the cells of ``spec_path``."""
    return [
        sys.executable,
        "-m",
        "pytest",
        *rerun_args(config),
        "-p",
        "no:cacheprovider",
        "--capture=no",
        "-q",
        "--maxfail=0",
        # A file that fails to collect costs its own cells (reported with the error),
        # not the cells of the other files this worker was given.
        "--continue-on-collection-errors",
        f"--harness-worker={spec_path}",
    ]


def collect_paths(session: pytest.Session, paths: Sequence[Path]) -> None:
    """Collect exactly ``paths`` (the files of the cells to run), whatever paths the
    command line named: a controller run with no path would otherwise collect the
    project's own tests too in a session whose rootdir pytest chose elsewhere."""
    session.perform_collect([str(p) for p in dict.fromkeys(paths)])


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker is asked to do; written by the controller, read once by the worker.

    ``paths``: the files that hold the cells, collected instead of the command line's."""

    run_dir: Path
    nodeids: tuple[str, ...]
    attempt: int
    paths: tuple[Path, ...] = ()
    repeat: int = 1

    def dump(self, path: Path) -> None:
        data = {
            "run_dir": str(self.run_dir),
            "nodeids": list(self.nodeids),
            "attempt": self.attempt,
            "paths": [str(p) for p in self.paths],
            "repeat": self.repeat,
        }
        path.write_text(json.dumps(data))

    @classmethod
    def load(cls, path: Path) -> WorkerSpec:
        data = json.loads(path.read_text())
        paths = tuple(Path(p) for p in data.get("paths", ()))
        return cls(
            Path(data["run_dir"]),
            tuple(data["nodeids"]),
            data["attempt"],
            paths,
            int(data.get("repeat", 1)),
        )


class EventSink:
    """JSON lines to the controller; a vanished controller ends the worker."""

    def __init__(self, fd: int) -> None:
        self._out: TextIO = os.fdopen(fd, "w", buffering=1, encoding="utf-8")
        # the progress sampler sends from a thread of its own: one whole line at a time
        self._lock = threading.Lock()

    def send(self, kind: str, **data: Any) -> None:
        line = json.dumps({"ev": kind, **data}, default=str) + "\n"
        try:
            with self._lock:
                self._out.write(line)
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
        self.collection_errors: list[dict[str, str]] = []

    def requeue(self, item: pytest.Item, why: str) -> None:
        """Hand ``item`` back to the controller for a fresh worker and stop after it; its
        reports here are not forwarded (for the controller it has not run yet)."""
        self.requeued.add(item.nodeid)
        self.sink.send("requeue", nodeid=item.nodeid, why=why)
        item.session.shouldstop = f"handing {item.nodeid} to a fresh worker: {why}"

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> bool | None:
        if not self.spec.paths:  # a spec from an older controller: the command line's
            return None
        collect_paths(session, self.spec.paths)
        return True

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            text = report.longreprtext.strip() or "collection failed"
            self.collection_errors.append(
                {"nodeid": report.nodeid, "text": text[-COLLECTION_ERROR_CHARS:]}
            )

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
        self.sink.send(
            "ready",
            missing=[n for n in self.spec.nodeids if n not in found],
            errors=self.collection_errors,
        )

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
