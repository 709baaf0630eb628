"""How and where cells execute: process isolation and its bounds (``Reliability``), Ray
distribution (``Distribution``), where client processes run, and how many times each
cell is measured (``--repeats``); parsed once, at configuration time, into frozen values
or a ``UsageError`` that says what to do.
"""

from __future__ import annotations

import enum
import importlib.util
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.exceptions import UsageError


class Isolation(enum.StrEnum):
    PROCESS = "process"
    NONE = "none"


@dataclass(frozen=True)
class Reliability:
    """How cells are kept apart and bounded (see harness.session.isolation).

    ``process``: the cells of each engine run in a spawned worker process (one engine
    instance alive in it at a time); a crash or hang costs the cell in flight, and the
    worker is restarted for the rest, at most ``max_restarts`` times per engine.
    """

    isolation: Isolation = Isolation.PROCESS
    cell_timeout_s: float | None = None  # None: the profile's
    load_timeout_s: float = 600.0
    request_timeout_s: float = 300.0
    max_restarts: int = 3
    worker_memory_bytes: int | None = None
    resume: Path | None = None

    def __post_init__(self) -> None:
        for name in ("cell_timeout_s", "load_timeout_s", "request_timeout_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds")
        if self.max_restarts < 0:
            raise ValueError("max_restarts must be >= 0")
        if self.worker_memory_bytes is not None and self.worker_memory_bytes <= 0:
            raise ValueError("worker_memory_bytes must be > 0")


class ClientsOn(enum.StrEnum):
    """Where ``--clients N`` client processes run (harness.load.clients)."""

    LOCAL = "local"
    """Spawned processes of the cell's machine."""
    RAY = "ray"
    """Ray actors on the cluster's nodes (harness.dist.rayclients)."""


class Dist(enum.StrEnum):
    LOCAL = "local"
    RAY = "ray"


@dataclass(frozen=True)
class Distribution:
    """Where cells run (harness.dist.raydist): here, or as Ray tasks on a cluster.

    ``address``: a running cluster (``host:port``); None starts a local Ray instance.
    ``cpus_per_cell`` / ``gpus_per_cell``: what each cell's task asks Ray for (a GPU cell
    gets a whole device by default: never two cells on one GPU). ``retries``: how many
    times a cell lost to the infrastructure (its Ray worker or node died) runs again; a
    cell that failed on its own does not. ``python``: per engine, the interpreter of a
    pre-built environment present on every node (engine families pin conflicting
    packages); otherwise this process's interpreter, which must exist on every node.
    """

    mode: Dist = Dist.LOCAL
    address: str | None = None
    cpus_per_cell: float = 1.0
    gpus_per_cell: float = 1.0
    retries: int = 2
    python: Mapping[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.cpus_per_cell) and self.cpus_per_cell > 0):
            raise ValueError("cpus_per_cell must be > 0")
        if not (math.isfinite(self.gpus_per_cell) and 0 < self.gpus_per_cell <= 1):
            raise ValueError("gpus_per_cell must be in (0, 1]")
        if self.retries < 0:
            raise ValueError("retries must be >= 0")

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "address": self.address,
            "cpus_per_cell": self.cpus_per_cell,
            "gpus_per_cell": self.gpus_per_cell,
            "retries": self.retries,
            "python": {k: str(v) for k, v in sorted(self.python.items())},
        }


_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: str, option: str) -> int:
    """``"512MiB"``, ``"2G"``, ``"1.5GiB"``, ``"4096"`` (bytes) -> bytes."""
    raw = text.strip().lower().removesuffix("b").removesuffix("i")
    unit = raw[-1:] if raw[-1:] in _SIZE_UNITS and raw[-1:] != "" else ""
    number = raw[: -len(unit)] if unit else raw
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected a size such as 512MiB or 2GiB") from None
    if not (math.isfinite(value) and value >= 1):
        raise UsageError(f"{option} {text!r}: the size must be positive")
    return int(value)


