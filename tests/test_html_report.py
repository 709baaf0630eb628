"""The HTML report: merged runs, hardware kept apart, plots, determinism, and a real
headless Chromium that renders it without console errors."""

from __future__ import annotations

import html
import os
import re
import shutil
from pathlib import Path

import pytest

from harness import cli
from harness.report import htmlpage, runset
from tests.support import report_runs
from tests.support.report_runs import MACHINE, OTHER_MACHINE, write_run

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def two_engines(tmp_path: Path) -> list[Path]:
    return [
        write_run(tmp_path / "a", "onnxruntime", created_at="2026-01-01T00:00:00.000Z"),
        write_run(tmp_path / "b", "torch", scale=1.5, created_at="2026-01-02T00:00:00.000Z"),
    ]


def test_runs_merge_into_one_matrix_with_a_column_per_engine(two_engines):
    merged = runset.merge(runset.load(two_engines))
    assert merged.matrix.engines == ("onnxruntime", "torch")
    assert merged.matrix.state == "complete"
    assert merged.replaced == ()
    row = next(r for r in merged.matrix.rows if dict(r.params) == {"rate": 100.0, "mode": "none"})
    assert set(row.entries) == {"onnxruntime", "torch"}
    assert row.entries["torch"].record is not None
    assert row.entries["torch"].record.engine == "torch"


@pytest.mark.slow
def test_cells_from_other_hardware_get_columns_of_their_own(tmp_path):
    dirs = [
        write_run(tmp_path / "a", "onnxruntime"),
        write_run(
            tmp_path / "b",
            "onnxruntime",
            env=OTHER_MACHINE,
            created_at="2026-01-02T00:00:00.000Z",
        ),
    ]
    runs = runset.load(dirs)
    assert runs.mixed
    columns = runset.merge(runs).matrix.engines
    assert columns == (
        "onnxruntime @ Test CPU 9000 x8, 32 GiB",
        "onnxruntime @ Other CPU 1 x4, 32 GiB",
    )
    page, _ = htmlpage.render(runs)
    assert "measured on 2 different machines" in page


@pytest.mark.slow
def test_a_cell_measured_twice_on_one_machine_shows_the_later_run_and_says_so(tmp_path):
    early = write_run(tmp_path / "a", "onnxruntime", created_at="2026-01-01T00:00:00.000Z")
    late = write_run(tmp_path / "b", "onnxruntime", created_at="2026-02-01T00:00:00.000Z")
    merged = runset.merge(runset.load([late, early]))
    assert merged.matrix.engines == ("onnxruntime",)
    row = merged.matrix.rows[0]
    assert row.entries["onnxruntime"].record.run_id == late.name
    assert ("onnxruntime", row.entries["onnxruntime"].record.cell_id, late.name, early.name) in (
        merged.replaced
    )
    page, _ = htmlpage.render(runset.load([late, early]))
    assert f"<code>{early.name}</code> replaced" in page


def test_the_same_run_twice_is_refused(two_engines):
    with pytest.raises(ValueError, match="the same run was given twice"):
        runset.load([two_engines[0], two_engines[0]])


@pytest.mark.slow
def test_page_shows_statuses_not_numbers_and_escapes_engine_text(two_engines):
    page, figures = htmlpage.render(runset.load(two_engines))
    # a failed cell: its status and (escaped) reason, never figures
    assert "FAILED" in page
    assert "onnxruntime &lt;b&gt;exploded&lt;/b&gt; | badly" in page
    assert "<b>exploded</b>" not in page
    assert re.search(r'data-status="failed"[^>]*>.*?<div class="figures">FAILED:', page, re.S)
    # ok cells have their figures, validity badge and drill-down
    assert 'class="badge v-valid">valid' in page
    assert 'class="badge v-warn">valid (!)' in page  # the streaming cell's warning
    assert "run-to-run spread of p99 is 31 %" in page
    assert '"samples": {\n  "e2e": "400 values (in the run directory)"' in html.unescape(page)
    assert "<details><summary>record</summary>" in page
    names = {f.name for f in figures}
    assert {
        "latency-throughput-rate-sweep",
        "latency-throughput-capacity",
        "latency-throughput-batching",
        "cdf-ttft-streaming-1",
        "cdf-e2e-batching-1",
        "batch-sizes-1",
        "preprocessing-stages",
        "telemetry-onnxruntime",
        "telemetry-torch",
        "server-streaming-onnxruntime-concurrency-4",
        "server-streaming-torch-concurrency-4",
    } <= names


