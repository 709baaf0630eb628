"""Builders of valid records and manifests for tests."""

from __future__ import annotations

from typing import Any, Literal

from harness.results.records import (
    CellRecord,
    Headline,
    Manifest,
    PlannedCell,
    Status,
    ValidityInfo,
)


def record(
    cell_id: str = "batching.fake.rate=10",
    *,
    run_id: str = "run-1",
    engine: str = "fake",
    status: Status = Status.OK,
    p50: float = 0.002,
    **extra: Any,
) -> CellRecord:
    measured = status in (Status.OK, Status.INVALID)
    fields: dict[str, Any] = {
        "run_id": run_id,
        "cell_id": cell_id,
        "workload": "batching",
        "engine": engine,
        "params": {"rate": 10.0, "mode": "static"},
        "status": status,
        "started_at": "2026-01-01T00:00:00.000Z",
        "finished_at": "2026-01-01T00:00:01.000Z",
        "duration_s": 1.0,
        "headline": (Headline(label="p50", metric="e2e.p50", unit="ms", scale=1e3),),
    }
    if measured:
        fields["metrics"] = {"e2e": {"p50": p50, "adjusted": {"p99": float("inf")}}}
        fields["samples"] = {"e2e": [p50, p50]}
        fields["validity"] = (
            ValidityInfo(verdict="valid")
            if status is Status.OK
            else ValidityInfo(verdict="invalid", reasons=("too few samples",))
        )
        if status is Status.INVALID:
            fields["reasons"] = ("too few samples",)
    else:
        fields["reasons"] = (f"it {status.value}",)
    fields.update(extra)
    return CellRecord(**fields)


def manifest(
    cells: list[tuple[str, str, dict[str, Any]]],
    *,
    run_id: str = "run-1",
    state: Literal["running", "complete", "incomplete"] = "complete",
) -> Manifest:
    planned = tuple(
        PlannedCell(
            cell_id=cid, workload="batching", engine=engine, params=params, nodeid=f"t::{cid}"
        )
        for cid, engine, params in cells
    )
    return Manifest(
        run_id=run_id, state=state, created_at="2026-01-01T00:00:00.000Z", planned=planned
    )
