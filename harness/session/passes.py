"""The controller's loop under process isolation on this machine: one pass per repeat
(``--repeats``), each engine's cells of a pass in fresh workers (harness.session.isolation),
cells that are not engine cells in this process."""

from __future__ import annotations

import pytest

from harness.session.config import RunSettings
from harness.session.isolation import Supervisor, groups
from harness.session.state import RunState, engine_of, is_cell


def run_isolated(session: pytest.Session, state: RunState, settings: RunSettings) -> None:
    supervisor = Supervisor(
        session,
        state,
        settings.reliability,
        run_dir=state.run_dir,
        attempt=state.attempt,
        cell_timeout_s=settings.cell_timeout_s,
    )
    try:
        for repeat in range(1, settings.repeats + 1):
            _run_pass(session, state, supervisor, repeat)
    finally:
        supervisor.close()


def _run_pass(
    session: pytest.Session, state: RunState, supervisor: Supervisor, repeat: int
) -> None:
    """One measurement of every cell that lacks an ok record of this repeat, in fresh
    workers: repeats are interleaved (all cells, then all again) so that a slow drift of
    the machine spreads over every cell rather than landing on the last ones."""
    state.repeat = supervisor.repeat = repeat
    items = [
        item
        for item in session.items
        if (engine_of(item) is None and repeat == 1)
        or (is_cell(item) and not state.done(state.planned[item.nodeid].cell_id, repeat))
    ]
    for group in groups(items, engine_of):
        if session.shouldstop or session.shouldfail or state.fatal_error:
            return
        if group.engine is None:
            _run_inline(session, group.items)
        else:
            supervisor.run_group(group.engine, group.items)


def _run_inline(session: pytest.Session, items: tuple[pytest.Item, ...]) -> None:
    for i, item in enumerate(items):
        nextitem = items[i + 1] if i + 1 < len(items) else None
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldstop or session.shouldfail:
            return