def parse_reliability(
    *,
    isolation: str,
    cell_timeout: float | None,
    load_timeout: float,
    request_timeout: float,
    max_restarts: int,
    worker_memory: str | None,
    resume: str | None,
) -> Reliability:
    try:
        mode = Isolation(isolation)
    except ValueError:
        raise UsageError(f"--isolation {isolation!r}: choose process or none") from None
    for option, value in (
        ("--cell-timeout", cell_timeout),
        ("--load-timeout", load_timeout),
        ("--request-timeout", request_timeout),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UsageError(f"{option} must be a positive number of seconds, got {value}")
    if max_restarts < 0:
        raise UsageError(f"--max-restarts must be >= 0, got {max_restarts}")
    return Reliability(
        isolation=mode,
        cell_timeout_s=cell_timeout,
        load_timeout_s=load_timeout,
        request_timeout_s=request_timeout,
        max_restarts=max_restarts,
        worker_memory_bytes=parse_size(worker_memory, "--worker-memory") if worker_memory else None,
        resume=_resume_dir(resume),
    )


def parse_dist(
    *,
    mode: str,
    address: str | None,
    cpus_per_cell: float,
    gpus_per_cell: float,
    retries: int,
    python: Sequence[str] | None,
    isolation: str,
    clients_on: str = "local",
) -> Distribution:
    try:
        dist = Dist(mode)
    except ValueError:
        raise UsageError(f"--cells-on {mode!r}: choose local (this machine) or ray") from None
    if dist is Dist.LOCAL:
        return _local_dist(address, python, clients_on)
    _need_ray("--cells-on=ray")
    if isolation != Isolation.PROCESS.value:
        raise UsageError("--cells-on=ray runs every cell with process isolation: drop --isolation")
    try:
        return Distribution(
            mode=dist,
            address=address,
            cpus_per_cell=cpus_per_cell,
            gpus_per_cell=gpus_per_cell,
            retries=retries,
            python=_pythons(python or ()),
        )
    except ValueError as exc:
        raise UsageError(f"--cells-on=ray: {exc}") from None


def _local_dist(address: str | None, python: Sequence[str] | None, clients_on: str) -> Distribution:
    """Cells on this machine; a Ray address only for clients on Ray."""
    if python:
        raise UsageError("--ray-python only applies with --cells-on=ray")
    if address and clients_on != ClientsOn.RAY.value:
        raise UsageError("--ray-address only applies with --cells-on=ray or --clients-on=ray")
    if clients_on == ClientsOn.RAY.value:
        _need_ray("--clients-on=ray")
    return Distribution(address=address)


def _need_ray(option: str) -> None:
    if importlib.util.find_spec("ray") is None:
        raise UsageError(
            f"{option} needs Ray: pip install 'inference-harness[ray]' (or tox -e ray)"
        )


def _pythons(values: Sequence[str]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for value in values:
        engine, sep, path = value.partition("=")
        if not sep or not engine.strip() or not path.strip():
            raise UsageError(
                f"--ray-python {value!r}: expected ENGINE=PATH to a Python interpreter,"
                " e.g. torch=/opt/envs/torch/bin/python"
            )
        out[engine.strip()] = Path(path.strip())
    return out


def _resume_dir(resume: str | None) -> Path | None:
    if resume is None:
        return None
    path = Path(resume).expanduser().resolve()
    if not (path / "manifest.json").is_file():
        raise UsageError(f"--resume {resume!r}: not a run directory (no manifest.json in it)")
    return path


MAX_REPEATS = 100


def check_repeats(repeats: int, reliability: Reliability, dist: Distribution) -> int:
    """Each repeat is a fresh worker process: only process isolation, on this machine,
    starts one per repeat."""
    if not 1 <= repeats <= MAX_REPEATS:
        raise UsageError(f"--repeats must be between 1 and {MAX_REPEATS}, got {repeats}")
    if repeats > 1 and reliability.isolation is not Isolation.PROCESS:
        raise UsageError(
            f"--repeats {repeats} measures each cell in a fresh worker process: it needs"
            " --isolation=process (the default), not --isolation=none"
        )
    if repeats > 1 and dist.mode is not Dist.LOCAL:
        raise UsageError(
            f"--repeats {repeats} is not supported with --cells-on=ray yet: repeat the run, or"
            " run the repeats on one machine"
        )
    return repeats