@pytest.mark.slow
def test_page_fetches_nothing(two_engines):
    page, _ = htmlpage.render(runset.load(two_engines))
    assert "<script" not in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "@import" not in page
    assert not re.search(r"url\((?!#)", page)  # only references within the page


@pytest.mark.slow
def test_report_files_are_byte_identical_when_rebuilt(two_engines, tmp_path):
    runs = runset.load(two_engines)
    first = htmlpage.write(runs, tmp_path / "r1")
    second = htmlpage.write(runs, tmp_path / "r2")
    assert len(first.plots) == len(second.plots) >= 18  # svg and png of each plot
    pairs = zip(
        (first.html, first.markdown, first.csv, *first.plots),
        (second.html, second.markdown, second.csv, *second.plots),
        strict=True,
    )
    for a, b in pairs:
        assert a.name == b.name
        assert a.read_bytes() == b.read_bytes(), a.name
    assert first.plots[0].read_bytes()[:4] in (b"<svg", b"\x89PNG")


@pytest.mark.slow
def test_stale_plots_from_an_earlier_build_are_removed(two_engines, tmp_path):
    out = tmp_path / "r"
    (out / "plots").mkdir(parents=True)
    (out / "plots" / "gone.svg").write_text("<svg/>")
    htmlpage.write(runset.load(two_engines), out)
    assert not (out / "plots" / "gone.svg").exists()


@pytest.mark.slow
def test_cli_merges_several_runs_only_with_out(two_engines, tmp_path, capsys):
    assert cli.main(["report", *map(str, two_engines), "--html"]) == 2
    assert "say where it goes with --out DIR" in capsys.readouterr().out
    out = tmp_path / "merged"
    assert cli.main(["report", *map(str, two_engines), "--html", "--out", str(out)]) == 0
    assert (out / "report.html").is_file()
    assert "| rate | mode | onnxruntime | torch |" in (out / "matrix.md").read_text()


def test_cli_names_an_unreadable_run(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "nope"), "--html"]) == 2
    assert "nope" in capsys.readouterr().out


@pytest.mark.slow
def test_an_unfinished_run_is_flagged(tmp_path):
    run = write_run(tmp_path, "onnxruntime", planned_extra=("batching.onnxruntime.rate=1",))
    page, _ = htmlpage.render(runset.load([run]))
    assert f"incomplete: {run.name} is incomplete" in page
    assert "MISSING" in page


@pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason="chromium is not installed "
    "(python scripts/ensure_chromium.py installs Debian's package)",
)
@pytest.mark.slow
def test_chromium_renders_matrix_and_plots_without_console_errors(two_engines, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    written = htmlpage.write(runset.load(two_engines), tmp_path / "report")
    shot = tmp_path / "report" / "screenshot.png"
    problems: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(written.html.as_uri())
            tables = page.locator("table.matrix")
            workloads = tables.evaluate_all("ts => ts.map(t => t.dataset.workload)")
            svg_sizes = page.locator("figure.plot svg").evaluate_all(
                "ss => ss.map(s => s.getBoundingClientRect()).map(r => [r.width, r.height])"
            )
            server_figures = page.locator("figure.plot[id^='plot-server-']").evaluate_all(
                "fs => fs.map(f => [f.id, f.querySelector('svg').getBoundingClientRect().height,"
                " f.querySelector('figcaption').textContent])"
            )
            page.locator("table.matrix details summary").first.click()
            opened = page.locator("table.matrix details[open] pre").first.inner_text()
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert requests == [written.html.as_uri()]  # nothing else was fetched
    assert set(workloads) == {"batching", "rate_sweep", "capacity", "streaming", "preprocessing"}
    assert len(svg_sizes) >= 9
    assert all(w > 300 and h > 150 for w, h in svg_sizes), svg_sizes
    assert '"cell_id": "batching.' in opened
    # the server's view over time: a figure per streaming cell whose record carries it
    assert [f[0] for f in server_figures] == [
        "plot-server-streaming-onnxruntime-concurrency-4",
        "plot-server-streaming-torch-concurrency-4",
    ]
    assert all(height > 300 for _, height, _ in server_figures), server_figures
    assert all("TTFT +1.2 ms, E2E +1.5 ms" in caption for _, _, caption in server_figures)
    assert shot.stat().st_size > 50_000  # a page with tables and plots, not a blank one
    _keep_for_a_human(shot)


def _keep_for_a_human(shot: Path, name: str = "html-report.png") -> None:
    """HARNESS_SCREENSHOT_DIR: where to leave the screenshot for someone to look at."""
    target = os.environ.get("HARNESS_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(target) / name)


def test_builder_covers_every_plot_kind():
    # guards the fixture above: a plot kind without records would pass vacuously
    rec = report_runs.batching("e", "r", MACHINE, 100.0, "dynamic", 1.0)
    assert rec.histograms["batch_size"]
    assert rec.telemetry["series"]["t"]
    served = report_runs.streaming("e", "r", MACHINE, server=True)
    assert served.metrics["server"]["series"]["requests_running"]
    assert len(served.metrics["server"]["scheduled"]) == len(served.samples["ttft"])


# -- the Decision --------------------------------------------------------------------------

PARETO = "pareto-streaming-load-open-level-8"


@pytest.fixture
def grid(tmp_path: Path) -> Path:
    """A run of several engines and configurations (report_runs.GRID), measured under
    ttft_p99=200ms,e2e_p99=2s."""
    return report_runs.write_grid_run(tmp_path / "grid")


def test_the_page_opens_with_the_decision(grid):
    page, figures = htmlpage.render(runset.load([grid]))
    assert '<nav><a href="#decision">Decision</a><a href="#runs">Runs</a>' in page
    assert page.index('<h2 id="decision">') < page.index('<h2 id="runs">')
    assert page.index('<h2 id="runs">') < page.index('<h2 id="matrix">')
    text = html.unescape(page)
    assert (
        "Decided under SLO ttft_p99<=200ms, e2e_p99<=2000ms (the SLO the runs were measured"
        " with: their manifests' settings.slos)"
    ) in re.sub(r"</?strong>", "", text)
    assert (
        'Recommended: <strong class="engine">vllm</strong> <code class="configuration">'
        'config=max_num_seqs=16</code>: goodput <strong class="rate">12 req/s</strong>'
        ' [95% 9.95, 14.3] <span class="badge b-pareto">Pareto: TTFT, E2E</span>'
    ) in text
    assert "0.25 J per output token (GPU energy from NVML)" in text
    assert (
        "Runner-up: <strong>sglang config=default</strong>: goodput 11 req/s [95% 9.04, 13.3]"
        " (energy not measured: no GPU power reading: NVML not found). Margin:"
        ' <strong class="margin">8.33 % lower goodput</strong>; their 95 % intervals overlap:'
        " the difference may be noise."
    ) in text
    assert (
        "<li><strong>vllm config=max_num_seqs=4</strong>: lost: meets the SLO but goodput"
        " 10 req/s is 16.7 % lower than the winner's [Pareto: TTFT, E2E]</li>"
    ) in text
    assert (
        "<li><strong>tgi config=default</strong>: not recommended: ttft p99 300 ms > 200 ms"
        " (+50 %)</li>"
    ) in text
    assert f'<figure id="plot-{PARETO}" class="plot pareto">' in page
    assert figures[0].name == PARETO  # the Decision's plot comes first
    decision_part = page[page.index('<h2 id="decision">') : page.index('<h2 id="runs">')]
    assert f'id="{PARETO}-front-ttft"' in decision_part
    assert f'id="{PARETO}-recommended-e2e"' in decision_part


def test_report_cli_decides_under_the_slo_and_prices_given(grid, tmp_path, capsys):
    out = tmp_path / "r"
    argv = ["report", str(grid), "--html", "--out", str(out), "--slo", "ttft_p99=60ms"]
    assert cli.main([*argv, "--gpu-hour-cost", "3.6"]) == 0
    page = html.unescape((out / "report.html").read_text())
    assert "SLO ttft_p99<=60ms (given with --slo)" in page
    assert "ranked by lowest cost per 1M output tokens at 3.6 per machine-hour" in page
    assert (
        'Recommended: <strong class="engine">vllm</strong> <code class="configuration">'
        "config=max_num_seqs=4</code>"
    ) in page
    # 0.001 per second / 200 output tokens/s * 1e6
    assert "5 per 1M output tokens" in page
    assert "Runner-up: none (no other configuration meets the SLO)." in page
    # none of its requests is within 60 ms: a goodput of 0, beaten on both fronts
    assert (
        "<li><strong>vllm config=max_num_seqs=16</strong>: not recommended: ttft p99 80 ms >"
        " 60 ms (+33.3 %)</li>"
    ) in page
    assert (out / "plots" / f"{PARETO}.svg").read_text().startswith("<svg")
    assert (out / "plots" / f"{PARETO}.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--slo", "ttft_p99=1ms"], "--slo: only with --html"),
        (["--html", "--slo", "ttft=1ms"], "bad --slo 'ttft=1ms': SLO 'ttft=1ms': expected"),
        (["--html", "--energy-price", "-2"], "--energy-price must be a positive number"),
    ],
)
def test_report_cli_refuses_decision_options_it_cannot_use(grid, capsys, argv, message):
    assert cli.main(["report", str(grid), *argv]) == 2
    assert message in capsys.readouterr().out
    assert not (grid / "report.html").exists()


