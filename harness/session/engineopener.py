"""What ``open_engine`` hands a workload: a callable that loads an engine for the cell,
shared through the session's pool or the cell's own, and closes the cell's own at its
teardown. Loading is timed into the record (``engine_info.start``), never into a figure."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from harness.engine import Engine, EngineConfig, EngineError, registry
from harness.session import stash
from harness.session.cell import Cell
from harness.session.config import RunSettings
from harness.session.opening import merge_options, start_info
from harness.session.pool import EnginePool


def _notify(config: pytest.Config, kind: str, **data: Any) -> None:
    worker = config.stash.get(stash.WORKER, None)
    if worker is not None:
        worker[1].send(kind, **data)


def load_engine(config: pytest.Config, engine_name: str, engine_config: EngineConfig) -> Engine:
    """Load an engine; a worker tells its controller, whose cell deadline excludes loading."""
    _notify(config, "load", state="begin", engine=engine_name)
    try:
        engine = registry.load(engine_name)(engine_config)
        try:
            engine.load()
        except BaseException:
            engine.close()
            raise
    finally:
        _notify(config, "load", state="end", engine=engine_name)
    return engine


class EngineOpener:
    """``open_engine(model, options=..., shared=...)`` for one cell (see the fixture)."""

    def __init__(
        self, config: pytest.Config, cell: Cell, settings: RunSettings, pool: EnginePool
    ) -> None:
        self.config = config
        self.cell = cell
        self.settings = settings
        self.pool = pool
        self.opened: list[Engine] = []
        self.starts = stash.shared(config).starts

    def __call__(
        self, model: Path, *, options: Mapping[str, str] | None = None, shared: bool = False
    ) -> Engine:
        cell = self.cell
        merged = merge_options(cell, self.settings, options or {})
        econf = EngineConfig(model=model, device=self.settings.device, options=merged)
        key = (
            cell.engine,
            str(model),
            econf.device,
            *(f"{k}={v}" for k, v in sorted(merged.items())),
        )
        paid: list[bool] = []

        def load() -> Engine:
            began = time.perf_counter()
            engine = load_engine(self.config, cell.engine, econf)
            self.starts[key] = time.perf_counter() - began
            paid.append(True)
            return engine

        if shared:
            engine = self.pool.get(key, load)
        else:
            engine = load()
            self.opened.append(engine)
        start = start_info(self.starts.get(key), bool(paid))
        cell.engine_info = engine.describe() | {"start": start}
        return engine

    def close(self) -> None:
        """Close the cell's own engines, last opened first; shared ones stay open."""
        errors = []
        for engine in reversed(self.opened):
            try:
                engine.close()
            except Exception as exc:  # closing one engine must not skip closing the rest
                errors.append(f"{type(exc).__name__}: {exc}")
        if errors:
            raise EngineError("engine close failed: " + "; ".join(errors))
