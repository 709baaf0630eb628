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
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a bare source tree: the harness need not be installed
NEEDED = ("numpy", "pydantic", "psutil", "pytest", "rich", "scipy", "onnx")
# test_load.py: the tensor load workloads (rate sweep, capacity, soak, load shapes); its
# generative ones skip for tensor engines
WORKLOADS = (
    "test_batching.py or test_shapes.py or test_preprocessing.py or test_precision.py"
    " or test_load.py"
)
GENERATIVE_WORKLOADS: tuple[tuple[str, str], ...] = (
    ("test_streaming.py", "test_streaming"),
    ("test_continuous_batching.py", "test_continuous_batching"),
    ("test_dataset.py", "test_dataset"),
    ("test_sessions.py", "test_sessions"),
    ("test_shared_prefix.py", "test_shared_prefix"),
    ("test_precision.py", "test_precision_generative"),
    ("test_load.py", "test_generative_shape"),
    ("test_trace.py", "test_trace"),
)
"""The generative workloads (file, test function), most asked-for first: pytest runs the
files in this order, so a run stopped at its share of the budget loses the last ones.
test_load.py's generative users sweep, capacity search and soak are left out, to keep the
budget for the workloads above (a sweep or search measures many points, a soak one long
window); ``pytest --engine=...`` runs them."""
LLM_WORKLOADS = " or ".join(test for _, test in GENERATIVE_WORKLOADS)
# conformance classes (tests/test_gpu_conformance.py) -> the engine they test
CONFORMANCE_ENGINES = {
    "TestTorch": "torch",
    "TestOnnxRuntime": "onnxruntime",
    "TestTensorRT": "tensorrt",
    "TestTransformers": "transformers",
}
# engines that measure a server started elsewhere: this check starts none
SERVER_CLIENTS = {"openai": "a client of a server started elsewhere; gpu-check starts none"}
EXIT_OK, EXIT_FAILED, EXIT_MISSING, EXIT_NOTHING_RAN = 0, 1, 2, 3
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
INTERRUPTED = "interrupted by"
"""How the harness's record of a cell cut short by SIGTERM begins its reason."""
FIGURES: tuple[tuple[str, str, float], ...] = (
    ("ttft_p50_ms", "ttft.p50", 1e3),
    ("ttft_p99_ms", "ttft.p99", 1e3),
    ("itl_p50_ms", "itl.p50", 1e3),
    ("itl_p99_ms", "itl.p99", 1e3),
    ("output_tokens_per_s", "throughput.output_tokens_per_s", 1.0),
    ("j_per_output_token", "energy.per_output_token_j", 1.0),
)
"""A generative cell's figures of record: (name, dotted metric path, scale)."""
FIGURE_LABELS = ("TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "tok/s", "J/tok")


@dataclass
class EngineReport:
    """What one engine did in this check."""

    name: str
    family: str
    unavailable: str = ""  # the probe's reason on this device; empty when it can run
    passed: int = 0  # conformance tests
    failed: list[str] = field(default_factory=list)  # conformance tests and cells
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    cells_ok: int = 0
    cells_invalid: int = 0
    stopped: str = ""  # why its workload run ended before its last cell; empty if it did not
    not_reached: dict[str, int] = field(default_factory=dict)  # workload -> cells unmeasured
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)  # generative: figures

    def verdict(self) -> str:
        if self.failed:
            return "FAILED"
        return "RAN" if self.cells_ok else "SKIPPED"

    def lines(self) -> list[str]:
        head = f"{self.name:<14}{self.verdict():<9}"
        # the contract's static tests pass without a device: ran means cells measured
        parts = [f"cells {self.cells_ok} ok", f"conformance {self.passed} passed"]
        if self.cells_invalid:
            parts.append(f"{self.cells_invalid} invalid (measured, failed a validity check)")
        out = [head + ", ".join(parts)]
        if self.unavailable:
            out.append(f"{'':<23}cannot run here: {self.unavailable}")
        if self.stopped:
            out.append(f"{'':<23}{self.stopped}")
        out += [f"{'':<23}not reached x{n}: {w}" for w, n in sorted(self.not_reached.items())]
        out += [f"{'':<23}failed: {what}" for what in self.failed]
        out += [f"{'':<23}skipped x{n}: {why}" for why, n in sorted(self.skipped.items())]
        return out + workload_table(self.workloads)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def unmeasured(self, workload: str) -> None:
        self.not_reached[workload] = self.not_reached.get(workload, 0) + 1


