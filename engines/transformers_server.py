"""Start and stop Hugging Face ``transformers serve`` (continuous batching on) on loopback.

The other server behind ``--engine=openai`` (``--engine-opt openai.server=transformers``;
vLLM stays the default): the harness serves the run's model with transformers' own
OpenAI-compatible server, waits for ``/health`` and always stops it
(engines/localserver.py). It needs ``pip install -e '.[transformers]'`` (transformers'
``serving`` extra: FastAPI, uvicorn).

What the server's command line can set, and so what a run can choose: the tokens per
batch (``--cb-max-batch-tokens``, the openai option ``max_num_batched_tokens``). It has no
flag for the requests per batch (its continuous batching admits up to 1,024) nor for
prefix sharing (on: ``ContinuousBatchingConfig.allow_block_sharing`` defaults to true);
the workloads that vary those skip through this server and say so, and in process
(``--engine=transformers``) both are options. What its API takes differs from vLLM's:
text prompts only, no ``ignore_eos`` field (a request's ``generation_config`` with
``eos_token_id: -1`` does the same), no running usage, no ``/metrics``; the openai engine
speaks that dialect (``openai.dialect=transformers``), set for it when the harness starts
this server.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from engines.localserver import Server, free_port, local_server

SERVER_DEFAULTS = {"max_num_batched_tokens": "2048"}
"""The settings a run may choose for this server, with the values it is started with
otherwise (the same default as the vLLM server's)."""
FLAGS = {"max_num_batched_tokens": "--cb-max-batch-tokens"}
CANNOT_SET = {
    "max_num_seqs": "transformers serve has no flag for the requests per batch (its continuous"
    " batching admits up to 1,024); --engine=transformers sets it in process",
    "prefix_caching_off": "transformers serve always shares prefixes (allow_block_sharing, no"
    " flag to turn it off); --engine=transformers turns it off in process",
}
"""What the harness cannot choose for this server, and what to say to a cell that asks."""
MODULES = ("transformers", "torch", "fastapi", "uvicorn")
CPU_KV_MEMORY = "0.1"
"""On a CPU, the share of free memory its KV cache takes (its default, 0.6, took 13 GB here
and the kernel killed it when another process grew): bounded as vLLM's CPU KV cache is
(1 GiB, ``VLLM_CPU_KVCACHE_SPACE``). On a GPU, its default (0.9 of free memory)."""


def missing() -> list[str]:
    """The modules ``transformers serve`` needs that are not installed."""
    return [m for m in MODULES if importlib.util.find_spec(m) is None]


def setting_flags(settings: Mapping[str, str]) -> list[str]:
    unknown = sorted(set(settings) - set(SERVER_DEFAULTS))
    if unknown:
        raise ValueError(f"not a transformers serve setting the harness sets: {', '.join(unknown)}")
    chosen = {**SERVER_DEFAULTS, **settings}
    return [part for k, v in chosen.items() for part in (FLAGS[k], v)]


def command(
    model: Path, port: int, device: str, settings: Mapping[str, str] | None = None
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "transformers.cli.transformers",
        "serve",
        str(model),
        "--continuous-batching",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        device,
        "--default-seed",
        "0",
        "--log-level",
        "warning",
        *setting_flags(settings or {}),
        *(["--cb-max-memory-percent", CPU_KV_MEMORY] if device == "cpu" else []),
    ]


@contextmanager
def transformers_server(
    model: Path,
    log: Path,
    *,
    device: str = "cpu",
    ready_timeout_s: float = 300.0,
    cpus: frozenset[int] | None = None,
    settings: Mapping[str, str] | None = None,
) -> Iterator[Server]:
    """``transformers serve MODEL --continuous-batching`` on a free loopback port.
    ``cpus``: the server's cores (torch's threads follow its affinity)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"OMP_NUM_THREADS": str(len(cpus))} if cpus else {}
    argv = command(model, port, device, settings)
    with local_server(
        "transformers serve", argv, url, log, env=env, ready_timeout_s=ready_timeout_s, cpus=cpus
    ) as proc:
        yield Server(url, proc.pid, log)
