"""One cell of a distributed run, on the node that runs it (the body of a Ray task).

The node runs the cell as a pytest run of its own, with the driver's arguments and
process isolation, selecting exactly the driver's test (``--harness-only``) and writing
into a scratch results directory: everything a local run guarantees (crash and hang
containment, deadlines, telemetry, the environment fingerprint of *this* machine) holds
on the node. The record comes back as JSON for the driver to write into its run
directory. Nothing here imports Ray: the function runs, and is tested, without it.
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.results.store import CELLS
from harness.session.worker import Drop, drop_options

STRIPPED_WITH_VALUE = frozenset(
    {
        "--cells-on",
        "--ray-address",
        "--ray-cpus-per-cell",
        "--ray-gpus-per-cell",
        "--ray-retries",
        "--ray-python",
        "--resume",
        "--results-dir",
        "--harness-only",
    }
)
"""Driver options the node's run must not repeat: it runs locally, once, into scratch."""
BENCHMARK_FLAGS = frozenset(
    {
        "--benchmark-autosave",
        "--benchmark-only",
        "--benchmark-skip",
        "--benchmark-disable",
        "--benchmark-enable",
        "--benchmark-verbose",
        "--benchmark-quiet",
        "--benchmark-disable-gc",
        "--benchmark-warmup",
        "--benchmark-cprofile-dump",
    }
)
"""pytest-benchmark options without a value: only the driver feeds benchmarks."""
PASSED_ENV = (
    "VLLM_NO_USAGE_STATS",
    "DO_NOT_TRACK",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "RAY_USAGE_STATS_ENABLED",
    "HARNESS_CACHE_DIR",
    "HARNESS_PROFILE",
)
"""The driver's settings that keep engines from phoning home, and the harness's own."""
TAIL_LINES = 40
START_MARGIN_S = 120.0
"""Beyond load and cell deadlines: a node's pytest start-up and collection."""


def node_argv(args: Sequence[str], nodeid: str, results_dir: Path) -> list[str]:
    """The driver's pytest arguments for a local one-cell run of ``nodeid``."""

    def stripped(name: str) -> Drop:
        if name in STRIPPED_WITH_VALUE:
            return "option"
        if name.startswith("--benchmark-"):
            return "flag" if name in BENCHMARK_FLAGS else "option"
        return None

    out = drop_options(args, stripped)
    return [
        *out,
        "-p",
        "no:benchmark",
        "-p",
        "no:cacheprovider",
        "-q",
        "--cells-on=local",
        f"--results-dir={results_dir}",
        f"--harness-only={nodeid}",
    ]


@dataclass(frozen=True)
class RemoteSpec:
    """What the driver asks a node to run."""

    nodeid: str
    args: tuple[str, ...]
    cwd: Path
    python: str
    env: tuple[tuple[str, str], ...]
    timeout_s: float

    def __post_init__(self) -> None:
        if not self.nodeid or self.timeout_s <= 0:
            raise ValueError("a remote cell needs a node id and a positive timeout")


@dataclass(frozen=True)
class RemoteResult:
    """What came back: the record's JSON, or why there is none, and where it ran."""

    record_json: str | None
    error: str
    timed_out: bool
    exit_code: int | None
    tail: tuple[str, ...]
    host: str
    seconds: float

    def __post_init__(self) -> None:
        if self.record_json is None and not self.error:
            raise ValueError("a remote result without a record must say why")


def spec_for(
    nodeid: str,
    args: Sequence[str],
    cwd: Path,
    python: str,
    timeout_s: float,
) -> RemoteSpec:
    env = tuple((k, os.environ[k]) for k in PASSED_ENV if k in os.environ)
    return RemoteSpec(nodeid, tuple(args), cwd, python, env, timeout_s + START_MARGIN_S)


def run_cell(spec: RemoteSpec) -> RemoteResult:
    """Run one cell here, as a local pytest run, and hand back its record."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="harness-cell-") as scratch:
        root = Path(scratch)
        argv = [spec.python, "-m", "pytest", *node_argv(spec.args, spec.nodeid, root / "runs")]
        log = root / "node.log"
        code, timed_out = _run(argv, spec, log)
        tail = tuple(log.read_text(errors="replace").splitlines()[-TAIL_LINES:])
        record = _record(root / "runs")
    seconds = time.monotonic() - start
    error = "" if record is not None else _why_none(code, timed_out, spec)
    return RemoteResult(record, error, timed_out, code, tail, platform.node(), seconds)


def _run(argv: list[str], spec: RemoteSpec, log: Path) -> tuple[int | None, bool]:
    env = {**os.environ, **dict(spec.env), "PYTHONUNBUFFERED": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv,
            cwd=spec.cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=spec.timeout_s), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the run and its engine workers
            proc.wait()
            return None, True


def _record(results: Path) -> str | None:
    files = sorted(results.glob(f"*/{CELLS}/*.json"))
    return files[-1].read_text() if files else None


def _why_none(code: int | None, timed_out: bool, spec: RemoteSpec) -> str:
    if timed_out:
        return f"the node's run of the cell took over {spec.timeout_s:g} s and was killed"
    return (
        f"the node's pytest run (exit {code}) wrote no record for {spec.nodeid}: it did not"
        " collect that test (every node needs the same code at the same path, and the"
        " engine's packages) or could not start"
    )