def workload_table(workloads: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Per workload, in the order the runs take them: cells ok of those recorded, then each
    figure's range over its ok cells; then why energy is missing, where it is."""
    if not workloads:
        return []
    row = "{:<23}{:<22}{:>9}" + "{:>14}" * len(FIGURE_LABELS)
    out = [row.format("", "workload", "cells ok", *FIGURE_LABELS)]
    for name in sorted(workloads, key=_workload_rank):
        w = workloads[name]
        figures = [span_text(w[key]) for key, _, _ in FIGURES]
        out.append(row.format("", name, f"{w['ok']}/{w['cells']}", *figures))
    absent = sorted({w["energy_absent"] for w in workloads.values() if "energy_absent" in w})
    return out + [f"{'':<23}J/tok n/a: {why}" for why in absent]


def _workload_rank(workload: str) -> tuple[int, str]:
    # a workload's name is its test function's, less "test_"
    order = [test.removeprefix("test_") for _, test in GENERATIVE_WORKLOADS]
    return (order.index(workload) if workload in order else len(order), workload)


def span_text(span: Sequence[float] | None) -> str:
    """``[low, high]`` as one figure where they agree, else ``low-high``; n/a for None."""
    from harness.report.matrix import fmt_number  # noqa: PLC0415

    if span is None:
        return "n/a"
    low, high = (fmt_number(v) for v in span)
    return low if low == high else f"{low}-{high}"


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


def _conformance_engine(classname: str) -> str | None:
    cls = classname.rpartition(".")[2]
    matches = [p for p in CONFORMANCE_ENGINES if cls.startswith(p)]
    return CONFORMANCE_ENGINES[max(matches, key=len)] if matches else None


def add_conformance(reports: Mapping[str, EngineReport], junit: Path) -> int:
    """Conformance outcomes from pytest's junit file, per engine (the class names the mode);
    returns how many failed."""
    if not junit.is_file():
        return 0
    failed = 0
    # pytest's own junit file, written by this script a moment ago: not untrusted input
    for case in ET.parse(junit).getroot().iter("testcase"):  # noqa: S314
        engine = _conformance_engine(case.get("classname", ""))
        if engine is None or engine not in reports:
            continue
        report, mode = reports[engine], case.get("classname", "").rpartition(".")[2]
        outcome = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            report.passed += 1
        elif outcome.tag == "skipped":
            report.skip(f"{mode}: {_skip_reason(outcome.get('message', ''))}")
        else:
            report.failed.append(f"{mode}.{case.get('name')}: {outcome.get('message', '')}")
            failed += 1
    return failed


def _skip_reason(message: str) -> str:
    # pytest writes "path:line: reason" for skips raised in fixtures
    return message.split(": ", 1)[-1] if message.startswith(("/", "tests")) else message


def add_cells(reports: Mapping[str, EngineReport], records: Iterable[Any]) -> None:
    """Each recorded cell (a ``CellRecord``), by its engine and status; a cell that this
    check's stop interrupted is not reached, not failed."""
    for rec in records:
        report = reports.get(rec.engine)
        if report is None:
            continue
        why = rec.reasons[0] if rec.reasons else ""
        status = rec.status.value
        if status == "ok":
            report.cells_ok += 1
        elif status == "invalid":
            report.cells_invalid += 1
        elif status == "skipped":
            report.skip(f"cell: {why}")
        elif cut_short(report, rec):
            report.unmeasured(rec.workload)
        else:
            report.failed.append(f"{rec.cell_id} ({status}): {why}")


def cut_short(report: EngineReport, rec: Any) -> bool:
    """Whether ``rec`` is the cell in flight when this check stopped its engine's run."""
    reason = rec.reasons[0] if rec.reasons else ""
    return bool(report.stopped) and rec.status.value == "failed" and reason.startswith(INTERRUPTED)


def add_unreached(
    reports: Mapping[str, EngineReport], planned: Iterable[Any], records: Iterable[Any]
) -> None:
    """The planned cells (``PlannedCell``) that have no record: their run stopped first."""
    recorded = {r.cell_id for r in records}
    for cell in planned:
        if cell.engine in reports and cell.cell_id not in recorded:
            reports[cell.engine].unmeasured(cell.workload)


def generative_figures(rec: Any) -> dict[str, float | None]:
    """A generative cell's figures of record (``FIGURES``); None where it has none (energy
    on a machine without NVML, ITL in a phase summary). The generative precision workload
    records a phase per dtype: its figures are the reduced dtype's (``reduced.``)."""
    phase = "reduced." if rec.metric("ttft") is None and rec.metric("reduced.ttft") else ""
    out: dict[str, float | None] = {}
    for name, path, scale in FIGURES:
        value = rec.metric(path if path.startswith("energy.") else phase + path)
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        out[name] = float(value) * scale if is_number else None
    return out


def add_workloads(reports: Mapping[str, EngineReport], records: Iterable[Any]) -> None:
    """Per generative engine and workload: cells ok of those recorded, each figure's
    ``[low, high]`` over the ok cells (None where no ok cell has it) and, where no cell
    measured energy, the first cell's reason why."""
    for rec in records:
        report = reports.get(rec.engine)
        if report is None or report.family != "generative" or cut_short(report, rec):
            continue
        row = report.workloads.setdefault(rec.workload, _empty_row())
        row["cells"] += 1
        if rec.status.value != "ok":
            continue
        row["ok"] += 1
        for name, value in generative_figures(rec).items():
            if value is not None:
                low, high = row[name] or (value, value)
                row[name] = [min(low, value), max(high, value)]
        absent = (rec.metrics.get("energy") or {}).get("absent")
        if absent and row["j_per_output_token"] is None:
            row.setdefault("energy_absent", absent)


def _empty_row() -> dict[str, Any]:
    return {"cells": 0, "ok": 0} | {name: None for name, _, _ in FIGURES}


CELLS_FILE = "cells.json"


def cell_line(rec: Any) -> dict[str, Any]:
    """One cell (a ``CellRecord``) in a few hundred bytes: status, headline figures as the
    matrix shows them, a generative cell's figures of record, and its energy (or why there
    is none)."""
    from harness.report.matrix import fmt_number, headline_values  # noqa: PLC0415

    line: dict[str, Any] = {
        "cell": rec.cell_id,
        "engine": rec.engine,
        "workload": rec.workload,
        "status": rec.status.value,
    }
    if rec.status.value in ("ok", "invalid"):
        line["headline"] = " · ".join(
            f"{label} {'n/a' if v is None else fmt_number(v)} {unit}".strip()
            for label, unit, v in headline_values(rec)
        )
        line["reasons"] = list(rec.validity.reasons) if rec.validity else []
        if rec.metric("ttft") is not None or rec.metric("reduced.ttft") is not None:
            line["figures"] = {
                k: None if v is None else float(f"{v:.4g}")
                for k, v in generative_figures(rec).items()
            }
        line["energy"] = _energy(rec.metrics.get("energy") or {})
    else:
        line["reasons"] = [r[:300] for r in rec.reasons]
    return line


def _energy(energy: Mapping[str, Any]) -> dict[str, Any]:
    if "joules" not in energy:
        return {"absent": energy.get("absent", "not recorded")}
    out = {
        "joules": round(energy["joules"], 3),
        "mean_power_w": round(energy["joules"] / energy["window_s"], 1),
    }
    if energy.get("per_output_token_j") is not None:
        out["per_output_token_j"] = float(f"{energy['per_output_token_j']:.4g}")
    return out


def write_cells(path: Path, records: Iterable[Any]) -> None:
    """``cells.json``: a JSON list, one cell per line."""
    lines = [json.dumps(cell_line(r), default=str) for r in records]
    path.write_text("[\n" + ",\n".join(lines) + ("\n" if lines else "") + "]\n")


def verdict(reports: Mapping[str, EngineReport], run_failures: list[str]) -> tuple[int, str]:
    """The exit status and its one-line reason: a skip-only check never passes."""
    failed = [r.name for r in reports.values() if r.failed]
    if failed or run_failures:
        return EXIT_FAILED, "FAIL: " + "; ".join(
            [f"{', '.join(failed)} failed" if failed else "", *run_failures]
        ).strip("; ")
    ran = [r.name for r in reports.values() if r.cells_ok]
    if not ran:
        return EXIT_NOTHING_RAN, "FAIL: no engine ran a real cell on this device (all skipped)"
    stopped = [r.name for r in reports.values() if r.stopped]
    cut = f" (budget: {', '.join(stopped)} not finished)" if stopped else ""
    return EXIT_OK, f"PASS: {', '.join(ran)} ran real cells{cut}"


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
        "engines": {name: _engine_summary(r) for name, r in reports.items()},
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\ngpu-check: {why} (exit {code}; {args.out / 'summary.json'})", flush=True)


def _engine_summary(r: EngineReport) -> dict[str, Any]:
    out = {
        "verdict": r.verdict(),
        "family": r.family,
        "unavailable": r.unavailable,
        "conformance_passed": r.passed,
        "cells_ok": r.cells_ok,
        "cells_invalid": r.cells_invalid,
        "failed": r.failed,
        "skipped": r.skipped,
        "stopped": r.stopped,
        "not_reached": r.not_reached,
    }
    return out | ({"workloads": r.workloads} if r.family == "generative" else {})


if __name__ == "__main__":
    sys.exit(main())
