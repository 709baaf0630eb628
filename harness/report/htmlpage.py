"""The self-contained HTML report of one or more runs, with its plots as files.

The page opens with the Decision (harness.report.decision): per question, the engine and
configuration to run, the runner-up and the margin, why every other one lost, and a
Pareto plot of rate against p99 latency; then the runs, the matrix and the other plots.

Nothing on the page is fetched at view time: styles are inline, plots are inline SVG,
and a cell's record opens in place (``<details>``), so the file can be mailed or
published as is. It is a pure function of the records: building twice gives the same
bytes. Beside it, ``plots/`` holds every plot as SVG and PNG for documents, and the
merged ``matrix.md`` / ``matrix.csv``. A record the page cannot be built from (a plot
finds a string where a number belongs) is damaged like an unreadable file: refused
naming it, or left out and listed with ``skip_damaged``. What is written names no
absolute path of the machine that built it (harness.report.publicpaths).
"""

from __future__ import annotations

import errno
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from harness.engine import installed_version
from harness.exceptions import WriteError
from harness.report import decision, paretoplot, plots, plotset, runset
from harness.report.matrix import (
    Entry,
    Matrix,
    entry_text,
    fmt_number,
    publish,
    to_csv,
    to_markdown,
    writing,
)
from harness.report.publicpaths import PathStyle
from harness.report.recommend.recommendtext import ci_text
from harness.results.reading import Damaged, RunContents, vet
from harness.results.records import CellRecord, Status, format_param

DRILL_DOWN_SLOW_REQUESTS = 5
"""Slow requests shown in a record's drill-down; the run directory has them all."""
PUBLISHED_MODE = 0o644
"""A report is for others to read (the atomic writer creates owner-only files)."""
DECIDE_AS_MEASURED = decision.Options()
"""The Decision under the SLO the runs were measured with, nothing priced."""


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    plots: tuple[plots.Plot, ...]


@dataclass(frozen=True)
class Written:
    html: Path
    plots: tuple[Path, ...]
    markdown: Path
    csv: Path
    skipped: tuple[Damaged, ...] = ()


def drill_down(record: CellRecord, run_environment: dict[str, Any] | None = None) -> str:
    """The record as indented JSON, raw samples and the telemetry and server series
    summarized, and the environment left out where it is the run's (shown once, in the
    runs table)."""
    data: dict[str, Any] = json.loads(record.model_dump_json())
    if record.report_spec is None:  # an older record: it declared nothing
        del data["report_spec"]
    if run_environment and record.environment == run_environment:
        data["environment"] = "the run's fingerprint (see Runs)"
    data["samples"] = {
        k: f"{len(v)} values (in the run directory)" for k, v in record.samples.items()
    }
    series = data.get("telemetry", {}).get("series")
    if isinstance(series, dict):
        data["telemetry"]["series"] = {k: f"{len(v)} values" for k, v in series.items()}
    server = data.get("metrics", {}).get("server")
    for key in ("series", "scheduled") if isinstance(server, dict) else ():
        part = server.get(key)
        if isinstance(part, dict):
            server[key] = {k: f"{len(v)} values" for k, v in part.items()}
        elif isinstance(part, list):
            server[key] = f"{len(part)} values"
    slow = data.get("slow_requests", [])
    if len(slow) > DRILL_DOWN_SLOW_REQUESTS:
        data["slow_requests"] = [*slow[:DRILL_DOWN_SLOW_REQUESTS], f"... {len(slow)} in all"]
    return json.dumps(data, indent=1, sort_keys=True, allow_nan=True)


