"""What the workloads share: the start-up checks of the user's ``--model``, ``--dim`` and
``--images``, the ``open_model`` fixture (a tensor engine on ``--model`` or an embedded
model), and the server the harness starts behind ``--engine=openai`` (vLLM, or
``transformers serve`` with ``--engine-opt openai.server=transformers``)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.api import (
    Cell,
    EngineError,
    OpenEngine,
    RunSettings,
    TensorEngine,
    UsageError,
    settings_of,
)
from workloads.lib import pipeline, usermodel
from workloads.lib.generative import model_dir


def pytest_sessionstart(session: pytest.Session) -> None:
    """Check the user's model and images once, before any cell: one usage error (exit
    status 4) instead of the same traceback in every cell. A worker process or a Ray
    node's run of one cell skips it: its controller checked the same options, and cells
    prepare what they use lazily (``usermodel.prepared`` reuses the cached copy)."""
    config = session.config
    if config.getoption("harness_worker") or config.getoption("harness_only"):
        return
    settings = settings_of(config)
    try:
        usermodel.check(settings)
    except usermodel.ModelError as exc:
        raise pytest.UsageError(str(exc)) from None
    if settings.images is not None:
        _check_images(settings)
    _check_traffic(settings)
    _check_grid(settings)


def _check_grid(settings: RunSettings) -> None:
    """Which server an openai cell talks to is not a configuration of a grid: the
    workloads decide from ``--engine-opt`` whether the harness starts the server."""
    if any("base_url" in p.options for p in settings.engine_grid.points.get("openai", ())):
        raise pytest.UsageError(
            "--engine-grid: openai.base_url cannot vary in a grid; benchmark each server you"
            " run with its own --engine-opt openai.base_url=URL, and merge the runs in one"
            " report (python -m harness report RUN RUN --html)"
        )


def _check_traffic(settings: RunSettings) -> None:
    """Read ``--dataset`` and ``--trace-file`` once at start: a file with no usable request,
    in a format not understood, is a usage error naming it and why, before any cell. The
    counts of malformed entries go into each cell's record."""
    from workloads import test_trace  # noqa: PLC0415  (the workload's own reading)
    from workloads.lib.prompts import user_dataset  # noqa: PLC0415

    traffic = settings.traffic
    try:
        if traffic.dataset is not None:
            user_dataset(settings, None)
        if traffic.trace is not None:
            test_trace.replay_of(settings, test_trace.load_user_trace(settings))
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None


def _check_images(settings: RunSettings) -> None:
    assert settings.images is not None
    bad = pipeline.verify_images(settings.images)
    if bad:
        raise pytest.UsageError(
            f"--images {settings.images}: {len(bad)} file(s) cannot be decoded by the"
            " reference decoder (PIL); remove or replace them:\n  " + "\n  ".join(bad)
        )


OpenModel = Callable[..., TensorEngine]
"""``open_model(name, batches=(1,))``: what the ``open_model`` fixture gives."""


@pytest.fixture
def open_model(open_engine: OpenEngine, cell: Cell, harness_settings: RunSettings) -> OpenModel:
    """``open_model(name, batches=(1,))`` -> the cell's tensor engine, loaded with ``--model``
    if one is given, else with the embedded model that stands for ``name`` (``"tiny-cnn"``)
    in the run's ``--model-set`` (``workloads.lib.usermodel.open_model``); skips the cell
    when the model's fixed batch dimension cannot take the ``batches`` sizes it sends. A
    fixture, so that a workload of your own needs no import beyond ``harness.api``."""

    def opened(name: str, batches: Collection[int] = (1,)) -> TensorEngine:
        engine: TensorEngine = usermodel.open_model(
            open_engine, cell, harness_settings, name, batches
        )
        return engine

    return opened


@dataclass(frozen=True)
class Endpoint:
    """A harness-started server and the cores its load generator must stay on."""

    base_url: str
    client_cpus: frozenset[int] | None
    start_s: float
    """How long the server took to start (recorded, never measured as latency)."""
    settings: tuple[tuple[str, str], ...]
    server: str = "vllm"
    """Which server: ``vllm`` or ``transformers`` (``transformers serve``)."""

    def pin_client(self) -> None:
        if self.client_cpus:
            os.sched_setaffinity(0, self.client_cpus)


ServerKey = tuple[str, bool, tuple[tuple[str, str], ...], str]
"""Server kind, prefix caching, settings, and the model served ('': the run's)."""
SERVER_NAMES = {"vllm": "the vLLM server", "transformers": "transformers serve"}


