"""Run settings: every option validated once, at configuration time.

``RunSettings`` and the checks that turn raw option values into it: each option's own
(``parse_*``, named by the option's entry in harness.session.optiontable) and then those
of the fields that need several options (``COMPOSED``). ``optiontable.parse_settings``
runs them; a bad value is a ``UsageError`` that says what was wrong and what to do.
"""

from __future__ import annotations

import enum
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.engine import registry
from harness.exceptions import UnknownEngine, UsageError
from harness.load.adapters import AdapterMix
from harness.load.clients import is_network_client
from harness.metrics.slo import SLO, parse_slos
from harness.metrics.validity import Policy
from harness.session.execution import (
    ClientsOn,
    Dist,
    Distribution,
    Reliability,
    check_repeats,
    parse_dist,
    parse_reliability,
)
from harness.session.grid import CONFIG_PARAM, EngineGrid, parse_grid
from harness.session.traffic import Traffic, parse_traffic


class ProfileName(enum.StrEnum):
    QUICK = "quick"
    FULL = "full"


@dataclass(frozen=True)
class Profile:
    """How long cells measure and what they must reach to count as valid.

    quick keeps every cell to seconds (CI, smoke checks); full uses windows a
    performance engineer would trust (tens of seconds, thousands of samples).
    """

    name: ProfileName
    window_s: float
    requests: int
    gen_requests: int
    warmup_iterations: int
    policy: Policy
    cell_timeout_s: float
    soak_s: float = 12.0
    soak_windows: int = 4
    search_points: int = 8
    search_tolerance: float = 0.15
    repeats: int = 2
    """How often a capacity point is measured in all (the spread across repetitions)."""

    def __post_init__(self) -> None:
        if not self.window_s > 0 or self.requests < 1 or self.warmup_iterations < 0:
            raise ValueError("profile windows must be positive")
        if self.soak_windows < 2 or not self.soak_s > 0 or self.repeats < 1:
            raise ValueError("a soak needs >= 2 windows and a capacity >= 1 measurement")


PROFILES: dict[ProfileName, Profile] = {
    ProfileName.QUICK: Profile(
        ProfileName.QUICK,
        window_s=4.0,
        requests=300,
        gen_requests=120,
        warmup_iterations=10,
        # Smoke-level lag bound: shared 2-core CI machines show scheduler stalls of
        # several ms; lag only ever inflates the latency measured from t_sched.
        policy=Policy(min_window_s=1.0, min_samples=100, max_lag_p99_s=0.020),
        cell_timeout_s=600.0,
    ),
    ProfileName.FULL: Profile(
        ProfileName.FULL,
        window_s=60.0,
        requests=5000,
        gen_requests=1500,
        warmup_iterations=200,
        policy=Policy(min_window_s=30.0, min_samples=1000, max_lag_p99_s=0.002),
        # 1500 streamed requests one at a time on a CPU take tens of minutes
        cell_timeout_s=3600.0,
        soak_s=600.0,
        soak_windows=10,
        search_points=14,
        search_tolerance=0.05,
        repeats=3,
    ),
}


class ModelSet(enum.StrEnum):
    """Which embedded models the workloads run when no ``--model`` is given."""

    TINY = "tiny"
    REFERENCE = "reference"


MODEL_SET_CHOICES = ("auto", *(m.value for m in ModelSet))


