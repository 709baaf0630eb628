"""Pieces for tests that run whole pytest sessions in a subprocess, with the fault engines.

The conftest registers ``faulty`` and ``faulty-gen`` (tests/support/faults.py) in the controller
and, because workers load the same conftest, in every worker. The workloads use the
harness's own load generators, as real workloads do.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from harness.results import store
from harness.results.records import CellRecord

REPO = Path(__file__).resolve().parents[2]

CONFTEST = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
import pytest
from harness.engine import registry
from tests.support.faults import FaultyEngine, FaultyGenerativeEngine
from tests.support.fakes import FakeGenerativeEngine, FakeTensorEngine, FakeUnavailableEngine

ENGINES = {{
    "faulty": FaultyEngine,
    "faulty-gen": FaultyGenerativeEngine,
    "fake-tensor": FakeTensorEngine,
    "fake-generative": FakeGenerativeEngine,
    "fake-unavailable": FakeUnavailableEngine,
}}
_held = []


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    for name, factory in ENGINES.items():
        cm = registry.registered(name, factory)
        cm.__enter__()
        _held.append(cm)


def pytest_unconfigure(config):
    while _held:
        _held.pop().__exit__(None, None, None)
"""

GEN_WORKLOAD = """
@pytest.mark.requires(family="generative")
@pytest.mark.parametrize("fault", {gen_faults})
def test_gen(cell, open_engine, harness_settings, aio, fault):
    options = {{"fault": fault.partition("+")[0], "every": "10", "at": "3"}}
    engine = open_engine(Path("tiny"), options=options, shared=True)
    requests = [
        GenerationRequest(prompt=(5, 6, i), max_tokens=32, request_id=f"r{{i}}")
        for i in range(200)
    ]
    driver = Driver(engine, MonotonicClock(), harness_settings.reliability.request_timeout_s)
    records = aio.run(driver.closed_loop(requests, 4))
    m = StreamMetrics(records)
    cell.finish(
        metrics=m.to_json(),
        evidence=Evidence(samples=len(m.ok), failed=m.failed, window_s=m.window_s),
        headline=HEADLINE,
    )
"""

WORKLOADS = """
from pathlib import Path

import numpy as np
import pytest

from harness.metrics import failures

from harness.metrics import stats
from harness.load.serving import NoBatching, serve_open_loop
from harness.load.clock import MonotonicClock
from harness.engine import GenerationRequest
from harness.load.streamdriver import Driver
from harness.load.arrivals import OpenLoop
from harness.results.records import Headline
from harness.metrics.streamtiming import StreamMetrics
from harness.metrics.validity import Evidence

HEADLINE = [Headline(label="p50", metric="e2e.p50", unit="ms", scale=1e3)]
TENSOR_FAULTS = {tensor_faults}


def fault_options(fault, tmp_path_factory):
    name, _, extra = fault.partition("+")
    options = {{"fault": name, "leak_mb": "8"}}
    if extra == "once":
        options["once"] = str(Path({once_dir!r}) / name)
    return options


@pytest.mark.requires(family="tensor")
@pytest.mark.parametrize("fault", TENSOR_FAULTS)
def test_tensor(cell, open_engine, harness_settings, fault, tmp_path_factory):
    engine = open_engine(Path("tiny"), options=fault_options(fault, tmp_path_factory))
    settings = harness_settings

    def run_batch(indices):
        out = engine.infer({{"x": np.ones((len(indices), 4), dtype=np.float32)}})
        if out["y"].shape[0] != len(indices):
            raise ValueError(f"{{out['y'].shape[0]}} output rows for a batch of {{len(indices)}}")
        return 0.0

    offsets = OpenLoop(rate=200.0, duration=settings.profile.window_s).schedule(settings.seed)
    trace = serve_open_loop(
        offsets, NoBatching(), run_batch, MonotonicClock(), settings.reliability.request_timeout_s
    )
    ok = ~trace.failed
    failed = int(trace.failed.sum())
    e2e = (trace.t_done - trace.t_sched)[ok]
    cell.finish(
        metrics={{
            "e2e": stats.to_json(stats.summarize(e2e, failed)),
            "errors": failures.tally(trace.errors),
        }},
        evidence=Evidence(samples=int(ok.sum()), failed=failed, window_s=trace.window),
        headline=HEADLINE,
    )


"""


