"""How a run ends: its exit status, decided by its records, not by pytest's outcomes.

pytest passes a cell whose measurement is invalid (it ran; its numbers may not be
reported) and knows nothing of planned cells a ``--resume -k ...`` left out. A pipeline
gating on ``pytest --engine=X`` needs both to be non-zero, each with its own code.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from harness.results.records import Status


class RunExit(enum.IntEnum):
    """The exit statuses of ``pytest --engine=...``: 0-6 are pytest's own (6: too many
    warnings, ``--max-warnings``); the run's own start at 10, clear of pytest's."""

    OK = 0
    """Every planned cell has a record, and each is ok or skipped with a reason."""
    FAILED = 1
    """A cell failed, timed out or crashed, or the run had an incident."""
    INTERRUPTED = 2
    INTERNAL_ERROR = 3
    USAGE_ERROR = 4
    NO_CELLS = 5
    INVALID = 10
    """No cell failed, but a cell's measurement is invalid (below the profile's bounds)."""
    INCOMPLETE = 11
    """Planned cells of the run have no record (e.g. ``--resume`` with a narrower ``-k``)."""
    NOTHING_MEASURED = 12
    """Every cell was skipped: the engine cannot run here, or no cell could serve it. A
    pipeline gating on the run must not read that as a pass."""


BROKEN = frozenset({Status.FAILED, Status.TIMEOUT, Status.CRASHED})
KEPT = frozenset({RunExit.INTERRUPTED, RunExit.INTERNAL_ERROR, RunExit.USAGE_ERROR})


def run_exit(
    pytest_status: int,
    statuses: Iterable[Status],
    *,
    unrecorded: bool,
    trouble: bool,
) -> int:
    """The run's exit status: the worst of what its records say, most severe first.

    ``statuses``: the latest status of each recorded cell; ``unrecorded``: planned cells
    have no record; ``trouble``: an incident or a fatal error outside any cell. pytest's
    own failures (a non-cell test, an error in a fixture) keep its status 1.
    """
    if pytest_status in KEPT:
        return pytest_status
    seen = set(statuses)
    if trouble or seen & BROKEN or pytest_status == RunExit.FAILED:
        return RunExit.FAILED
    if unrecorded:
        return RunExit.INCOMPLETE
    if Status.INVALID in seen:
        return RunExit.INVALID
    if seen == {Status.SKIPPED}:
        return RunExit.NOTHING_MEASURED
    return pytest_status
