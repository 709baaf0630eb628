"""A cell the engine could not serve fails in one line on the terminal.

An endpoint that refuses connections, or an engine that failed to load for an earlier cell,
raises ``EngineError`` through httpx, asyncio and the harness's fixtures: pytest's report
of it ran to about 90 lines per cell, the same for every cell of the engine. The record
keeps the message; the terminal gets that message once per cell and where the traceback
is: the worker's log (process isolation; the worker prints it there as pytest does), or,
in process, ``logs/in-process.log`` of the run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.exceptions import EngineError
from harness.results.redact import redact_text

ENGINE_ERROR = f"{EngineError.__module__}.{EngineError.__qualname__}: "
IN_PROCESS_LOG = "in-process.log"


def engine_failure(report: pytest.TestReport) -> str | None:
    """The message of a failure the engine raised (an ``EngineError``), else None."""
    if not report.failed:
        return None
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    if isinstance(message, str) and message.startswith(ENGINE_ERROR):
        return message.removeprefix(ENGINE_ERROR)
    return None


def shorten(report: pytest.TestReport, where: str) -> bool:
    """Replace the traceback of an engine's failure with one line naming ``where`` it is.
    True where the report was shortened."""
    message = engine_failure(report)
    if message is None:
        return False
    report.longrepr = f"the engine could not serve this cell: {message} (traceback: {where})"
    return True


def shorten_in_process(report: pytest.TestReport, logs: Path) -> None:
    """In process there is no worker log: the traceback goes to the run's own."""
    if engine_failure(report) is None:
        return
    log = logs / IN_PROCESS_LOG
    try:
        logs.mkdir(parents=True, exist_ok=True)
        with log.open("a", encoding="utf-8") as out:
            out.write(f"{report.nodeid} ({report.when}):\n{redact_text(report.longreprtext)}\n\n")
    except OSError as exc:  # nowhere to keep it: keep the traceback on the terminal
        report.sections.append(("harness", f"could not write {log}: {exc}"))
        return
    shorten(report, str(log))
