"""Engine-configuration grids: every cell of an engine measured once per configuration.

``--engine-grid ENGINE.KEY=V1,V2,...`` (repeatable) gives the cross product of the values
of each engine's keys; ``--engine-grid-file FILE`` gives named configurations instead, a
TOML table per configuration::

    [vllm.small-batches]
    max_num_seqs = 4

    [vllm.large-batches]
    max_num_seqs = 16
    max_num_batched_tokens = 4096

A configuration is part of a cell's identity: its label is the cell parameter ``config``
(``max_num_seqs=4``, or the file's name for it), so the matrix, the report, ``compare``
and ``recommend`` keep configurations apart. Every configuration is validated when the run
is configured, with the adapter's own option checks, merged with ``--engine-opt``.
"""

from __future__ import annotations

import itertools
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness.exceptions import UsageError
from harness.results import redact

CONFIG_PARAM = "config"
"""The cell parameter that names a cell's engine configuration (in a grid run only)."""
DEFAULT_LABEL = "default"
"""The ``config`` of an engine without a grid, in a run where another engine has one."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class GridPoint:
    """One configuration of an engine: its label and the adapter options it sets."""

    label: str
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.label or "/" in self.label:
            raise ValueError("a configuration has a label, without '/'")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "options": dict(self.options)}


@dataclass(frozen=True)
class EngineGrid:
    """The configurations of each engine that has a grid (engines without one: absent)."""

    points: Mapping[str, tuple[GridPoint, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for engine, points in self.points.items():
            labels = [p.label for p in points]
            if not points or len(set(labels)) != len(labels):
                raise ValueError(f"{engine}: a grid has configurations with distinct labels")
        object.__setattr__(self, "points", MappingProxyType(dict(self.points)))

    def __bool__(self) -> bool:
        return bool(self.points)

    def labels(self, engine: str) -> tuple[str, ...]:
        """The ``config`` values of ``engine``'s cells (``default`` without a grid)."""
        points = self.points.get(engine)
        return tuple(p.label for p in points) if points else (DEFAULT_LABEL,)

    def options(self, engine: str, label: str | None) -> Mapping[str, str]:
        for point in self.points.get(engine, ()):
            if point.label == label:
                return point.options
        return {}

    def to_json(self) -> dict[str, list[dict[str, Any]]]:
        return {e: [p.to_json() for p in ps] for e, ps in self.points.items()}


Validate = Callable[[str, Mapping[str, str]], None]
"""An engine's own option check: raises ValueError naming what is wrong."""


def parse_grid(
    values: Sequence[str] | None,
    file: str | None,
    engines: Sequence[str],
    engine_options: Mapping[str, Mapping[str, str]],
    validate: Validate,
) -> EngineGrid:
    """``--engine-grid`` values and ``--engine-grid-file``, checked against the engines of
    the run and each configuration (merged with ``--engine-opt``) against its adapter."""
    by_engine = _from_values(values or (), engines)
    for engine, points in _from_file(file, engines).items():
        if engine in by_engine:
            raise UsageError(
                f"--engine-grid and --engine-grid-file both give configurations of {engine};"
                " give them in one"
            )
        by_engine[engine] = points
    for engine, points in by_engine.items():
        for point in points:
            _check_point(engine, point, engine_options.get(engine, {}), validate)
    return EngineGrid({e: tuple(ps) for e, ps in by_engine.items()})


def _from_values(values: Iterable[str], engines: Sequence[str]) -> dict[str, list[GridPoint]]:
    keys: dict[str, dict[str, list[str]]] = {}
    for item in values:
        key, sep, listed = item.partition("=")
        engine, dot, option = key.strip().partition(".")
        if not sep or not dot or not option.strip():
            raise UsageError(f"--engine-grid {item!r}: expected ENGINE.KEY=VALUE1,VALUE2,...")
        _known_engine(engine, engines, f"--engine-grid {item!r}")
        vals = [v.strip() for v in listed.split(",")]
        if any(not v for v in vals):
            raise UsageError(f"--engine-grid {item!r}: a value is empty")
        if any("/" in v for v in vals):
            raise UsageError(
                f"--engine-grid {item!r}: a value with '/' cannot label a configuration;"
                " name it in --engine-grid-file"
            )
        if len(set(vals)) != len(vals):
            raise UsageError(f"--engine-grid {item!r}: a value is given twice")
        if option.strip() in keys.setdefault(engine, {}):
            raise UsageError(
                f"--engine-grid {engine}.{option.strip()} is given twice; list all its values"
                " in one --engine-grid"
            )
        keys[engine][option.strip()] = vals
    return {engine: _product(opts) for engine, opts in keys.items()}


def _product(opts: Mapping[str, Sequence[str]]) -> list[GridPoint]:
    names = list(opts)
    points = []
    for combo in itertools.product(*(opts[n] for n in names)):
        chosen = dict(zip(names, combo, strict=True))
        points.append(GridPoint(",".join(f"{k}={v}" for k, v in chosen.items()), chosen))
    return points


def _known_engine(engine: str, engines: Sequence[str], where: str) -> None:
    if engine not in engines:
        raise UsageError(
            f"{where}: {engine!r} is not an engine of this run; give it with --engine"
            f" (this run: {', '.join(engines)})"
        )


def _from_file(file: str | None, engines: Sequence[str]) -> dict[str, list[GridPoint]]:
    if file is None:
        return {}
    path = Path(file).expanduser()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--engine-grid-file {file!r}: cannot read it: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--engine-grid-file {file!r} is not TOML: {exc}") from None
    if not data:
        raise UsageError(f"--engine-grid-file {file!r} names no configuration")
    out = {}
    for engine, configs in data.items():
        where = f"--engine-grid-file {file!r}"
        _known_engine(engine, engines, where)
        if not isinstance(configs, dict) or not configs:
            raise UsageError(f"{where}: [{engine}.NAME] tables hold {engine}'s configurations")
        out[engine] = [_named(engine, name, opts, where) for name, opts in configs.items()]
    return out


def _named(engine: str, name: str, opts: object, where: str) -> GridPoint:
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"{where}: configuration name {name!r}: use letters, digits, '_', '.' and '-'"
        )
    if not isinstance(opts, dict):
        raise UsageError(f"{where}: [{engine}.{name}] must be a table of options")
    texts = {k: _option_text(v, f"{where}: {engine}.{name}.{k}") for k, v in opts.items()}
    return GridPoint(name, texts)


def _option_text(value: object, where: str) -> str:
    """Option values as ``--engine-opt`` gives them: text (booleans as 1/0)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float | str):
        return str(value)
    raise UsageError(f"{where}: give a string, number or boolean, got {type(value).__name__}")


def _check_point(
    engine: str, point: GridPoint, user: Mapping[str, str], validate: Validate
) -> None:
    # before any message can echo them: a grid of URLs may carry passwords
    redact.remember_options({engine: point.options})
    both = sorted(set(point.options) & set(user))
    if both:
        raise UsageError(
            f"--engine-grid and --engine-opt both set {engine}.{', '.join(both)}; give each"
            " option in one of them"
        )
    try:
        validate(engine, {**user, **point.options})
    except ValueError as exc:
        raise UsageError(f"--engine-grid configuration {point.label} of {engine}: {exc}") from None
