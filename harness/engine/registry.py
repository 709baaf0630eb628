"""Engine registry: adapters come from the ``harness.engines`` entry-point group.

The built-in adapters register through the same group (see pyproject.toml), so a
third-party engine is a package with one entry point and no change here.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import cast

from harness.engine import Availability, EngineFactory
from harness.exceptions import UnknownEngine

GROUP = "harness.engines"

_extra: dict[str, EngineFactory] = {}


@dataclass(frozen=True)
class EngineStatus:
    """One row of ``python -m harness engines``."""

    name: str
    family: str
    devices: tuple[str, ...]
    availability: Availability
    source: str


def _entry_points() -> dict[str, str]:
    found = {ep.name: ep.value for ep in entry_points(group=GROUP)}
    return found or _source_tree_entry_points()


def _source_tree_entry_points() -> dict[str, str]:
    """The built-ins from pyproject.toml when the package is not installed (a bare source
    tree on a machine that may only use the packages it has, e.g. scripts/gpu-check)."""
    import tomllib  # noqa: PLC0415

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    table = data.get("project", {}).get("entry-points", {}).get(GROUP, {})
    return {str(k): str(v) for k, v in table.items()}


def names() -> list[str]:
    """Every registered engine name, sorted."""
    return sorted(set(_entry_points()) | set(_extra))


def load(name: str) -> EngineFactory:
    """The adapter class for ``name``; importing it must not import the engine itself."""
    if name in _extra:
        return _extra[name]
    target = _entry_points().get(name)
    if target is None:
        raise UnknownEngine(name, names())
    module, _, attr = target.partition(":")
    return cast(EngineFactory, getattr(importlib.import_module(module), attr))


@contextmanager
def registered(name: str, factory: EngineFactory) -> Iterator[None]:
    """Register an adapter for the duration of a block (tests and embedding scripts)."""
    if name in names():
        raise ValueError(f"engine {name!r} is already registered")
    _extra[name] = factory
    try:
        yield
    finally:
        del _extra[name]


def status(name: str, device: str) -> EngineStatus:
    """Probe one engine for ``device`` without loading any model."""
    source = _extra_source(name) or _entry_points().get(name, "?")
    try:
        factory = load(name)
    except ImportError as exc:  # the adapter module itself is broken
        return EngineStatus(
            name, "?", (), Availability(False, f"adapter import failed: {exc}"), source
        )
    caps = factory.capabilities
    if not caps.supports_device(device):
        avail = Availability(False, f"{name} does not support device {device!r}")
    else:
        avail = factory.probe(device)
    return EngineStatus(name, caps.family.value, tuple(sorted(caps.devices)), avail, source)


def _extra_source(name: str) -> str | None:
    factory = _extra.get(name)
    if factory is None:
        return None
    return f"{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', '?')}"
