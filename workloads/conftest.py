"""Session fixtures the workloads share: the vLLM server behind ``--engine=openai``."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from harness.config import RunSettings
from workloads.generative import model_dir


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
