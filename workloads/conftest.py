"""What the workloads share: the start-up checks of the user's ``--model``, ``--dim`` and
``--images``, and the vLLM server behind ``--engine=openai``."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from harness.api import RunSettings, settings_of
from workloads import pipeline, usermodel
from workloads.generative import model_dir


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


def _check_images(settings: RunSettings) -> None:
    assert settings.images is not None
    bad = pipeline.verify_images(settings.images)
    if bad:
        raise pytest.UsageError(
            f"--images {settings.images}: {len(bad)} file(s) cannot be decoded by the"
            " reference decoder (PIL); remove or replace them:\n  " + "\n  ".join(bad)
        )


@dataclass(frozen=True)
class Endpoint:
    """A harness-started server and the cores its load generator must stay on."""

    base_url: str
    client_cpus: frozenset[int] | None

    def pin_client(self) -> None:
        if self.client_cpus:
            os.sched_setaffinity(0, self.client_cpus)


@pytest.fixture(scope="session")
def openai_endpoint(
    harness_settings: RunSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Endpoint]:
    """A real vLLM OpenAI server on a free loopback port, serving the run's model.

    Load generator and server get separate cores: sharing them, the client was preempted
    for tens of ms at a time (open-loop lag p99 100-200 ms; split: 2-3 ms).
    """
    from engines.vllm_server import split_cpus, vllm_server  # noqa: PLC0415

    if importlib.util.find_spec("vllm") is None:
        pytest.skip(
            "openai without --engine-opt openai.base_url=URL needs vllm installed so the"
            " harness can start a server (tox -e vllm)"
        )
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    split = split_cpus()
    before = os.sched_getaffinity(0)
    with vllm_server(model_dir(harness_settings), log, cpus=split[1] if split else None) as server:
        try:
            yield Endpoint(server.base_url, split[0] if split else None)
        finally:
            os.sched_setaffinity(0, before)