def _entry(entry: Entry | None, environments: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    if entry is None:
        return None
    rec = entry.record
    warnings = list(rec.validity.warnings) if rec and rec.validity else []
    reasons = list(rec.reasons) if rec else ["no record: the run was interrupted?"]
    return {
        "status": entry.status,
        "verdict": rec.validity.verdict if rec and rec.validity else "",
        "warnings": warnings,
        "text": entry_text(entry),
        "tooltip": "; ".join(reasons + warnings) or "ok, valid",
        "record": drill_down(rec, environments.get(rec.run_id)) if rec else "",
    }


def _tables(matrix: Matrix, environments: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    tables = []
    for workload in matrix.workloads():
        rows = [r for r in matrix.rows if r.workload == workload]
        names = list(dict.fromkeys(k for r in rows for k, _ in r.params))
        columns = [c for c in matrix.engines if any(c in r.entries for r in rows)]
        tables.append(
            {
                "workload": workload,
                "params": names,
                "columns": columns,
                "rows": [
                    {
                        "params": [format_param(dict(r.params).get(n)) for n in names],
                        "entries": [_entry(r.entries.get(c), environments) for c in columns],
                    }
                    for r in rows
                ],
            }
        )
    return tables


def _warnings(matrix: Matrix) -> list[tuple[str, str]]:
    out = []
    for row in matrix.rows:
        for entry in row.entries.values():
            rec = entry.record
            if rec and rec.status is Status.OK and rec.validity and rec.validity.warnings:
                out.append((f"{entry.engine}: {rec.cell_id}", "; ".join(rec.validity.warnings)))
    return out


def _run_info(run: runset.Run) -> dict[str, str]:
    m = run.manifest
    versions = {r.engine: str(r.engine_info.get("version", "?")) for r in run.records}
    engines = ", ".join(
        f"{e} ({versions.get(e, 'no record')})" for e in m.settings.get("engines", [])
    )
    return {
        "id": m.run_id,
        "state": run.state,
        "created": m.created_at,
        "finished": m.finished_at or "-",
        "hardware": run.hardware,
        "engines": engines,
        "profile": str(m.settings.get("profile", "?")),
        "command": " ".join(m.command),
        "fingerprint": json.dumps(run.environment, indent=1, sort_keys=True),
    }


def _sections(figures: list[plots.Plot]) -> list[Section]:
    titles = list(dict.fromkeys(p.section for p in figures))
    return [
        Section(
            id="p-" + "".join(ch if ch.isalnum() else "-" for ch in t.lower()),
            title=t,
            plots=tuple(p for p in figures if p.section == t),
        )
        for t in titles
    ]


def render(
    runs: runset.RunSet,
    *,
    skip_damaged: bool = False,
    options: decision.Options = DECIDE_AS_MEASURED,
) -> tuple[str, list[plots.Plot]]:
    """The page and the plots it shows (the Decision's Pareto plots first)."""
    _, (page, figures, _) = _vetted(runs, skip_damaged, options, None)
    return page, figures


_Built = tuple[str, list[plots.Plot], runset.Merged]


def _vetted(
    runs: runset.RunSet, skip_damaged: bool, options: decision.Options, style: PathStyle | None
) -> tuple[runset.RunSet, _Built]:
    """The page built from ``runs`` less the records it cannot be built from; an SLO
    given that names no latency of the runs is refused first (a usage error, not a
    damaged record)."""
    decision.check_given_slos([r.contents for r in runs.runs], options)
    kept, built = vet(
        [r.contents for r in runs.runs],
        lambda contents: _build(contents, options, style),
        skip_damaged=skip_damaged,
    )
    return runset.of(kept), built


def _build(
    contents: Sequence[RunContents], options: decision.Options, style: PathStyle | None
) -> _Built:
    runs = runset.of(contents)
    merged = runset.merge(runs)
    verdict = decision.decide(contents, options)
    page, figures = _render(runs, merged, verdict, style)
    return page, figures, merged


def _pick_view(pick: decision.Pick | None) -> dict[str, str] | None:
    if pick is None:
        return None
    return {
        "name": pick.name,
        "engine": pick.engine,
        "configuration": pick.configuration,
        "figure": pick.figure,
        "rate": f"{fmt_number(pick.rate)} {pick.unit}",
        "ci": ci_text(pick.ci95).strip(),
        "details": pick.details,
        "energy": pick.energy,
        "pareto": pick.pareto,
    }


OVERLAP = {
    True: "their 95 % intervals overlap: the difference may be noise",
    False: "their 95 % intervals do not overlap",
    None: "no 95 % interval to tell them apart by",
}


def _question_view(q: decision.Question, figures: dict[str, plots.Plot]) -> dict[str, Any]:
    return {
        "id": q.id,
        "title": q.title,
        "machine": q.machine,
        "slos": q.slos,
        "alone": "meets the SLO" if q.slo_applied else "can be recommended",
        "ranked_by": q.ranked_by,
        "pick": _pick_view(q.pick),
        "no_pick": q.no_pick,
        "runner_up": _pick_view(q.runner_up),
        "margin": q.margin,
        "overlap": OVERLAP[q.overlap] if q.runner_up is not None else "",
        "lost": q.lost,
        "energy_note": q.energy_note,
        "plot": figures.get(q.plot) if q.plot is not None else None,
        "off_plot": q.off_plot,
    }


def _render(
    runs: runset.RunSet,
    merged: runset.Merged,
    verdict: decision.Decision,
    style: PathStyle | None,
) -> tuple[str, list[plots.Plot]]:
    # a question's title may name --model's path: a PNG's pixels cannot be rewritten later
    fronts = paretoplot.pareto_plots(verdict, style.text if style is not None else str)
    by_name = {p.name: p for p in fronts}
    figures = plotset.all_plots(runs)
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("harness", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    ids = ", ".join(r.manifest.run_id for r in runs.runs)
    page = env.get_template("report.html.j2").render(
        title=f"Inference harness report: {ids}",
        version=installed_version("inference-harness") or "source tree",
        state=merged.matrix.state,
        mixed=runs.mixed,
        hardware=runs.hardware,
        runs=[_run_info(r) for r in runs.runs],
        replaced=merged.replaced,
        skipped=[(str(d.path), d.why) for d in runs.skipped],
        tables=_tables(merged.matrix, {r.manifest.run_id: r.environment for r in runs.runs}),
        warnings=_warnings(merged.matrix),
        sections=_sections(figures),
        decision={
            "slo": verdict.slo,
            "notes": verdict.notes,
            "questions": [_question_view(q, by_name) for q in verdict.questions],
        },
    )
    return page, [*fronts, *figures]


def write(
    runs: runset.RunSet,
    out_dir: Path,
    *,
    skip_damaged: bool = False,
    options: decision.Options = DECIDE_AS_MEASURED,
) -> Written:
    """Write report.html, plots/*.svg|png and the merged matrix.md / matrix.csv, each path
    in them as published from here (PathStyle.here()). ``options``: the SLO and prices
    the Decision is reckoned with (default: the SLO the runs were measured with).

    Raises RecordError (naming each damaged file) when the runs cannot be reported and
    ``skip_damaged`` is not given, report.WriteError when ``out_dir`` cannot be written.
    """
    style = PathStyle.here()
    kept, (page, figures, merged) = _vetted(runs, skip_damaged, options, style)
    plot_dir = out_dir / "plots"
    _make_dir(out_dir, plot_dir)
    files = _write_plots(plot_dir, figures, style)
    html = out_dir / "report.html"
    publish(html, style.text(page).encode())
    matrix = merged.matrix
    md, csv_path = out_dir / "matrix.md", out_dir / "matrix.csv"
    publish(md, style.text(to_markdown(matrix)).encode())
    publish(csv_path, style.text(to_csv(matrix)).encode())
    for path in (html, md, csv_path, *files):
        with writing(path):
            path.chmod(PUBLISHED_MODE)
    return Written(html, tuple(files), md, csv_path, kept.skipped)


def _make_dir(out_dir: Path, plot_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise WriteError(
            errno.ENOTDIR, f"cannot write the report in {out_dir}: it is a file, not a directory"
        )
    with writing(plot_dir):
        plot_dir.mkdir(parents=True, exist_ok=True)


def _write_plots(plot_dir: Path, figures: Sequence[plots.Plot], paths: PathStyle) -> list[Path]:
    files: list[Path] = []
    for fig in figures:
        for suffix, data in ((".svg", paths.text(fig.svg).encode()), (".png", fig.png)):
            path = plot_dir / f"{fig.name}{suffix}"
            publish(path, data)
            files.append(path)
    # a plot the records no longer give must not linger beside the page
    for stale in sorted(set(plot_dir.glob("*.svg")) | set(plot_dir.glob("*.png"))):
        if stale not in files:
            with writing(stale):
                stale.unlink()
    return files
