"""What a run says at its end on the terminal: its matrix as plain text, its tally, its
incidents, and why its exit status is not pytest's own."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from harness.exceptions import RecordError
from harness.report import matrixterm
from harness.results import reading
from harness.results.records import Status
from harness.results.redact import redact_text
from harness.session.outcome import RunExit
from harness.session.state import RunState


def write(terminalreporter: Any, state: RunState) -> None:
    """The harness's section of pytest's terminal summary for the run ``state`` holds."""
    counts: dict[str, int] = {}
    for status in state.written.values():
        counts[status.value] = counts.get(status.value, 0) + 1
    tally = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no cells finished"
    terminalreporter.section("harness result matrix")
    if (state.run_dir / "matrix.md").is_file():
        terminalreporter.write(_terminal_matrix(state.run_dir, terminalreporter))
    terminalreporter.write_line(f"cells: {tally}")
    for text in state.incidents:
        terminalreporter.write_line(redact_text(f"INCIDENT: {text}"), red=True)
    if state.missing:
        terminalreporter.write_line(
            "resume: planned cells not collected this time: " + ", ".join(state.missing)
        )
    if state.fatal_error:
        terminalreporter.write_line(redact_text(f"RUN STOPPED: {state.fatal_error}"), red=True)
    terminalreporter.write_line(f"run directory: {state.run_dir}")
    _explain_exit(terminalreporter, state)


def _terminal_matrix(run_dir: Path, terminalreporter: Any) -> str:
    """The run's matrix as plain text as wide as the terminal (matrix.md is Markdown)."""
    writer = getattr(terminalreporter, "_tw", None)
    width = int(writer.fullwidth) if writer is not None else matrixterm.DEFAULT_WIDTH
    try:
        return matrixterm.terminal_table(run_dir, width, skip_damaged=True)
    except (OSError, RecordError) as exc:
        return f"(the matrix could not be read back: {exc}; see {run_dir / 'matrix.md'})\n"


def _commonest_skip(run_dir: Path) -> str:
    """The reason most skipped cells give, read back from their records."""
    try:
        contents = reading.read_run_dir(run_dir, skip_damaged=True)
    except (OSError, RecordError):
        return "(the records could not be read)"
    reasons = Counter(r.reasons[0] for rs in contents.repeats.values() for r in rs if r.reasons)
    if not reasons:
        return "(no reason recorded)"
    reason, n = reasons.most_common(1)[0]
    return f"{reason} ({n} cell(s))"


def _explain_exit(terminalreporter: Any, state: RunState) -> None:
    """Say why a run that pytest would call passed exits non-zero."""
    missing = state.unrecorded
    invalid = sorted(c for c, s in state.written.items() if s is Status.INVALID)
    if missing and not state.missing:  # resume already listed the ones not collected
        terminalreporter.write_line(
            f"INCOMPLETE: {len(missing)} planned cell(s) have no record: " + ", ".join(missing),
            red=True,
        )
    if missing:
        terminalreporter.write_line(
            f"exit status {int(RunExit.INCOMPLETE)} unless a worse one applies; finish the run"
            f" with --resume {state.run_dir}",
            red=True,
        )
    if invalid:
        terminalreporter.write_line(
            f"INVALID: {len(invalid)} cell(s) measured outside the profile's bounds (exit status"
            f" {int(RunExit.INVALID)} unless a worse one applies): " + ", ".join(invalid),
            yellow=True,
        )
    if state.written and set(state.written.values()) == {Status.SKIPPED}:
        terminalreporter.write_line(
            f"NOTHING MEASURED: all {len(state.written)} cell(s) skipped (exit status"
            f" {int(RunExit.NOTHING_MEASURED)}); most often: {_commonest_skip(state.run_dir)}",
            red=True,
        )
