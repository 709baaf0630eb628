"""The run around its cells: its state, made once every plugin has accepted the
collection (a new run, a resumed one, or a worker's share of its controller's); whether
the controller runs the cells itself or hands them to workers; and, at the end, its
manifest, result matrix and exit status."""

from __future__ import annotations

from typing import cast

import pytest

from harness.exceptions import RecordError
from harness.report import matrix
from harness.results import store
from harness.results.redact import redact_text
from harness.session import neighbours, stash
from harness.session.config import RunSettings
from harness.session.execution import Isolation
from harness.session.outcome import run_exit
from harness.session.state import RunState, is_cell, planned_cell, resume_run, start_run


def open_run(session: pytest.Session) -> None:
    """The run's state for the collected cells, kept in the config's stash (none when
    only listing, after a usage error, or when there is no cell to run)."""
    config = session.config
    cells = [cast(pytest.Function, item) for item in session.items if is_cell(item)]
    if config.option.collectonly or not config.stash.get(stash.COLLECTED, False):
        return  # listing only, or a usage error after collection: no run to write
    if cells:  # again: a conftest's own modifyitems may have marked cells flaky since
        neighbours.check_cells(config, cells)
    worker = config.stash.get(stash.WORKER, None)
    resume = config.stash.get(stash.RESUME, None)
    settings = stash.settings_of(config)
    if worker is not None:
        spec, sink = worker
        manifest = store.read_manifest(spec.run_dir)
        state = RunState(spec.run_dir, manifest, settings, {c.nodeid: c for c in manifest.planned})
        state.sink = sink
        state.repeat = spec.repeat
    elif resume is not None:
        state = resume_run(resume.run_dir, settings, resume.manifest, resume.latest, resume.lock)
        collected = {c.nodeid for c in cells}
        state.missing = [
            c.cell_id
            for c in resume.manifest.planned
            if c.nodeid not in collected
            and not all(state.done(c.cell_id, r) for r in range(1, settings.repeats + 1))
        ]
    elif cells:
        planned = [planned_cell(item) for item in cells]
        state = start_run(settings, planned, neighbours.active(config))
    else:
        return
    config.stash[stash.RUN] = state


def controller_run(session: pytest.Session) -> tuple[RunState, RunSettings] | None:
    """The run and its settings when this process is the controller of an isolated run,
    which hands each engine's cells to a worker; None when pytest runs the cells here."""
    config = session.config
    state = config.stash.get(stash.RUN, None)
    settings = stash.settings_of(config)
    isolated = settings.reliability.isolation is Isolation.PROCESS
    if state is None or stash.WORKER in config.stash or not isolated or config.option.collectonly:
        return None
    if session.testsfailed and not config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
    return state, settings


def stop_on_fatal(state: RunState) -> None:
    """A run that cannot go on (a full disk, a broken worker) ends pytest, saying why."""
    if state.fatal_error:
        pytest.exit(redact_text(state.fatal_error), returncode=pytest.ExitCode.INTERRUPTED)


def finish_run(session: pytest.Session, exitstatus: int) -> None:
    """Close the shared engines; a controller (or an in-process run) then writes the
    manifest and the result matrix, and sets the exit status the records call for."""
    config = session.config
    state = config.stash.get(stash.RUN, None)
    shared = config.stash.get(stash.SHARED, None)
    if shared is not None:
        errors = shared.close()
        if errors and state is not None:
            state.incident("closing shared engines failed: " + "; ".join(errors))
    if state is None or stash.WORKER in config.stash:
        return
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    try:
        store.write_manifest(state.run_dir, state.finish(interrupted))
        matrix.write(state.run_dir)
    except (OSError, RecordError) as exc:  # a full disk; a record damaged since it was written
        state.fatal_error = state.fatal_error or str(exc)
    finally:
        if state.lock is not None:
            state.lock.release()
    session.exitstatus = run_exit(
        session.exitstatus,
        state.written.values(),
        unrecorded=bool(state.unrecorded),
        trouble=bool(state.incidents or state.fatal_error),
    )
