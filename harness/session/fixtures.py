"""The fixtures a workload asks for: the run's settings, the cell's engine (and its
``--engine-grid`` configuration), the ``cell`` it fills, the session's event loop and
engine pool, and ``open_engine``. ``harness.plugin`` loads this module as a plugin of its
own (``pytest_plugins``), wherever pytest loads the plugin from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol, cast

import pytest

from harness.engine import Engine, registry
from harness.metrics.telemetry import Telemetry
from harness.session import stash
from harness.session.cell import Cell
from harness.session.config import RunSettings
from harness.session.engineopener import EngineOpener
from harness.session.pool import EnginePool


class OpenEngine(Protocol):
    def __call__(
        self, model: Path, *, options: Mapping[str, str] | None = None, shared: bool = False
    ) -> Engine: ...


@pytest.fixture(scope="session")
def harness_settings(pytestconfig: pytest.Config) -> RunSettings:
    """The validated run settings (engines, device, profile, seed, ...)."""
    return stash.settings_of(pytestconfig)


@pytest.fixture
def engine_name() -> str:
    """The engine of this cell; parametrized from --engine by pytest_generate_tests."""
    raise RuntimeError("engine_name is parametrized by the harness plugin; is it loaded?")


@pytest.fixture
def engine_config() -> str | None:
    """The cell's ``--engine-grid`` configuration; parametrized in a grid run."""
    return None


@pytest.fixture
def cell(
    request: pytest.FixtureRequest,
    harness_settings: RunSettings,
    engine_name: str,
    engine_config: str | None,
) -> Iterator[Cell]:
    """This test's matrix cell; skips with the reason when the engine cannot serve it.
    Resource use is sampled from here until its record is written."""
    item = cast(pytest.Function, request.node)
    state = request.config.stash.get(stash.RUN, None)
    if state is None:
        raise RuntimeError("cells need a run directory; was collection bypassed?")
    planned = state.planned[item.nodeid]
    new = state.new_cell(planned)
    item.stash[stash.CELL] = new
    stash.shared(request.config).pool.new_cell()
    _skip_if_unable(item, planned.engine, harness_settings.device)
    sampler = Telemetry()
    item.stash[stash.TELEMETRY] = sampler
    new.sampler = sampler
    sampler.start()
    try:
        yield new
    finally:
        sampler.stop()  # already stopped when the record was written; idempotent


def _skip_if_unable(item: pytest.Function, engine: str, device: str) -> None:
    status = registry.status(engine, device)
    if not status.availability.available:
        pytest.skip(status.availability.reason)
    factory = registry.load(engine)
    for marker in item.iter_markers("requires"):
        lacking = factory.capabilities.missing(marker.kwargs)
        if lacking:
            pytest.skip(f"{engine} lacks capability {', '.join(lacking)} that this workload needs")


@pytest.fixture(scope="session")
def aio(pytestconfig: pytest.Config) -> asyncio.Runner:
    """One event loop for the whole session: shared async engines stay bound to it."""
    return stash.shared(pytestconfig).runner


@pytest.fixture(scope="session")
def engine_pool(pytestconfig: pytest.Config) -> EnginePool:
    return stash.shared(pytestconfig).pool


@pytest.fixture
def open_engine(
    request: pytest.FixtureRequest,
    cell: Cell,
    harness_settings: RunSettings,
    engine_pool: EnginePool,
) -> Iterator[OpenEngine]:
    """``open_engine(model, options=..., shared=...)`` -> a loaded engine of this cell.

    ``options`` are the workload's; the user's ``--engine-opt`` values and the cell's
    ``--engine-grid`` configuration add to them. Where the user fixes an option the
    workload sets to another value, the cell is skipped saying so: it would measure
    something other than its parameters say. Unshared engines are closed at teardown;
    shared ones at the end of the session. How long the engine took to start is in the
    record (``engine_info.start``), never in a measured figure.
    """
    opener = EngineOpener(request.config, cell, harness_settings, engine_pool)
    yield opener
    opener.close()
