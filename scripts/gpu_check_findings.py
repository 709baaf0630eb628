"""What the GPU check found, per engine: conformance outcomes from pytest's junit file,
each recorded cell by its status, the planned cells no run reached, and for generative
engines each workload's figures of record; then the lines printed per engine,
``cells.json``, the summary per engine and the verdict with its exit status.
``scripts/gpu_check.py`` runs the steps; the harness is imported lazily, as there.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
window); ``pytest --engine=...`` runs them. The per-workload table keeps this order."""
# conformance classes (tests/test_gpu_conformance.py) -> the engine they test
CONFORMANCE_ENGINES = {
    "TestTorch": "torch",
    "TestOnnxRuntime": "onnxruntime",
    "TestTensorRT": "tensorrt",
    "TestTransformers": "transformers",
}
EXIT_OK, EXIT_FAILED, EXIT_MISSING, EXIT_NOTHING_RAN = 0, 1, 2, 3
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


def engine_summary(r: EngineReport) -> dict[str, Any]:
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
