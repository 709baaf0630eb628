"""``--resume``: own the run directory, check that this session would measure what the
run measured, and select the cells still to run (those without an ok record)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from harness.results.lock import RunLock
from harness.results.records import Manifest, Status, slot
from harness.session.config import RunSettings
from harness.session.state import check_resumable, is_cell, lock_run, planned_cell, read_run


@dataclass(frozen=True)
class Resume:
    """A ``--resume`` checked at configuration: its directory (locked), manifest and the
    latest status of each cell's repeat (by slot, harness.results.records.slot)."""

    run_dir: Path
    manifest: Manifest
    latest: dict[str, Status]
    lock: RunLock


def resumable(run_dir: Path, settings: RunSettings) -> Resume:
    """Own the run directory, then check that this session would measure what it did."""
    lock = lock_run(run_dir)
    try:
        manifest, latest = read_run(run_dir)
        check_resumable(manifest, settings)
    except BaseException:
        lock.release()
        raise
    return Resume(run_dir, manifest, latest, lock)


def select_for_resume(
    config: pytest.Config,
    items: list[pytest.Item],
    manifest: Manifest,
    latest: dict[str, Status],
    repeats: int = 1,
) -> None:
    """Keep the planned cells that lack an ok record of some repeat; the controller then
    runs, in each repeat's pass, only the cells that lack it (RunState.done)."""
    planned = {c.cell_id for c in manifest.planned}
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        if not is_cell(item):
            drop.append(item)
            continue
        cell_id = planned_cell(cast(pytest.Function, item)).cell_id
        redo = cell_id in planned and any(
            latest.get(slot(cell_id, r)) is not Status.OK for r in range(1, repeats + 1)
        )
        (keep if redo else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