def test_the_decision_without_an_slo_says_so(tmp_path):
    run = report_runs.write_grid_run(tmp_path, slos=None)
    page = html.unescape(htmlpage.render(runset.load([run]))[0])
    assert "Decided under <strong>no SLO: ranked by throughput</strong>" in page
    assert (
        'Recommended: <strong class="engine">tgi</strong> <code class="configuration">'
        'config=default</code>: throughput <strong class="rate">13 req/s</strong>'
    ) in page
    assert "energy not measured: the record has no metrics.energy (no NVML reading kept)" in page


@pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason="chromium is not installed "
    "(python scripts/ensure_chromium.py installs Debian's package)",
)
@pytest.mark.slow
def test_chromium_shows_the_decision_first_with_its_pareto_plot(grid, two_engines, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    written = htmlpage.write(runset.load([grid, *two_engines]), tmp_path / "report")
    problems: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(written.html.as_uri())
            headings = page.locator("h2").all_inner_texts()
            nav = page.locator("nav a").all_inner_texts()
            tops = {
                name: page.locator(f"h2#{name}").bounding_box()["y"]
                for name in ("decision", "runs", "matrix")
            }
            section = page.locator(f"section.decision:has(#plot-{PARETO})")
            picked = section.locator("p.pick").inner_text()
            lost = section.locator("ul.lost li").all_inner_texts()
            svg = section.locator("figure.pareto svg").bounding_box()
            fronts = {
                gid: page.locator(f"#{PARETO}-{gid}").bounding_box()
                for gid in ("front-ttft", "front-e2e", "recommended-ttft", "recommended-e2e")
            }
            labels = section.locator("figure.pareto svg text").all_text_contents()
            page.screenshot(path=str(tmp_path / "report" / "decision.png"))
        finally:
            browser.close()
    assert problems == []
    assert headings[0] == "Decision"
    assert nav[0] == "Decision"
    assert tops["decision"] < tops["runs"] < tops["matrix"]
    assert picked.startswith("Recommended: vllm config=max_num_seqs=16: goodput 12 req/s")
    assert lost[0].startswith(
        "sglang config=default: lost: meets the SLO but goodput 11 req/s is 8.33 % lower"
    )
    assert (svg["width"] > 600, svg["height"] > 250) == (True, True), svg
    # the front's step lines and the starred recommendation are drawn, not only present
    assert all(box and box["width"] > 0 and box["height"] > 0 for box in fronts.values()), fronts
    assert "Pareto front" in labels
    assert {"vllm config=max_num_seqs=16", "sglang config=default", "tgi config=default"} <= set(
        labels
    )
    _keep_for_a_human(tmp_path / "report" / "decision.png", "html-report-decision.png")