class Servers:
    """The harness-started OpenAI servers of this process: one alive at a time, started
    on first use with the settings a cell asks for (prefix caching off, unless a workload
    studies reuse; the run's openai server settings, ``--engine-opt``/``--engine-grid``),
    restarted when a cell asks for others. A server that failed to start is remembered:
    later cells of its settings fail at once, in its words.

    Load generator and server get separate cores: sharing them, the client was preempted
    for tens of ms at a time (open-loop lag p99 100-200 ms; split: 2-3 ms).
    """

    def __init__(self, settings: RunSettings, logs: Path) -> None:
        self.settings = settings
        self.logs = logs
        self.stack = contextlib.ExitStack()
        self.current: tuple[ServerKey, Endpoint] | None = None
        self.failed: dict[ServerKey, str] = {}
        self.before = os.sched_getaffinity(0)

    def endpoint(
        self,
        *,
        prefix_caching: bool = False,
        settings: Mapping[str, str] | None = None,
        before_start: Callable[[], None] = lambda: None,
        server: str = "vllm",
        model: Path | None = None,
    ) -> tuple[Endpoint, bool]:
        """The server for these settings, and whether this call started it.
        ``before_start``: called before another server than the running one is started
        (the engine pool's ``before_new_instance``); ``model``: the one the cell opens
        (the multimodal workload's VLM; None: the run's)."""
        chosen = tuple(sorted((settings or {}).items()))
        key: ServerKey = (server, prefix_caching, chosen, str(model or ""))
        if self.current is not None and self.current[0] == key:
            return self.current[1], False
        if key in self.failed:
            raise EngineError(
                f"{SERVER_NAMES[server]} failed to start for an earlier cell: {self.failed[key]}"
            )
        if self.current is not None:
            before_start()
        self.close()
        try:
            self.current = (key, self._start(key))
        except RuntimeError as exc:
            self.failed[key] = str(exc)
            raise EngineError(str(exc)) from None
        return self.current[1], True

    def _start(self, key: ServerKey) -> Endpoint:
        from engines.localserver import split_cpus  # noqa: PLC0415

        kind, prefix_caching, chosen, model = key
        split = split_cpus()
        parts = [kind, "prefix" if prefix_caching else "plain", *(f"{k}{v}" for k, v in chosen)]
        log = self.logs / _log_name(parts)
        cpus = split[1] if split else None
        began = time.perf_counter()
        served = Path(model) if model else model_dir(self.settings)
        opened = self._server(kind, prefix_caching, chosen, log, cpus=cpus, model=served)
        server = self.stack.enter_context(opened)
        took = time.perf_counter() - began
        return Endpoint(server.base_url, split[0] if split else None, took, chosen, kind)

    def _server(
        self,
        kind: str,
        prefix_caching: bool,
        chosen: tuple[tuple[str, str], ...],
        log: Path,
        *,
        cpus: frozenset[int] | None,
        model: Path,
    ) -> contextlib.AbstractContextManager[Any]:
        if kind == "transformers":
            from engines.transformers_server import transformers_server  # noqa: PLC0415

            # prefix sharing is always on there: the workloads skip cells that want it off
            return transformers_server(
                model, log, device=self.settings.device, cpus=cpus, settings=dict(chosen)
            )
        from engines.vllm_server import vllm_server  # noqa: PLC0415

        extra = ("--enable-prefix-caching",) if prefix_caching else ()
        return vllm_server(model, log, extra=extra, cpus=cpus, settings=dict(chosen))

    def close(self) -> None:
        self.current = None
        self.stack.close()
        os.sched_setaffinity(0, self.before)


def _log_name(parts: list[str]) -> str:
    """A server log's file name from its settings (adapter paths and JSON made safe)."""
    name = re.sub(r"[^A-Za-z0-9_.=-]+", "_", "-".join(parts))
    if len(name) > 100:  # long paths: a digest keeps names of different settings apart
        name = f"{name[:80]}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"
    return f"server-{name}.log"


@pytest.fixture(scope="session")
def openai_servers(
    harness_settings: RunSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Servers]:
    """Real OpenAI servers on free loopback ports, serving the run's model (each cell checks
    first that the server it asks for can start here: ``server_missing``)."""
    servers = Servers(harness_settings, tmp_path_factory.mktemp("openai-server"))
    try:
        yield servers
    finally:
        servers.close()
