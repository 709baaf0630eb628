"""Each cell's record, written from pytest's reports once its outcome is known: after
setup when setup did not pass, else after the call; on Ctrl-C or SIGTERM, as failed. A
cell that asks for a fresh engine instance is requeued to a fresh worker instead."""

from __future__ import annotations

import contextlib

import pytest

from harness.engine import is_fatal
from harness.results import store
from harness.results.records import Status
from harness.session import failtext, stash
from harness.session.pool import NewEngineInstance
from harness.session.state import RunState, is_cell
from harness.session.worker import WorkerSession

NO_RESULT = "the workload ended without reporting a result (Cell.finish was never called)"


def record_interrupted(item: pytest.Item, exc: KeyboardInterrupt) -> None:
    """Ctrl-C or SIGTERM during an in-process cell: its record says failed, and why."""
    state = item.config.stash.get(stash.RUN, None)
    if state is None or not is_cell(item) or item.stash.get(stash.RECORDED, False):
        return
    why = str(exc) or "SIGINT (Ctrl-C)"
    cell = item.stash.get(stash.CELL, None) or state.new_cell(state.planned[item.nodeid])
    reason = f"interrupted by {why}; the run stopped here (finish it with --resume)"
    with contextlib.suppress(Exception):  # the interrupt must win over a full disk
        state.write(cell, Status.FAILED, [reason])


def record_report(item: pytest.Item, rep: pytest.TestReport, call: pytest.CallInfo[None]) -> None:
    """A failure in teardown (closing an engine) does not change the measured result; it
    is an incident of the run and a pytest error."""
    state = item.config.stash.get(stash.RUN, None)
    if state is None or not is_cell(item):
        return
    if call.excinfo is not None and isinstance(call.excinfo.value, NewEngineInstance):
        _requeue(item)
        return
    if rep.when == "call" or (rep.when == "setup" and not rep.passed):
        _record(item, state, rep, call)
        if stash.WORKER not in item.config.stash:  # a worker's log keeps its tracebacks
            failtext.shorten_in_process(rep, state.run_dir / store.LOGS)
    elif rep.when == "teardown" and rep.failed:
        state.incident(f"{item.nodeid}: {_why(rep)}")


def _requeue(item: pytest.Item) -> None:
    session = item.config.pluginmanager.get_plugin("harness-worker")
    if not isinstance(session, WorkerSession):
        raise RuntimeError("a fresh engine instance was requested outside a worker")
    item.stash[stash.RECORDED] = True  # the fresh worker records it
    session.requeue(item, "it needs another engine configuration than the cells before it")


def _record(
    item: pytest.Item, state: RunState, rep: pytest.TestReport, call: pytest.CallInfo[None]
) -> None:
    cell = item.stash.get(stash.CELL, None) or state.new_cell(state.planned[item.nodeid])
    sampler = item.stash.get(stash.TELEMETRY, None)
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
    item.stash[stash.RECORDED] = True


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
