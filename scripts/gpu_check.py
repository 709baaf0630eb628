"""GPU check: what the harness can run on this machine's GPU, with the packages it has.

Prints the environment fingerprint and every engine's availability, runs the conformance
suite (tests/test_gpu_conformance.py, tensor engines and the transformers generative
engine) and a quick profile of the workloads for every engine that can run on the device:
tensor engines in one run (batching, shapes, preprocessing, precision and the load
workloads), each generative engine in a run of its own (streaming, continuous batching,
datasets, sessions, shared prefix, generative precision, generative load shapes and trace
replay, in that order, so that a run stopped at its share of the budget loses the
workloads asked for least). Then prints per engine what ran, what was skipped and why,
what failed, and for generative engines per workload: cells ok, TTFT and ITL p50/p99,
output tokens/s and energy per output token (the range over the workload's cells).
Writes its run directories, summary.json and cells.json (one line per cell: status,
headline figures, energy; a few kilobytes, to read back from a remote machine) under
--out. Installs nothing.

    scripts/gpu-check [--device cuda] [--out DIR] [--budget-s 480]

The budget is shared: the conformance suite gets at most 30 % of it, then each workload
run (the tensor engines' one, one per generative engine) an equal share of what is left,
so time a run does not use passes to the next. A run that reaches its share is stopped
(SIGTERM: finished cells keep their records, the cell in flight is recorded as
interrupted) and the summary says so, with the cells it did not reach; that is not a
failure of the engine.

Exit status: 0 when at least one engine ran a real cell on the device and nothing failed;
1 when a conformance test, a cell or a run failed; 2 when the harness's own packages are
missing; 3 when nothing failed but no engine ran a cell on the device (a machine where
everything skipped is not a pass). ``--device cpu`` runs the same steps on the CPU, to
check the script itself.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a bare source tree: the harness need not be installed
sys.path.insert(0, str(REPO / "scripts"))  # its findings module, when loaded by path (tests)
from gpu_check_findings import (  # noqa: E402
    CELLS_FILE,
    EXIT_MISSING,
    GENERATIVE_WORKLOADS,
    EngineReport,
    add_cells,
    add_conformance,
    add_unreached,
    add_workloads,
    engine_summary,
    verdict,
    write_cells,
)

NEEDED = ("numpy", "pydantic", "psutil", "pytest", "rich", "scipy", "onnx")
# test_load.py: the tensor load workloads (rate sweep, capacity, soak, load shapes); its
# generative ones skip for tensor engines
WORKLOADS = (
    "test_batching.py or test_shapes.py or test_preprocessing.py or test_precision.py"
    " or test_load.py"
)
LLM_WORKLOADS = " or ".join(test for _, test in GENERATIVE_WORKLOADS)
# engines that measure a server started elsewhere: this check starts none
SERVER_CLIENTS = {"openai": "a client of a server started elsewhere; gpu-check starts none"}
CONFORMANCE_SHARE = 0.3
"""At most this part of the budget for the conformance suite; the workload runs share the rest."""
RESERVE_S = 10.0
"""Kept back from the workload runs: reading the records and writing the summary."""
MIN_RUN_S = 30.0
"""A workload run whose share would be shorter is not started (it would load and stop)."""
STOP_GRACE_S = 20.0
"""After SIGTERM, a stopped run's time to record its cell in flight and close its engines."""
STOPPED = 124
"""The exit status ``_run`` gives a run it stopped at its share of the budget."""


def _say(text: str) -> None:
    print(f"\n=== gpu-check: {text}", flush=True)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
    )
    return env


def _run(args: list[str], env: dict[str, str], timeout: float) -> int:
    """The command's exit status, or ``STOPPED`` where it ran ``timeout`` seconds."""
    print("$", " ".join(args), flush=True)
    # a process group of its own, so that stopping it stops the workers it started too
    proc = subprocess.Popen(args, cwd=REPO, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        print(f"gpu-check: stopped after {timeout:.0f} s, its share of the budget", flush=True)
        _stop(proc)
        return STOPPED
    except KeyboardInterrupt:
        _stop(proc)
        raise


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the run's group (the harness records the cell in flight and keeps the
    finished ones), SIGKILL to what is left after ``STOP_GRACE_S``."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _missing() -> list[str]:
    return [m for m in NEEDED if importlib.util.find_spec(m) is None]


