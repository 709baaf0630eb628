"""Readers of run directories (report, report --html, compare, recommend) on damaged,
foreign and unwritable results: an error naming the file and why, exit 2, never a
traceback; ``--skip-damaged`` reports the rest and lists what it left out; a killed
controller's run reads as interrupted (issue 16, items 3, 4, 8, 9, 10)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import cli
from harness.exceptions import RecordError, StorageError
from harness.report import matrix
from harness.report.publicpaths import PathStyle
from harness.results import lock, store
from harness.results.records import Status
from tests.support.records_factory import manifest, record
from tests.test_recommend import batching_run, build, served

ENV = {"cpu": {"model": "Test CPU", "logical_cores": 4}, "memory_bytes": 2**34}
CELLS = ("b.e.r=1", "b.e.r=2")
SLO = ["--slo", "e2e_p99=50ms"]


def published(path: Path) -> str:
    """``path`` as recommend's output (a published recommendation) names it."""
    return PathStyle.here().path(path)


def small_run(root: Path, *, state: Any = "complete", histograms: Any = None) -> Path:
    """Two ok cells of engine ``e`` (p50 2 ms), with a machine fingerprint."""
    run = store.new_run_dir(root)
    plan = [(c, "e", {"r": i + 1}) for i, c in enumerate(CELLS)]
    m = manifest(plan, run_id=run.name, state=state).model_copy(update={"environment": ENV})
    store.write_manifest(run, m)
    for cell, engine, params in plan:
        extra: dict[str, Any] = {"histograms": {"batch_size": histograms}} if histograms else {}
        store.write_record(
            run, record(cell, run_id=run.name, engine=engine, params=params, **extra)
        )
    return run


