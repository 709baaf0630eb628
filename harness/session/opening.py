"""The options a cell's engine is opened with, and what its start is recorded as."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from harness.session.cell import Cell
from harness.session.config import RunSettings
from harness.session.grid import CONFIG_PARAM


def merge_options(cell: Cell, settings: RunSettings, options: Mapping[str, str]) -> dict[str, str]:
    """A workload's ``options`` for ``cell`` with the user's (``--engine-opt``, the cell's
    ``--engine-grid`` configuration) added; skips the cell where the user fixes one of
    them to another value."""
    fixed = settings.options_for(cell.engine, cell.params)
    clash = sorted(k for k, v in options.items() if k in fixed and fixed[k] != v)
    if clash:
        by = "its --engine-grid configuration" if CONFIG_PARAM in cell.params else "--engine-opt"
        sets = ", ".join(f"{k}={options[k]}" for k in clash)
        pytest.skip(
            f"this cell sets {sets} itself (what it measures), and {by} fixes"
            f" {', '.join(f'{k}={fixed[k]}' for k in clash)}"
        )
    return {**options, **fixed}


def start_info(seconds: float | None, in_this_cell: bool) -> dict[str, Any]:
    """How long loading the engine took, and whether this cell waited for it (a shared
    engine is started by the first cell of its configuration)."""
    return {"seconds": None if seconds is None else round(seconds, 3), "in_this_cell": in_this_cell}