def engine_reports(device: str) -> dict[str, EngineReport]:
    """Every registered engine (but the null ones) with its availability on ``device``."""
    from harness.engine import registry  # noqa: PLC0415

    out = {}
    for name in registry.names():
        if name.startswith("null"):
            continue
        status = registry.status(name, device)
        why = "" if status.availability.available else status.availability.reason
        why = SERVER_CLIENTS.get(name, why)
        out[name] = EngineReport(name, status.family, unavailable=why)
    return out


def _pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider"]


def _workloads(
    args: argparse.Namespace, engines: list[str], paths: list[str], selection: str, runs: Path
) -> list[str]:
    extra = [f"--requests={args.requests}"] if args.requests else []
    # each run gets its own engines' options only: pytest refuses one for an engine it lacks
    extra += [f"--engine-opt={o}" for o in args.engine_opt if o.partition(".")[0] in engines]
    return _pytest(
        *paths,
        f"--engine={','.join(engines)}",
        f"--device={args.device}",
        "--profile=quick",
        f"--window={args.window}",
        *extra,
        f"--results-dir={runs}",
        "-k",
        selection,
    )


@dataclass(frozen=True)
class Step:
    """One workload run: what it is, the engines it measures, its pytest command."""

    label: str
    engines: tuple[str, ...]
    argv: list[str]


def workload_steps(
    args: argparse.Namespace, reports: Mapping[str, EngineReport], runs: Path
) -> list[Step]:
    """The tensor engines together, then each generative engine alone (each its own share
    of the budget, so one slow engine does not cut the others' runs)."""
    runnable = [r for r in reports.values() if not r.unavailable]
    tensor = [r.name for r in runnable if r.family == "tensor"]
    steps = []
    if tensor:
        argv = _workloads(args, tensor, ["workloads"], args.workloads, runs)
        steps.append(Step(f"quick tensor workloads on {', '.join(tensor)}", tuple(tensor), argv))
    paths = [f"workloads/{path}" for path, _ in GENERATIVE_WORKLOADS]
    for name in (r.name for r in runnable if r.family == "generative"):
        argv = _workloads(args, [name], paths, args.llm_workloads, runs)
        steps.append(Step(f"quick generative workloads on {name}", (name,), argv))
    return steps


@dataclass
class StepLog:
    """What became of one step, for summary.json."""

    label: str
    share_s: float
    seconds: float = 0.0
    exit: int | None = None
    stopped: bool = False


def _run_workloads(
    args: argparse.Namespace,
    reports: Mapping[str, EngineReport],
    env: dict[str, str],
    left: Callable[[], float],
) -> tuple[list[str], list[Path], list[StepLog]]:
    """The workload runs, each within its share of what is left of the budget; returns the
    failures, the run directories this check wrote (never an earlier check's, left under
    --out) and each step's log."""
    runs = args.out / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    failures: list[str] = []
    steps = workload_steps(args, reports, runs)
    logs = []
    for i, step in enumerate(steps):
        log = StepLog(step.label, round((left() - RESERVE_S) / (len(steps) - i), 1))
        logs.append(log)
        if log.share_s < MIN_RUN_S:
            _note(reports, step, f"not started: {max(left(), 0):.0f} s of the budget was left")
            continue
        _say(f"{step.label}, at most {log.share_s:.0f} s")
        start = time.monotonic()
        log.exit = _run(step.argv, env, log.share_s)
        log.seconds = round(time.monotonic() - start, 1)
        if log.exit == STOPPED:
            log.stopped = True
            _note(reports, step, f"stopped at its share of the budget ({log.share_s:.0f} s)")
        # 10: some cells were measured but invalid; 12: every cell skipped (both listed per
        # engine, and the verdict counts cells); neither is a crash
        elif log.exit not in (0, 10, 12):
            failures.append(f"the {step.label} run exited {log.exit}")
    written = set(runs.iterdir()) - before if runs.is_dir() else set()
    return failures, sorted(p for p in written if p.is_dir()), logs