def write_project(
    root: Path, tensor_faults: list[str], gen_faults: list[str] | None = None
) -> None:
    (root / "conftest.py").write_text(CONFTEST)
    once = root / "once"
    once.mkdir(exist_ok=True)
    source = WORKLOADS.format(tensor_faults=tensor_faults or ["none"], once_dir=str(once))
    if gen_faults:  # an empty parametrization would plan a cell of no parameters
        source += GEN_WORKLOAD.format(gen_faults=gen_faults)
    (root / "test_faults.py").write_text(source)


def pytest_argv(*args: str, cache: bool = False) -> list[str]:
    """``python -m pytest -q ARGS``; without pytest's cache unless ``cache`` (as a user
    runs it, ``--lf`` and all)."""
    plain = () if cache else ("-p", "no:cacheprovider")
    return [sys.executable, "-m", "pytest", *plain, "-q", *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def run(
    root: Path, *args: str, timeout: float = 300, cache: bool = False
) -> subprocess.CompletedProcess[str]:
    return run_argv(root, pytest_argv(*args, cache=cache), timeout)


def run_argv(root: Path, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    with started(argv, root, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@contextlib.contextmanager
def started(
    argv: list[str], root: Path, environ: dict[str, str] | None = None, **popen: Any
) -> Iterator[subprocess.Popen[str]]:
    """``argv`` started as a shell in the foreground starts it, whatever started these tests;
    on the way out (a timeout, a failed assertion) it and every process it started are
    killed, so a failed test leaves no run behind.

    A background job (``cmd &``, ``nohup``, many CI runners) gets SIGINT ignored, and an
    ignored signal stays ignored through ``exec``: a controller started from here would
    then never see the SIGINT a test sends it. Its own process group keeps a Ctrl-C at the
    terminal for the test process, whose finalizer stops the tree.
    """
    proc = subprocess.Popen(
        argv,
        cwd=root,
        env=environ or env(),
        text=True,
        stdin=subprocess.DEVNULL,
        preexec_fn=_default_sigint,  # noqa: PLW1509 - one signal call, no locks taken
        process_group=0,
        **popen,
    )
    try:
        yield proc
    finally:
        stop_tree(proc)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_tree(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc``, its process group and every descendant (workers start sessions of
    their own, so the group alone misses them); then reap it."""
    tree: list[psutil.Process] = []
    if proc.returncode is None:  # not reaped yet: its pid (and group id) is not reused
        with contextlib.suppress(psutil.Error):
            tree = psutil.Process(proc.pid).children(recursive=True)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    for child in tree:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(tree, timeout=10)
    with proc:  # closes its pipes and waits
        pass


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored in this process, as a background shell or CI runner starts its jobs;
    what is started meanwhile inherits that."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def can_unshare(flags: str, script: str) -> bool:
    """Whether ``unshare FLAGS sh -c SCRIPT`` works here (new namespaces, mounts)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", flags, "sh", "-c", script], capture_output=True, check=False)
    return probe.returncode == 0


def run_unshared(
    root: Path, flags: str, script: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``sh -c SCRIPT`` in namespaces of its own: its mounts are seen by it alone."""
    return run_argv(root, ["unshare", flags, "sh", "-c", script], timeout)


def only_run_dir(results: Path) -> Path:
    (run_dir,) = [p for p in results.iterdir() if p.is_dir()]
    return run_dir


def records_of(run_dir: Path) -> dict[str, CellRecord]:
    return {r.cell_id: r for r in store.read_records(run_dir)}


def interrupt_when(
    proc: subprocess.Popen[str], ready: Callable[[], bool], sig: signal.Signals, timeout: float
) -> None:
    """Send ``sig`` to the controller once ``ready()`` holds (polled)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError("the run ended (or stalled) before the interrupt point")
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(sig)
