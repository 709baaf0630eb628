"""Lines for the user's terminal from code that holds no pytest config: an embedded
model built on first use says, once, what it cost (seconds, disk).

Each session installs where the lines go (``install``): a worker sends them to its
controller as "note" events, since its own output goes to a log nobody watches; the
controller, or a session that runs its cells in process, writes them through pytest's
terminal reporter, with capture suspended (an in-process cell runs captured) and a live
progress display stepped aside first (it redraws at its next reading). Outside a
harness session (a script, a test of the harness) they go to stderr.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

import pytest

from harness.results.redact import redact_text

Say = Callable[[str], None]

_SAY: list[Say] = []
"""The installed destination (at most one: the session's)."""


def announce(text: str) -> None:
    """Show ``text`` (one line) to the user running the harness."""
    say = _SAY[-1] if _SAY else to_stderr
    say(redact_text(text))


def to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class _Installed:
    """Uninstalls at the end of its session: pytest run in process (pytester) may start
    another session, whose config this one's destination must not outlive."""

    def __init__(self, say: Say) -> None:
        self.say = say

    def pytest_unconfigure(self) -> None:
        if self.say in _SAY:
            _SAY.remove(self.say)


def install(config: pytest.Config, say: Say) -> None:
    _SAY[:] = [say]
    config.pluginmanager.register(_Installed(say), "harness-announce")


def to_terminal(config: pytest.Config, text: str, step_aside: Callable[[], None]) -> None:
    """Write ``text`` through the terminal reporter, wherever the session is."""
    reporter: Any = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        to_stderr(text)
        return
    step_aside()
    capture: Any = config.pluginmanager.get_plugin("capturemanager")
    paused = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
    with paused:
        reporter.write_line(text)
        reporter.flush()  # a CI log shows it now, not when a buffer fills