@dataclass(frozen=True)
class RunSettings:
    engines: tuple[str, ...]
    device: str
    profile: Profile
    results_dir: Path
    seed: int
    model: Path | None = None
    images: Path | None = None
    dims: Mapping[str, int] = field(default_factory=dict)
    dynamic_batch: bool = False
    """Serve ``model`` with its fixed batch dimension rewritten as dynamic (a derived copy)."""
    engine_options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    slos: tuple[SLO, ...] = ()
    clients: int = 1
    """Client processes that share the load of an HTTP engine (harness.load.clients);
    ``AUTO_CLIENTS`` (0): as many as the cell's offered load needs, from the measured
    ceiling of one client process (workloads/lib/clientceiling.py)."""
    clients_on: ClientsOn = ClientsOn.LOCAL
    reliability: Reliability = field(default_factory=Reliability)
    dist: Distribution = field(default_factory=Distribution)
    traffic: Traffic = field(default_factory=Traffic)
    """What generative workloads send: the user's dataset or trace, reply lengths."""
    repeats: int = 1
    """Measurements of every cell, each in a fresh worker process (``--repeats``), so that
    ``compare`` can judge a change against the spread between processes."""
    engine_grid: EngineGrid = field(default_factory=EngineGrid)
    """Configurations each engine's cells are measured in (``--engine-grid``)."""
    model_set: ModelSet = ModelSet.TINY
    """The embedded models' sizes (``--model-set``, ``auto`` resolved by the device)."""
    early_stop: bool = True
    """Stop a search's saturated rate point early (``--early-stop``,
    harness.load.saturation); False: every point runs its full window."""
    lora: AdapterMix | None = None
    """The LoRA adapters generative requests are spread over (``--lora``); None: the base
    model only."""

    def options_for(self, engine: str, params: Mapping[str, object]) -> dict[str, str]:
        """The options the user fixed for a cell of ``engine`` with ``params``: its
        ``--engine-opt`` values and those of the cell's configuration (``config``)."""
        label = params.get(CONFIG_PARAM)
        chosen = self.engine_grid.options(engine, label if isinstance(label, str) else None)
        return {**self.engine_options.get(engine, {}), **chosen}

    def to_json(self) -> dict[str, Any]:
        return {
            "engines": list(self.engines),
            "device": self.device,
            "profile": self.profile.name.value,
            "window_s": self.profile.window_s,
            "requests": self.profile.requests,
            "warmup_iterations": self.profile.warmup_iterations,
            "results_dir": str(self.results_dir),
            "seed": self.seed,
            "model": str(self.model) if self.model else None,
            "images": str(self.images) if self.images else None,
            "dims": dict(self.dims),
            "dynamic_batch": self.dynamic_batch,
            "engine_options": {k: dict(v) for k, v in self.engine_options.items()},
            "slos": {s.key: s.threshold_s for s in self.slos},
            "gen_requests": self.profile.gen_requests,
            "request_timeout_s": self.reliability.request_timeout_s,
            "clients": self.clients,
            "clients_on": self.clients_on.value,
            "dist": self.dist.to_json(),
            "repeats": self.repeats,
            "traffic": self.traffic.to_json(),
            "engine_grid": self.engine_grid.to_json(),
            "model_set": self.model_set.value,
            "early_stop": self.early_stop,
        } | ({"lora": self.lora.to_json()} if self.lora else {})  # no key: as runs before it

    @property
    def cell_timeout_s(self) -> float:
        return self.reliability.cell_timeout_s or self.profile.cell_timeout_s

    def measurement(self) -> dict[str, Any]:
        """The settings a resumed run must share with the original (what the numbers
        depend on); where results land and how cells are isolated may differ."""
        data = self.to_json()
        data.pop("results_dir")
        data.pop("dist")  # a run started on one machine may be finished on a cluster
        return data


# -- each option's own conversion (the ``convert`` of its entry in harness.session.optiontable)


def _split_engines(values: Iterable[str]) -> tuple[str, ...]:
    names: list[str] = []
    for value in values:
        for part in value.split(","):
            name = part.strip()
            if name and name not in names:
                names.append(name)
    return tuple(names)


def parse_engine(values: Sequence[str] | None) -> tuple[str, ...]:
    names = _split_engines(values or ["onnxruntime"])
    known = registry.names()
    for name in names:
        if name not in known:
            raise UsageError(str(UnknownEngine(name, known)))
    return names


def parse_profile(name: str) -> Profile:
    try:
        return PROFILES[ProfileName(name)]
    except ValueError:
        choices = ", ".join(p.value for p in ProfileName)
        raise UsageError(f"--profile {name!r} is not a profile; choose one of: {choices}") from None


def parse_window(window: float | None) -> float | None:
    if window is not None and not (math.isfinite(window) and window > 0):
        raise UsageError(f"--window must be a positive number of seconds, got {window}")
    return window


def parse_requests(requests: int | None) -> int | None:
    if requests is not None and requests < 1:
        raise UsageError(f"--requests must be >= 1, got {requests}")
    return requests


def parse_seed(seed: int) -> int:
    if seed < 0:
        raise UsageError(f"--seed must be >= 0, got {seed}")
    return seed


def parse_device(device: str) -> str:
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise UsageError(f"--device {device!r}: use cpu, cuda or cuda:N")
    return device


def parse_model_set(value: str) -> str:
    """The name, ``auto`` kept: the device resolves it (``_model_set``)."""
    if value not in MODEL_SET_CHOICES:
        choices = ", ".join(MODEL_SET_CHOICES)
        raise UsageError(f"--model-set {value!r}: choose one of {choices}")
    return value


def parse_model(model: str | None) -> Path | None:
    if model is None:
        return None
    path = Path(model).expanduser()
    if not path.exists():
        raise UsageError(f"--model {model!r} does not exist; give a local model file or directory")
    return path.resolve()


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def cache_root() -> Path:
    """Where generated models, corpora and built engines are cached: $HARNESS_CACHE_DIR,
    else ~/.cache/inference-harness."""
    return Path(os.environ.get("HARNESS_CACHE_DIR") or Path.home() / ".cache" / "inference-harness")


