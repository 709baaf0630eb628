"""GPU check: what the harness can run on this machine's GPU, with the packages it has.

Prints the environment fingerprint and every engine's availability, runs the conformance
suite (tests/test_gpu_conformance.py) and a quick profile of the workloads for every
engine that can run on the device (tensor engines: batching, shapes, preprocessing,
precision and the load workloads; generative engines: streaming), then prints per engine
what ran, what was skipped and why, and what failed. Writes its run directories,
summary.json and cells.json (one line per cell: status, headline figures, energy; a few
kilobytes, to read back from a remote machine) under --out. Installs nothing.

    scripts/gpu-check [--device cuda] [--out DIR] [--budget-s 480]

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
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
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
LLM_WORKLOADS = "test_streaming.py"
# conformance classes (tests/test_gpu_conformance.py) -> the engine they test
CONFORMANCE_ENGINES = {
    "TestTorch": "torch",
    "TestOnnxRuntime": "onnxruntime",
    "TestTensorRT": "tensorrt",
}
# engines that measure a server started elsewhere: this check starts none
SERVER_CLIENTS = {"openai": "a client of a server started elsewhere; gpu-check starts none"}
EXIT_OK, EXIT_FAILED, EXIT_MISSING, EXIT_NOTHING_RAN = 0, 1, 2, 3


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
        out += [f"{'':<23}failed: {what}" for what in self.failed]
        out += [f"{'':<23}skipped x{n}: {why}" for why, n in sorted(self.skipped.items())]
        return out

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def _say(text: str) -> None:
    print(f"\n=== gpu-check: {text}", flush=True)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
    )
    return env


def _run(args: list[str], env: dict[str, str], timeout: float) -> int:
    print("$", " ".join(args), flush=True)
    try:
        return subprocess.run(
            args, cwd=REPO, env=env, timeout=max(timeout, 30), check=False
        ).returncode
    except subprocess.TimeoutExpired:
        print(f"gpu-check: stopped after {timeout:.0f} s (budget)")
        return 124


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
        if engine not in reports:
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
    """Each recorded cell (a ``CellRecord``), by its engine and status."""
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
        else:
            report.failed.append(f"{rec.cell_id} ({status}): {why}")


CELLS_FILE = "cells.json"


def cell_line(rec: Any) -> dict[str, Any]:
    """One cell (a ``CellRecord``) in a few hundred bytes: status, headline figures as the
    matrix shows them, and its energy (or why there is none)."""
    from harness.report.matrix import fmt_number, headline_values  # noqa: PLC0415

    line: dict[str, Any] = {"cell": rec.cell_id, "engine": rec.engine, "status": rec.status.value}
    if rec.status.value in ("ok", "invalid"):
        line["headline"] = " · ".join(
            f"{label} {'n/a' if v is None else fmt_number(v)} {unit}".strip()
            for label, unit, v in headline_values(rec)
        )
        line["reasons"] = list(rec.validity.reasons) if rec.validity else []
        energy = rec.metrics.get("energy") or {}
        line["energy"] = (
            {
                "joules": round(energy["joules"], 3),
                "mean_power_w": round(energy["joules"] / energy["window_s"], 1),
            }
            if "joules" in energy
            else {"absent": energy.get("absent", "not recorded")}
        )
    else:
        line["reasons"] = [r[:300] for r in rec.reasons]
    return line


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
    return EXIT_OK, f"PASS: {', '.join(ran)} ran real cells"


def _pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider"]


def _workloads(
    args: argparse.Namespace, engines: list[str], selection: str, runs: Path
) -> list[str]:
    return _pytest(
        "workloads",
        f"--engine={','.join(engines)}",
        f"--device={args.device}",
        "--profile=quick",
        f"--window={args.window}",
        f"--results-dir={runs}",
        "-k",
        selection,
    )


def _run_workloads(
    args: argparse.Namespace,
    reports: Mapping[str, EngineReport],
    env: dict[str, str],
    left: Callable[[], float],
) -> tuple[list[str], list[Path]]:
    """Workload runs, one per family that has a runnable engine; returns the failures and
    the run directories this check wrote (never an earlier check's, left under --out)."""
    runs = args.out / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    failures: list[str] = []
    for family, selection in (("tensor", args.workloads), ("generative", args.llm_workloads)):
        names = [r.name for r in reports.values() if r.family == family and not r.unavailable]
        if not names:
            continue
        _say(f"quick {family} workloads on {', '.join(names)}")
        code = _run(_workloads(args, names, selection, runs), env, left() - 15)
        # 10: some cells were measured but invalid; 12: every cell skipped (both listed per
        # engine, and the verdict counts cells); neither is a crash
        if code not in (0, 10, 12):
            failures.append(f"the {family} workload run exited {code}")
    written = set(runs.iterdir()) - before if runs.is_dir() else set()
    return failures, sorted(p for p in written if p.is_dir())


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=REPO / "results" / "gpu-check")
    p.add_argument("--budget-s", type=float, default=480.0, help="whole check (default 480)")
    p.add_argument("--window", type=float, default=1.5, help="measured window per cell (s)")
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

    _say("conformance suite")
    junit = args.out / "conformance.xml"
    junit.unlink(missing_ok=True)
    conformance = _run(
        _pytest("tests/test_gpu_conformance.py", "-q", "-rs", f"--junitxml={junit}"),
        env,
        left() * 0.4,
    )
    failures, run_dirs = _run_workloads(args, reports, env, left)
    # a failed test is listed under its engine; any other non-zero exit is the run's own
    if add_conformance(reports, junit) == 0 and conformance not in (0, 5):
        failures.insert(0, f"the conformance run exited {conformance}")
    from harness.results import store  # noqa: PLC0415

    records = [r for run_dir in run_dirs for r in store.read_records(run_dir)]
    add_cells(reports, records)
    write_cells(args.out / CELLS_FILE, records)
    code, why = verdict(reports, failures)
    _summarize(args, reports, (code, why), run_dirs, time.monotonic() - start)
    return code


def _summarize(
    args: argparse.Namespace,
    reports: Mapping[str, EngineReport],
    outcome: tuple[int, str],
    run_dirs: list[Path],
    seconds: float,
) -> None:
    code, why = outcome
    _say(f"per engine on {args.device}")
    for report in reports.values():
        print("\n".join(report.lines()))
    summary = {
        "device": args.device,
        "exit": code,
        "verdict": why,
        "seconds": round(seconds, 1),
        "run_dirs": [str(d) for d in run_dirs],
        "cells": str(args.out / CELLS_FILE),
        "engines": {
            name: {
                "verdict": r.verdict(),
                "unavailable": r.unavailable,
                "conformance_passed": r.passed,
                "cells_ok": r.cells_ok,
                "cells_invalid": r.cells_invalid,
                "failed": r.failed,
                "skipped": r.skipped,
            }
            for name, r in reports.items()
        },
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\ngpu-check: {why} (exit {code}; {args.out / 'summary.json'})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
