"""Reports of a fixed pair of runs stay byte-identical: the matrix (Markdown, CSV), the
HTML report and its plots, compare's and recommend's text and JSON.

The runs are committed (``tests/data/golden-runs.tar.xz``: two quick runs, A and B, each
an ONNX Runtime run of every tensor workload and a null-gen run of the generative ones);
the expected outputs beside them were written by the code before a refactor, so that a
change meant to move code and not behaviour is checked to the byte. Paths of the
temporary directory are written as ``<RUNS>``; the reports are built from inside it with
a home of their own, so the paths they publish (harness.report.publicpaths) are the same
on every machine. After a change that is meant to change
the output, rewrite them with ``HARNESS_GOLDEN_WRITE=1 pytest tests/test_golden_outputs.py``
and review the diff.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tarfile
from pathlib import Path

import matplotlib
import pytest

from harness import cli

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"
ARCHIVE = DATA / "golden-runs.tar.xz"
EXPECTED = DATA / "golden-expected"
SLO = "e2e_p99=10ms,ttft_p99=5ms"


def _runs(root: Path) -> dict[str, list[Path]]:
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(root, filter="data")
    return {side: sorted((root / "golden" / side).iterdir()) for side in ("A", "B")}


def _cli(*args: str | Path) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main([str(a) for a in args])
    return code, out.getvalue()


def produce(root: Path) -> dict[str, bytes]:
    """Every output of the reporting commands on the committed runs: file name -> bytes."""
    runs = _runs(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("HOME", str(root / "home"))
        raw = _produce(root, runs)
    return {name: data.replace(str(root).encode(), b"<RUNS>") for name, data in raw.items()}


def _produce(root: Path, runs: dict[str, list[Path]]) -> dict[str, bytes]:
    out: dict[str, str | bytes] = {}
    html = root / "html"
    code, _ = _cli("report", *runs["A"], "--html", "--out", html)
    out["report-html.exit"] = str(code)
    for path in sorted(p for p in html.rglob("*") if p.is_file()):
        out[f"html/{path.relative_to(html)}"] = path.read_bytes()
    for side, dirs in runs.items():
        for index, run in enumerate(dirs):
            code, text = _cli("report", run)
            out[f"report-{side}{index}.exit"] = str(code)
            out[f"matrix-{side}{index}.md"] = (run / "matrix.md").read_text()
            out[f"matrix-{side}{index}.csv"] = (run / "matrix.csv").read_text()
    for index in range(len(runs["A"])):
        target = root / f"compare-{index}.json"
        code, text = _cli("compare", runs["A"][index], runs["B"][index], "--json", target)
        out[f"compare-{index}.txt"] = f"exit {code}\n{text}"
        out[f"compare-{index}.json"] = target.read_text()
    target = root / "recommend.json"
    code, text = _cli("recommend", *runs["A"], *runs["B"], "--slo", SLO, "--json", target)
    out["recommend.txt"] = f"exit {code}\n{text}"
    out["recommend.json"] = target.read_text()
    return {k: v if isinstance(v, bytes) else v.encode() for k, v in out.items()}


def _write(produced: dict[str, bytes]) -> None:
    for name, data in produced.items():
        (EXPECTED / name).parent.mkdir(parents=True, exist_ok=True)
        (EXPECTED / name).write_bytes(data)
    index = {"matplotlib": matplotlib.__version__, "files": sorted(produced)}
    (EXPECTED / "index.json").write_text(json.dumps(index, indent=1) + "\n")


def test_reports_of_the_committed_runs_are_byte_identical(tmp_path):
    produced = produce(tmp_path)
    if os.environ.get("HARNESS_GOLDEN_WRITE") == "1":
        _write(produced)
        pytest.skip(f"wrote {len(produced)} expected outputs under {EXPECTED}")
    index = json.loads((EXPECTED / "index.json").read_text())
    assert sorted(produced) == index["files"]
    # another matplotlib draws other bytes: the plots are then compared by name only
    same_plotter = index["matplotlib"] == matplotlib.__version__
    for name in index["files"]:
        if same_plotter or "/plots/" not in name:
            assert produced[name] == (EXPECTED / name).read_bytes(), f"{name} differs"