def parse_images(images: str | None) -> Path | None:
    if images is None:
        return None
    path = Path(images).expanduser()
    if not path.is_dir():
        raise UsageError(f"--images {images!r} is not a directory; give a folder of images")
    if not any(p.suffix.lower() in IMAGE_SUFFIXES for p in path.iterdir()):
        raise UsageError(f"--images {images!r} holds no {', '.join(IMAGE_SUFFIXES)} file")
    return path.resolve()


def _pairs(values: Sequence[str] | None, option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or ():
        key, sep, val = item.partition("=")
        if not sep or not key.strip() or not val.strip():
            raise UsageError(f"{option} {item!r}: expected KEY=VALUE")
        if key.strip() in out:
            raise UsageError(
                f"{option} {key.strip()} is given twice ({out[key.strip()]!r} and"
                f" {val.strip()!r}); give it once"
            )
        out[key.strip()] = val.strip()
    return out


def parse_dim(values: Sequence[str] | None) -> dict[str, int]:
    dims: dict[str, int] = {}
    for key, val in _pairs(values, "--dim").items():
        if not val.isdigit() or int(val) < 1:
            raise UsageError(f"--dim {key}={val}: the size must be a positive integer")
        dims[key] = int(val)
    return dims


def parse_engine_opt(values: Sequence[str] | None) -> dict[str, str]:
    """``ENGINE.KEY=VALUE`` items by ``ENGINE.KEY``; the engines of the run check them
    (``_engine_options``)."""
    return _pairs(values, "--engine-opt")


AUTO_CLIENTS = 0
"""``--clients auto``."""


def parse_clients(clients: int | str) -> int:
    if clients == "auto":
        return AUTO_CLIENTS
    try:
        count = int(clients)
    except ValueError:
        raise UsageError(f"--clients {clients!r}: give a number of processes or auto") from None
    if count < 1:
        raise UsageError(f"--clients must be >= 1, got {count}")
    return count


def parse_clients_on(where: str) -> ClientsOn:
    try:
        return ClientsOn(where)
    except ValueError:
        raise UsageError(f"--clients-on {where!r}: choose local or ray") from None


def parse_early_stop(value: str) -> bool:
    if value not in ("on", "off"):
        raise UsageError(f"--early-stop {value!r}: choose on or off")
    return value == "on"


def parse_slo(text: str | None) -> tuple[SLO, ...]:
    if not text:
        return ()
    try:
        return parse_slos(text)
    except ValueError as exc:
        raise UsageError(f"--slo {text!r}: {exc}") from None


# -- the fields that need several options' values, built after every option's own check --

Values = Mapping[str, Any]
"""Option values by dest, each converted by its option (``parse_*`` above)."""
Fields = Mapping[str, Any]
"""The ``RunSettings`` fields built so far, by name."""


def _profile(v: Values, _: Fields) -> Profile:
    base: Profile = v["profile"]
    window, requests = v["window"], v["requests"]
    if window is not None:
        floor = base.policy.min_window_s
        if window <= floor:
            # the measured window ends at the last arrival, before the scheduled end
            raise UsageError(
                f"--window {window:g}: the {base.name.value} profile judges a cell valid only"
                f" over a measured window of at least {floor:g} s, which a window of"
                f" {window:g} s cannot give; use more than {floor:g} s"
            )
        base = replace(base, window_s=window)
    if requests is not None:
        base = replace(base, requests=requests, gen_requests=requests)
    return base


def _model_set(v: Values, f: Fields) -> ModelSet:
    """``auto``: the reference-sized models on a GPU, which the tiny ones leave idle
    (launch overhead is all they measure there); the tiny ones on a CPU."""
    if v["model_set"] == "auto":
        return ModelSet.REFERENCE if f["device"].startswith("cuda") else ModelSet.TINY
    return ModelSet(v["model_set"])


def _dynamic_batch(v: Values, _: Fields) -> bool:
    if v["dynamic_batch"] and v["model"] is None:
        raise UsageError(
            "--dynamic-batch rewrites the batch dimension of your --model; without --model"
            " the embedded models already have a dynamic batch"
        )
    return bool(v["dynamic_batch"])


def _engine_options(v: Values, f: Fields) -> dict[str, dict[str, str]]:
    engines: tuple[str, ...] = f["engines"]
    by_engine: dict[str, dict[str, str]] = {name: {} for name in engines}
    for key, val in v["engine_opt"].items():
        engine, dot, opt = key.partition(".")
        if not dot or engine not in by_engine:
            raise UsageError(
                f"--engine-opt {key}={val}: expected ENGINE.OPTION=VALUE with ENGINE one of"
                f" {', '.join(engines)}"
            )
        by_engine[engine][opt] = val
    for engine, opts in by_engine.items():
        try:
            registry.load(engine).validate_options(opts)
        except ValueError as exc:
            raise UsageError(f"--engine-opt for {engine}: {exc}") from None
    return by_engine


def _validate(engine: str, options: Mapping[str, str]) -> None:
    registry.load(engine).validate_options(options)


def _engine_grid(v: Values, f: Fields) -> EngineGrid:
    return parse_grid(
        v["engine_grid"], v["engine_grid_file"], f["engines"], f["engine_options"], _validate
    )


def _clients(v: Values, f: Fields) -> int:
    """Several client processes each hold their own engine instance: only an engine that
    is a client of a server (HTTP) can be driven that way."""
    clients: int = v["clients"]
    local = [e for e in f["engines"] if clients > 1 and not is_network_client(registry.load(e))]
    if local:
        raise UsageError(
            f"--clients {clients}: not an HTTP engine: {', '.join(local)}; several client"
            " processes can only drive an engine that is a client of a server (e.g. openai)"
        )
    return clients


def _reliability(v: Values, _: Fields) -> Reliability:
    return parse_reliability(
        isolation=v["isolation"],
        cell_timeout=v["cell_timeout"],
        load_timeout=v["load_timeout"],
        request_timeout=v["request_timeout"],
        max_restarts=v["max_restarts"],
        worker_memory=v["worker_memory"],
        resume=v["resume"],
    )


def _dist(v: Values, _: Fields) -> Distribution:
    return parse_dist(
        mode=v["cells_on"],
        address=v["ray_address"],
        cpus_per_cell=v["ray_cpus_per_cell"],
        gpus_per_cell=v["ray_gpus_per_cell"],
        retries=v["ray_retries"],
        python=v["ray_python"],
        isolation=v["isolation"],
        clients_on=v["clients_on"],
    )


def _clients_on(v: Values, f: Fields) -> ClientsOn:
    on: ClientsOn = v["clients_on"]
    if on is ClientsOn.LOCAL:
        return on
    if f["clients"] < 2:
        raise UsageError(
            "--clients-on=ray puts client processes on a Ray cluster: give --clients N"
            " (N >= 2); with one client the load comes from the cell's own process"
        )
    dist: Distribution = f["dist"]
    if dist.mode is Dist.LOCAL and dist.address is None and not os.environ.get("RAY_ADDRESS"):
        raise UsageError(
            "--clients-on=ray needs the cluster: give --ray-address HOST:PORT (or set"
            " RAY_ADDRESS, or run with --cells-on=ray, whose cells reach the cluster they run on)"
        )
    return on


def _repeats(v: Values, f: Fields) -> int:
    return check_repeats(v["repeats"], f["reliability"], f["dist"])


def _traffic(v: Values, _: Fields) -> Traffic:
    return parse_traffic(
        dataset=v["dataset"],
        dataset_format=v["dataset_format"],
        output_mode=v["output_mode"],
        output_cap=v["output_cap"],
        trace=v["trace_file"],
        trace_format=v["trace_format"],
        trace_speed=v["trace_speed"],
        trace_rate=v["trace_rate"],
        trace_slice=v["trace_slice"],
        trace_limit=v["trace_limit"],
        session_spec=v["session_spec"],
    )


COMPOSED: dict[str, Callable[[Values, Fields], object]] = {
    "profile": _profile,
    "model_set": _model_set,
    "dynamic_batch": _dynamic_batch,
    "engine_options": _engine_options,
    "engine_grid": _engine_grid,
    "clients": _clients,
    "reliability": _reliability,
    "dist": _dist,
    "clients_on": _clients_on,
    "repeats": _repeats,
    "traffic": _traffic,
}
"""The ``RunSettings`` fields built from several options' values, or checked against
other fields, in the order they are built (each after the fields it reads); every other
field is its one option's converted value."""


def check_writable_dir(path: Path, option: str) -> None:
    """Prove, before anything is measured, that files can be written in ``path`` (or, if
    it does not exist yet, in its nearest existing parent, where it will be created): a
    run that cannot store its records would lose every cell."""
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        what = "is a file" if probe == path.absolute() else f"is under the file {probe}"
        raise UsageError(f"{option} {str(path)!r} {what}; give a directory")
    try:
        with tempfile.TemporaryFile(dir=probe, prefix=".harness-probe-"):
            pass
    except OSError as exc:
        where = "" if probe == path.absolute() else f" (in {probe}, where it would be created)"
        raise UsageError(
            f"{option} {str(path)!r}: cannot write files there{where}:"
            f" {exc.strerror or exc}; give a directory this user can write to"
        ) from None