def main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The CLI in-process: an exception escaping it fails the test (it would be a traceback)."""
    code = cli.main(argv)
    return code, " ".join(capsys.readouterr().out.split())


def cell_file(run: Path, cell: str = CELLS[0]) -> Path:
    return run / store.CELLS / f"{cell}.json"


def edit(path: Path, change: Any) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# --- item 4: records from another run or outside the plan -----------------------------


def test_a_record_copied_from_another_run_is_refused_by_every_reader(tmp_path, capsys):
    run, other = small_run(tmp_path / "a"), small_run(tmp_path / "b")
    shutil.copy(cell_file(other), cell_file(run))  # same cell, another run's measurement
    planted = cell_file(run)
    for argv in (
        ["report", str(run)],
        ["report", str(run), "--html", "--out", str(tmp_path / "html")],
        ["compare", str(other), str(run)],
        ["recommend", str(run), *SLO],
    ):
        code, out = main(argv, capsys)
        assert code == 2, argv
        assert f"{planted}: holds a record of run '{other.name}', not of this run" in out
        assert "--skip-damaged" in out
    assert not (tmp_path / "html").exists()


def test_a_record_outside_the_plan_is_refused_not_shown_after_it(tmp_path, capsys):
    run = small_run(tmp_path)
    stray = record("b.e.r=9", run_id=run.name, engine="e", params={"r": 9}, p50=0.5)
    path = store.write_record(run, stray)
    code, out = main(["report", str(run)], capsys)
    assert code == 2
    assert f"{path}: cell 'b.e.r=9' is not in this run's plan" in out
    code, out = main(["report", str(run), "--skip-damaged"], capsys)
    assert code == 0
    md = (run / "matrix.md").read_text()
    assert "500 ms" not in md  # the stray figure is nowhere in the matrix
    assert "| 9 |" not in md
    assert "## Skipped damaged files" in md
    assert "cell 'b.e.r=9' is not in this run's plan" in md


def test_recommend_ranks_no_planted_duplicate(tmp_path, capsys):
    run = batching_run(tmp_path)
    # a copy of fast/dynamic under a cell id of its own: the same measurement twice
    src = cell_file(run, "batching.fast.rate=1000.0.mode=dynamic")
    copy = cell_file(run, "batching.fast.rate=1000.0.mode=dynamic.copy=1")
    copy.write_text(src.read_text().replace("mode=dynamic", "mode=dynamic.copy=1"))
    code, out = main(["recommend", str(run), *SLO], capsys)
    assert code == 2
    assert f"{copy}: cell 'batching.fast.rate=1000.0.mode=dynamic.copy=1' is not in this" in out
    code, out = main(["recommend", str(run), *SLO, "--skip-damaged"], capsys)
    assert code == 0
    assert "RECOMMENDED: fast mode=dynamic: goodput 1000 req/s" in out
    assert "runner-up: fast mode=static" in out  # not the copy of the winner
    # the decision, the recommendation, and once in the ranking
    assert out.count("goodput 1000 req/s") == 3
    shown = published(copy)
    assert f"skipped 1 damaged file(s) (--skip-damaged); not in this report: {shown}:" in out


def test_a_foreign_record_in_a_missing_cell_is_never_recommended(tmp_path, capsys):
    run = batching_run(tmp_path)
    better = build(
        "batching",
        "fast",
        {"rate": 1000.0, "mode": "none"},  # planned in run-a, never written there
        run_id="run-b",
        **served([0.005] * 1200),
    )
    path = store.write_record(run, better)
    code, out = main(["recommend", str(run), *SLO, "--skip-damaged"], capsys)
    assert code == 0
    assert "RECOMMENDED: fast mode=dynamic" in out
    assert f"{published(path)}: holds a record of run 'run-b'" in out


# --- item 8: outputs that cannot be written -------------------------------------------


def test_report_into_a_run_dir_it_cannot_write_is_an_error(tmp_path, capsys):
    run = small_run(tmp_path)
    (run / "matrix.md").mkdir()  # in the way of the report, whoever runs it
    code, out = main(["report", str(run)], capsys)
    assert code == 2
    assert f"error: cannot write {run / 'matrix.md'}: Is a directory" in out


def test_report_on_a_read_only_file_system_is_an_error(tmp_path, capsys, monkeypatch):
    run = small_run(tmp_path)

    def read_only(**kwargs: Any) -> Any:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(kwargs["dir"]))

    monkeypatch.setattr(store.tempfile, "mkstemp", read_only)
    code, out = main(["report", str(run)], capsys)
    assert code == 2
    assert f"error: cannot write {run / 'matrix.md'}: Read-only file system" in out
    # the end-of-run report fails as a record write does: a StorageError, with the file
    with pytest.raises(StorageError, match=r"cannot write .*matrix\.md: Read-only"):
        matrix.write(run)
    code, out = main(["report", str(run), "--html", "--out", str(tmp_path / "out")], capsys)
    assert code == 2
    assert "Read-only file system" in out
    assert str(tmp_path / "out") in out


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_report_on_a_read_only_run_dir_is_an_error(tmp_path, capsys):
    run = small_run(tmp_path)
    run.chmod(0o555)
    try:
        code, out = main(["report", str(run)], capsys)
    finally:
        run.chmod(0o755)
    assert code == 2
    assert f"error: cannot write {run / 'matrix.md'}: Permission denied" in out


def test_html_report_into_a_file_is_an_error(tmp_path, capsys):
    run = small_run(tmp_path)
    taken = tmp_path / "report.txt"
    taken.write_text("mine")
    code, out = main(["report", str(run), "--html", "--out", str(taken)], capsys)
    assert code == 2
    assert f"cannot write the report in {taken}: it is a file, not a directory" in out
    assert taken.read_text() == "mine"
    code, out = main(["report", str(run), "--html", "--out", str(taken / "sub")], capsys)
    assert code == 2
    assert f"cannot write {taken / 'sub' / 'plots'}: Not a directory" in out


def test_compare_and_recommend_json_into_a_directory_is_an_error(tmp_path, capsys):
    base, new = small_run(tmp_path / "a"), small_run(tmp_path / "b")
    taken = tmp_path / "taken"
    taken.mkdir()
    code, out = main(["compare", str(base), str(new), "--json", str(taken)], capsys)
    assert code == 2
    assert f"error: cannot write {taken}: Is a directory" in out
    code, out = main(["recommend", str(base), *SLO, "--json", str(taken)], capsys)
    assert code == 2
    assert f"error: cannot write {taken}: Is a directory" in out


# --- item 9: files that cannot be read or reported ------------------------------------


@pytest.mark.slow
def test_nan_in_a_figure_is_reported_as_nan(tmp_path):
    run = small_run(tmp_path)
    edit(cell_file(run), lambda d: d["metrics"]["e2e"].update(p50="NaN"))
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "report", str(run)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert "| 1 | p50 nan ms |" in (run / "matrix.md").read_text()


def test_numbers_that_are_not_finite_are_words():
    assert matrix.fmt_number(float("nan")) == "nan"
    assert matrix.fmt_number(float("inf")) == "inf"
    assert matrix.fmt_number(float("-inf")) == "-inf"


def _plant_dir(run: Path) -> Path:
    path = run / store.CELLS / "x.json"
    path.mkdir()
    return path


def _plant_dangling_link(run: Path) -> Path:
    path = run / store.CELLS / "gone.json"
    path.symlink_to(run / "nowhere.json")
    return path


def _truncate(run: Path) -> Path:
    path = cell_file(run)
    path.write_bytes(path.read_bytes()[:100])
    return path


def _empty(run: Path) -> Path:
    path = cell_file(run)
    path.write_bytes(b"")
    return path


def _headline_at_dict(run: Path) -> Path:
    edit(cell_file(run), lambda d: d["metrics"].update(e2e={"p50": {"value": 1}}))
    return cell_file(run)


def _headline_at_string(run: Path) -> Path:
    edit(cell_file(run), lambda d: d["metrics"]["e2e"].update(p50="fast"))
    return cell_file(run)


def _wrong_type(run: Path) -> Path:
    edit(cell_file(run), lambda d: d.update(duration_s="long"))
    return cell_file(run)


DAMAGE = {
    "directory": (_plant_dir, "cannot read it: Is a directory"),
    "dangling link": (_plant_dangling_link, "cannot read it: No such file or directory"),
    "truncated": (_truncate, "corrupt results file (not JSON"),
    "empty": (_empty, "corrupt results file (not JSON"),
    "headline at a dict": (
        _headline_at_dict,
        "headline 'p50' (metrics.e2e.p50) is dict {'value': 1}, not a number",
    ),
    "headline at a string": (
        _headline_at_string,
        "headline 'p50' (metrics.e2e.p50) is str 'fast', not a number",
    ),
    "wrong type": (_wrong_type, "invalid CellRecord"),
}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("command", ["report", "compare", "recommend"])
def test_a_damaged_file_is_named_and_can_be_skipped(tmp_path, capsys, damage, command):
    good, run = small_run(tmp_path / "good"), small_run(tmp_path / "run")
    plant, why = DAMAGE[damage]
    path = plant(run)
    argv = {
        "report": ["report", str(run)],
        "compare": ["compare", str(good), str(run), "--allow-missing"],
        "recommend": ["recommend", str(run), *SLO],
    }[command]
    code, out = main(argv, capsys)
    assert code == 2
    assert f"damaged results file refused: {path}: {why}" in out
    assert "--skip-damaged reports the rest" in out
    code, out = main([*argv, "--skip-damaged"], capsys)
    assert code in (0, 3)  # 3: recommend finds no throughput to rank these cells by
    shown = published(path) if command == "recommend" else path
    assert f"skipped 1 damaged file(s) (--skip-damaged); not in this report: {shown}: {why}" in out


def test_a_record_the_plots_cannot_draw_is_damaged_for_the_html_report(tmp_path, capsys):
    run = small_run(tmp_path / "r", histograms={"1": 3, "one": 4})  # int("one") in the plot
    out_dir = tmp_path / "html"
    code, out = main(["report", str(run)], capsys)
    assert code == 0  # the matrix shows no histogram: nothing damaged for it
    code, out = main(["report", str(run), "--html", "--out", str(out_dir)], capsys)
    assert code == 2
    first, second = (cell_file(run, c) for c in CELLS)
    assert "2 damaged results files refused:" in out
    assert f"{first}: cannot be reported: ValueError: invalid literal for int()" in out
    assert f"{second}: cannot be reported: ValueError" in out
    assert not out_dir.exists()


# --- item 10: fail closed by default, --skip-damaged reports the rest -----------------


def test_every_damaged_file_of_every_run_is_named_at_once(tmp_path, capsys):
    a, b = small_run(tmp_path / "a"), small_run(tmp_path / "b")
    bad = [_empty(a), _plant_dir(b)]
    code, out = main(["report", str(a), str(b), "--html", "--out", str(tmp_path / "o")], capsys)
    assert code == 2
    assert "2 damaged results files refused:" in out
    assert all(str(p) in out for p in bad)


def test_skip_damaged_lists_what_it_left_out_in_what_it_writes(tmp_path, capsys):
    good, run = small_run(tmp_path / "good"), small_run(tmp_path / "run")
    junk, truncated = _plant_dir(run), _truncate(run)
    damaged = (junk, truncated)
    listed = [f"{junk}: cannot read it: Is a directory", f"{truncated}: corrupt results file"]

    assert main(["report", str(run), "--skip-damaged"], capsys)[0] == 0
    md = (run / "matrix.md").read_text()
    assert "**2 damaged file(s) left out: see Skipped damaged files.**" in md
    assert "| 1 | MISSING (no record: interrupted?) |" in md  # the truncated cell
    section = md[md.index("## Skipped damaged files") :]
    assert all(line.replace("_", "\\_") in section for line in listed)

    html_dir = tmp_path / "html"
    argv = ["report", str(run), "--html", "--out", str(html_dir), "--skip-damaged"]
    assert main(argv, capsys)[0] == 0
    page = (html_dir / "report.html").read_text()
    assert '<h2 id="skipped">Skipped damaged files</h2>' in page
    assert f"<li><code>{published(junk)}</code>: cannot read it: Is a directory</li>" in page
    assert "## Skipped damaged files" in (html_dir / "matrix.md").read_text()

    out_json = tmp_path / "compare.json"
    argv = ["compare", str(good), str(run), "--skip-damaged", "--json", str(out_json)]
    code, out = main(argv, capsys)
    assert code == 2  # the truncated cell has no counterpart: fails closed
    assert "only in BASE" in out
    assert all(line in out for line in listed)
    code, out = main([*argv, "--allow-missing"], capsys)
    assert code == 0
    skipped = json.loads(out_json.read_text())["skipped"]
    assert [s["path"] for s in skipped] == [str(truncated), str(junk)]  # by file name

    rec_json = tmp_path / "recommend.json"
    argv = ["recommend", str(run), *SLO, "--skip-damaged", "--json", str(rec_json)]
    code, out = main(argv, capsys)
    assert all(
        line.replace(str(p), published(p)) in out for line, p in zip(listed, damaged, strict=True)
    )
    skipped = json.loads(rec_json.read_text())["skipped"]
    assert [s["path"] for s in skipped] == [published(truncated), published(junk)]


def test_the_end_of_run_report_raises_a_record_error_naming_the_file(tmp_path):
    run = small_run(tmp_path)
    path = _plant_dir(run)
    with pytest.raises(RecordError, match=f"refused: {path}: cannot read it"):
        matrix.write(run)


# --- item 3 (readers): a run whose controller was killed ------------------------------


def test_a_running_manifest_without_a_live_owner_reads_as_interrupted(tmp_path, capsys):
    run = small_run(tmp_path, state="running")
    code, out = main(["report", str(run)], capsys)
    assert code == 0
    md = (run / "matrix.md").read_text()
    assert (
        "**Run is interrupted: its controller is gone (resume it with pytest ... --resume"
        f" {run}): some planned cells have no record.**"
    ) in md
    code, out = main(["recommend", str(run), *SLO], capsys)
    resume = f"(resume it with pytest ... --resume {published(run)})"
    assert f"(run is interrupted: its controller is gone {resume}: cells may be missing)" in out
    assert main(["report", str(run), "--html", "--out", str(tmp_path / "o")], capsys)[0] == 0
    page = (tmp_path / "o" / "report.html").read_text()
    assert "<td>interrupted: its controller is gone" in page


def test_a_running_manifest_with_a_live_owner_reads_as_running(tmp_path, capsys):
    run = small_run(tmp_path, state="running")
    held = lock.acquire(run, "2026-01-01T00:00:00Z")
    try:
        assert main(["report", str(run)], capsys)[0] == 0
    finally:
        held.release()
    md = (run / "matrix.md").read_text()
    assert f"**Run is running (pid {os.getpid()}): some planned cells have no record.**" in md
    assert main(["report", str(run)], capsys)[0] == 0  # the owner has gone since
    assert "**Run is interrupted: its controller is gone" in (run / "matrix.md").read_text()


def test_resume_reads_refuse_a_planted_record(tmp_path):
    from harness.results import reading  # noqa: PLC0415

    run = small_run(tmp_path)
    edit(cell_file(run), lambda d: d.update(run_id="elsewhere"))
    with pytest.raises(reading.DamagedRunError, match="not of this run"):
        reading.read_run_dir(run)
    contents = reading.read_run_dir(run, skip_damaged=True)
    assert [r.cell_id for r in contents.records] == [CELLS[1]]
    assert [d.path for d in contents.skipped] == [cell_file(run)]
    assert contents.records[0].status is Status.OK
