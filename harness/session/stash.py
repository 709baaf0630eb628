"""What the harness plugin keeps on pytest's config and items (``pytest.StashKey``), and
the session's shared event loop and engine pool, which the plugin closes after the last
cell (not as fixture teardown, which would charge a failing close to the last cell)."""

from __future__ import annotations

from typing import Any

import pytest

from harness.engine import eventloop
from harness.metrics.telemetry import Telemetry
from harness.session.cell import Cell
from harness.session.config import RunSettings
from harness.session.pool import EnginePool
from harness.session.resume import Resume
from harness.session.state import RunState
from harness.session.worker import EventSink, WorkerSpec

SETTINGS = pytest.StashKey[RunSettings]()
RUN = pytest.StashKey[RunState]()
CELL = pytest.StashKey[Cell]()
WORKER = pytest.StashKey[tuple[WorkerSpec, EventSink]]()
RESUME = pytest.StashKey[Resume]()
RESTORE_SIGTERM = pytest.StashKey[Any]()
SHARED = pytest.StashKey["Shared"]()
RECORDED = pytest.StashKey[bool]()
TELEMETRY = pytest.StashKey[Telemetry]()
COLLECTED_AT = pytest.StashKey[int]()
COLLECTED = pytest.StashKey[bool]()


class Shared:
    """The session's event loop and engine pool."""

    def __init__(self, fresh_process_per_instance: bool) -> None:
        self.runner = eventloop.runner()
        self.pool = EnginePool(fresh_process_per_instance)
        self.starts: dict[tuple[str, ...], float] = {}
        """Seconds each engine configuration took to load (by pool key)."""

    def close(self) -> list[str]:
        errors = self.pool.close_all()
        try:
            self.runner.close()
        except Exception as exc:  # the pool's errors must still be reported
            errors.append(f"closing the event loop: {type(exc).__name__}: {exc}")
        return errors


def shared(config: pytest.Config) -> Shared:
    """The session's ``Shared``, made on first use (a worker's pool opens a fresh engine
    process per instance)."""
    if SHARED not in config.stash:
        config.stash[SHARED] = Shared(fresh_process_per_instance=WORKER in config.stash)
    return config.stash[SHARED]


def settings_of(config: pytest.Config) -> RunSettings:
    """The run's validated settings, read from the options at ``pytest_configure``."""
    return config.stash[SETTINGS]
