"""Run an OpenAI-compatible server the harness starts itself, on a free loopback port.

What every harness-started server shares, whichever engine serves (vLLM:
engines/vllm_server.py; Hugging Face ``transformers serve``: engines/transformers_server.py):
the process in a session of its own (it spawns engine processes that must stop with it),
below the load generator's priority and on cores of its own, readiness by ``GET /health``,
its log kept, the last exception of that log as the reason when it dies before it is
ready, and always a stop (SIGTERM to the group, then SIGKILL).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

OFFLINE_ENV = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}
"""Servers phone home by default; nothing here may reach anything but loopback."""

# The server shares the machine with the load generator: below the generator's priority,
# so the generator sends on time (its lag is checked) and the server takes the rest.
SERVER_NICENESS = 5


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Server:
    base_url: str
    pid: int
    log: Path


def split_cpus() -> tuple[frozenset[int], frozenset[int]] | None:
    """(client cores, server cores): the first half for the load generator, the rest for
    the server; None on a single core, where there is nothing to split."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    half = len(cores) // 2
    return frozenset(cores[:half]), frozenset(cores[half:])


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:  # noqa: S310 (loopback only)
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def local_server(
    what: str,
    command: Sequence[str],
    url: str,
    log: Path,
    *,
    env: Mapping[str, str],
    ready_timeout_s: float,
    cpus: frozenset[int] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``command`` (which serves ``url``), wait until ``/health`` answers, yield the
    process; stop it, and every process it started, on the way out. ``cpus``: pin it (and
    what it starts) to these cores, so that a load generator on the others is never
    preempted by it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **OFFLINE_ENV, **env},
            start_new_session=True,
        )
        try:
            # before the server (seconds of imports later) spawns its engine, which inherits it
            os.setpriority(os.PRIO_PROCESS, proc.pid, SERVER_NICENESS)
            if cpus:
                os.sched_setaffinity(proc.pid, cpus)
            wait_ready(what, proc, url, log, ready_timeout_s)
            yield proc
        finally:
            stop(proc)


def wait_ready(
    what: str, proc: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text(errors="replace")
            raise RuntimeError(
                f"{what} exited with {proc.returncode} before ready: {last_error(text)}"
                f" (log: {log}; its end:\n{text[-2000:]})"
            )
        if healthy(url):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{what} at {url} not ready after {timeout_s:g} s (log: {log})")


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


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)  # the server spawns engine processes
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