def _note(reports: Mapping[str, EngineReport], step: Step, why: str) -> None:
    print(f"gpu-check: {step.label}: {why}", flush=True)
    for name in step.engines:
        reports[name].stopped = f"workload run {why}"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=REPO / "results" / "gpu-check")
    p.add_argument("--budget-s", type=float, default=480.0, help="whole check (default 480)")
    p.add_argument("--window", type=float, default=1.5, help="measured window per cell (s)")
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        help="closed-loop requests per cell (default: quick's)",
    )
    p.add_argument(
        "--engine-opt",
        action="append",
        default=[],
        metavar="ENGINE.KEY=VALUE",
        help="passed to the workload runs, e.g. transformers.num_blocks=64 (a CPU's cache)",
    )
    p.add_argument("--workloads", default=WORKLOADS, help=f"tensor engines' -k ({WORKLOADS})")
    p.add_argument(
        "--llm-workloads", default=LLM_WORKLOADS, help=f"generative engines' -k ({LLM_WORKLOADS})"
    )
    return p.parse_args(argv)


def _environment(device: str, env: dict[str, str]) -> dict[str, EngineReport]:
    _say("environment fingerprint")
    from harness.results.environment import fingerprint  # noqa: PLC0415

    print(json.dumps(fingerprint(), indent=1, default=str))
    _say(f"engines on {device}")
    _run([sys.executable, "-m", "harness", "engines", "--device", device], env, 60)
    return engine_reports(device)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    start = time.monotonic()
    left = lambda: args.budget_s - (time.monotonic() - start)  # noqa: E731
    missing = _missing()
    if missing:
        print(f"gpu-check: the harness needs {', '.join(missing)}, not installed here")
        return EXIT_MISSING
    args.out.mkdir(parents=True, exist_ok=True)
    env = _env() | {"HARNESS_CONFORMANCE_DEVICE": args.device}
    env.setdefault("HARNESS_CACHE_DIR", str(args.out / "cache"))
    reports = _environment(args.device, env)

    junit = args.out / "conformance.xml"
    log = _conformance(junit, env, round(left() * CONFORMANCE_SHARE, 1))
    failures, run_dirs, logs = _run_workloads(args, reports, env, left)
    # a failed test is listed under its engine; any other non-zero exit is the run's own
    if add_conformance(reports, junit) == 0 and log.exit not in (0, 5, STOPPED):
        failures.insert(0, f"the conformance run exited {log.exit}")
    records = read_runs(reports, run_dirs)
    write_cells(args.out / CELLS_FILE, records)
    code, why = verdict(reports, failures)
    seconds = time.monotonic() - start
    _summarize(args, reports, (code, why), run_dirs, ([log, *logs], seconds))
    return code


def _conformance(junit: Path, env: dict[str, str], share_s: float) -> StepLog:
    _say(f"conformance suite, at most {share_s:.0f} s")
    junit.unlink(missing_ok=True)
    log = StepLog("conformance suite", share_s)
    began = time.monotonic()
    log.exit = _run(
        _pytest("tests/test_gpu_conformance.py", "-q", "-rs", f"--junitxml={junit}"), env, share_s
    )
    log.stopped = log.exit == STOPPED
    log.seconds = round(time.monotonic() - began, 1)
    return log


def read_runs(reports: Mapping[str, EngineReport], run_dirs: Iterable[Path]) -> list[Any]:
    """Every record of this check's runs, counted into the reports with the cells that
    were planned and not reached."""
    from harness.results import store  # noqa: PLC0415

    records = []
    for run_dir in run_dirs:
        found = store.read_records(run_dir)
        add_unreached(reports, store.read_manifest(run_dir).planned, found)
        records += found
    add_cells(reports, records)
    add_workloads(reports, records)
    return records


def _summarize(
    args: argparse.Namespace,
    reports: Mapping[str, EngineReport],
    outcome: tuple[int, str],
    run_dirs: list[Path],
    steps: tuple[list[StepLog], float],
) -> None:
    """``steps``: each step's log and the whole check's seconds."""
    code, why = outcome
    logs, seconds = steps
    _say(f"per engine on {args.device}")
    for report in reports.values():
        print("\n".join(report.lines()))
    summary = {
        "device": args.device,
        "exit": code,
        "verdict": why,
        "seconds": round(seconds, 1),
        "budget_s": args.budget_s,
        "steps": [vars(s) for s in logs],
        "run_dirs": [str(d) for d in run_dirs],
        "cells": str(args.out / CELLS_FILE),
        "engines": {name: engine_summary(r) for name, r in reports.items()},
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\ngpu-check: {why} (exit {code}; {args.out / 'summary.json'})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
