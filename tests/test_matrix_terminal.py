"""The result matrix for each medium (issue 35, item 4): the terminal gets plain text,
matrix.md Markdown (escaped for it), never one medium's escapes in the other."""

from __future__ import annotations

import re

import pytest

from harness import cli
from harness.report import matrix, matrixterm
from harness.results import store
from harness.results.records import Headline, Status, ValidityInfo
from tests.support.records_factory import manifest, record

REASON = "Timeout (>3.0s) & p < 1e-16 in [bold]x[/bold] :smile: a|b *c* d_e `f`"
WARNING = "latency trends: p < 1e-16 over [1, 2]"


def odd_run(tmp_path):
    """A run whose texts hold every character one medium or another escapes."""
    run = store.new_run_dir(tmp_path)
    cells = [
        ("batching.e.rate=10.mode=static", "e", {"rate": 10.0, "mode": "static"}),
        ("batching.e.rate=10.mode=dynamic", "e", {"rate": 10.0, "mode": "dynamic"}),
    ]
    store.write_manifest(run, manifest(cells, run_id=run.name))
    ok = record(
        cells[0][0],
        run_id=run.name,
        engine="e",
        params=cells[0][2],
        p50=0.00117,
        headline=(Headline(label="p50", metric="e2e.p50", unit="ms", scale=1e3, ci="e2e.ci"),),
        validity=ValidityInfo(verdict="valid", warnings=(WARNING,)),
    )
    e2e = {**ok.metrics["e2e"], "ci": [0.00117, 0.00125]}
    ok = ok.model_copy(update={"metrics": {**ok.metrics, "e2e": e2e}})
    timeout = record(
        cells[1][0],
        run_id=run.name,
        engine="e",
        params=cells[1][2],
        status=Status.TIMEOUT,
        reasons=(REASON,),
    )
    for r in (ok, timeout):
        store.write_record(run, r)
    return run


def test_the_terminal_gets_plain_text_and_markdown_stays_escaped_for_markdown(tmp_path):
    run = odd_run(tmp_path)
    text = matrixterm.terminal_table(run, width=400)
    assert f"TIMEOUT: {REASON}" in text  # as written: no entity, no backslash, no markup
    assert "p50 1.17 [1.17, 1.25] ms (!)" in text
    assert f"(!) batching.e.rate=10.mode=static: {WARNING}" in text
    assert not re.search(r"&(lt|gt|amp);|\\[\[\]|_*`]", text)
    assert "\x1b[" not in text  # no terminal codes: a CI log reads the same
    # matrix.md: the same entries, escaped for Markdown (entities and backslashes render
    # there as the characters they stand for; a | would end the table cell)
    md = matrix.write(run)[0].read_text()
    assert (
        r"| 10 | dynamic | TIMEOUT: Timeout (&gt;3.0s) &amp; p &lt; 1e-16 in \[bold\]x\[/bold\]"
        r" :smile: a\|b \*c\* d\_e \`f\` |"
    ) in md
    assert r"p50 1.17 \[1.17, 1.25\] ms (!)" in md
    warned = r"- (!) `batching.e.rate=10.mode=static`: latency trends: p &lt; 1e-16 over \[1, 2\]"
    assert warned in md


def test_a_narrow_terminal_wraps_entries_and_keeps_the_parameters_whole(tmp_path):
    run = odd_run(tmp_path)
    text = matrixterm.terminal_table(run, width=60)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 60
    assert any(re.match(r"^ 10\s+dynamic\s+TIMEOUT: Timeout", line) for line in lines)
    # the wrapped reason goes on below its column, every word of it there
    assert " ".join(text.split()).count("a|b *c* d_e `f`") == 1
    assert matrixterm.terminal_table(run, width=60) == text  # the same run, the same text


def test_report_print_shows_the_terminal_text_not_markdown(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    run = odd_run(tmp_path)
    assert cli.main(["report", str(run), "--print"]) == 0
    out = capsys.readouterr().out
    assert f"TIMEOUT: {REASON}" in out
    assert not re.search(r"&(lt|gt|amp);|\\[\[\]]", out)
    assert "&lt;" in (run / "matrix.md").read_text()


@pytest.mark.parametrize("width", [10, 40])
def test_a_terminal_narrower_than_a_table_can_be_gets_the_least_width(tmp_path, width):
    text = matrixterm.terminal_table(odd_run(tmp_path), width=width)
    assert max(len(line) for line in text.splitlines()) <= matrixterm.MIN_WIDTH
