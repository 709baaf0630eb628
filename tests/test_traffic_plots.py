"""The traffic a generative cell carried (``TrafficPlot``): histograms of its input,
output and asked tokens and of its inter-arrival times, drawn from the record's raw
samples beside the cell's latency CDFs; records without those samples render as before."""

from __future__ import annotations

import html
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib import pyplot as plt

from harness.report import htmlpage, plots, runset, trafficplot
from harness.results import store
from harness.results.records import CellRecord, Manifest
from harness.results.reportspec import CdfPlot, ReportSpec, TrafficPlot
from tests.support.report_runs import MACHINE, planned_of, streaming
from workloads.lib.reporting import TRAFFIC, TTFT_CDF

SPEC = ReportSpec(plots=(TTFT_CDF, TRAFFIC))
NAME = "traffic-streaming-onnxruntime-concurrency-4"


def _traffic_samples(seed: int = 3, n: int = 120, *, open_loop: bool = True) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    asked = rng.choice([32, 64], n)
    natural = rng.integers(1, 80, n)  # where each reply would end on its own
    samples = {
        "input_tokens": [float(x) for x in rng.integers(20, 50, n)],
        "output_tokens": [float(x) for x in np.minimum(asked, natural)],
        "asked_tokens": [float(x) for x in asked],
    }
    if open_loop:  # Poisson arrivals at 10/s: a wide spread of gaps
        samples["interarrival"] = [float(x) for x in rng.exponential(0.1, n - 1)]
    return samples


def _record(engine: str, run_id: str, extra: dict[str, Any], spec: ReportSpec | None) -> CellRecord:
    rec = streaming(engine, run_id, MACHINE)
    return rec.model_copy(update={"samples": {**rec.samples, **extra}, "report_spec": spec})


def _write_run(root: Path, records_of: list[tuple[dict[str, Any], ReportSpec | None]]) -> Path:
    run = store.new_run_dir(root)
    records = [_record("onnxruntime", run.name, extra, spec) for extra, spec in records_of]
    for i, rec in enumerate(records[1:], start=2):  # distinct cells of one workload
        records[i - 1] = rec.model_copy(
            update={"cell_id": f"{rec.cell_id}.n={i}", "params": {**rec.params, "n": i}}
        )
    store.write_manifest(
        run,
        Manifest(
            run_id=run.name,
            state="complete",
            created_at="2026-01-01T00:00:00.000Z",
            finished_at="2026-01-01T00:00:00.000Z",
            command=("pytest",),
            settings={"engines": ["onnxruntime"], "profile": "quick"},
            environment=MACHINE,
            planned=tuple(planned_of(r) for r in records),
        ),
    )
    for rec in records:
        store.write_record(run, rec)
    return run


def _cell(extra: dict[str, Any], spec: ReportSpec = SPEC) -> plots.Cell:
    return plots.Cell("onnxruntime", _record("onnxruntime", "r", extra, spec), spec)


def test_the_declaration_names_the_samples_keys_and_travels_in_records(tmp_path):
    assert TrafficPlot() == TRAFFIC
    assert (TRAFFIC.kind, TRAFFIC.input_tokens, TRAFFIC.output_tokens) == (
        "traffic",
        "input_tokens",
        "output_tokens",
    )
    assert (TRAFFIC.asked_tokens, TRAFFIC.interarrival) == ("asked_tokens", "interarrival")
    run = _write_run(tmp_path, [(_traffic_samples(), SPEC)])
    (rec,) = runset.load([run]).runs[0].records
    assert rec.reporting().plots == (TTFT_CDF, TRAFFIC)
    assert ReportSpec.model_validate({"plots": [{"kind": "traffic"}]}).plots == (TRAFFIC,)


def test_the_page_shows_the_cells_traffic_after_its_latency_cdfs(tmp_path):
    run = _write_run(tmp_path / "runs", [(_traffic_samples(), SPEC)])
    written = htmlpage.write(runset.load([run]), tmp_path / "report")
    page = written.html.read_text()
    for suffix in (".svg", ".png"):
        path = tmp_path / "report" / "plots" / f"{NAME}{suffix}"
        assert path in written.plots
        assert path.stat().st_size > 1000
    assert (tmp_path / "report" / "plots" / f"{NAME}.svg").read_bytes().startswith(b"<svg")
    assert f'href="plots/{NAME}.svg"' in page
    assert f'href="plots/{NAME}.png"' in page
    figure = re.search(rf'<figure id="plot-{NAME}" class="plot">\n<svg.*?</figure>', page, re.S)
    assert figure is not None
    text = html.unescape(figure.group(0))
    assert "streaming: onnxruntime concurrency=4: traffic carried" in text
    assert "input tokens, 120 requests" in text
    assert "output tokens, 120 replies" in text
    assert "between arrivals, 119 gaps" in text
    assert "Not drawn" not in text  # every key was there
    # its section comes right after the cell's latency CDF, and the nav links it
    ttft, traffic = page.index('id="p-ttft-distributions"'), page.index('id="p-traffic-carried"')
    assert ttft < page.index('id="plot-cdf-ttft-streaming-1"') < traffic < page.index(NAME)
    assert '<a href="#p-traffic-carried">Traffic carried</a>' in page


def test_histogram_counts_match_the_samples():
    samples = _traffic_samples()
    figure = trafficplot.traffic(_cell(samples), TRAFFIC)
    assert figure is not None
    assert figure.name == NAME
    assert figure.notes == ()
    sent, replies, gaps = figure.panels
    assert [p.key for p in figure.panels] == ["input_tokens", "output_tokens", "interarrival"]
    # input tokens span 30 values: one bin per whole token
    (bars,) = sent.bars
    lo = int(min(samples["input_tokens"]))
    assert sent.edges[0] == lo - 0.5
    assert all(b - a == 1 for a, b in zip(sent.edges, sent.edges[1:], strict=False))
    by_value = Counter(int(v) for v in samples["input_tokens"])
    assert bars.counts == tuple(by_value.get(lo + i, 0) for i in range(len(bars.counts)))
    # output and asked share bins; counted as numpy counts them
    output, asked = replies.bars
    assert (output.label, asked.label) == ("output", "asked (max_tokens)")
    for drawn, key in ((output, "output_tokens"), (asked, "asked_tokens")):
        expected, _ = np.histogram(samples[key], bins=replies.edges)
        assert drawn.counts == tuple(int(c) for c in expected)
        assert drawn.n == len(samples[key])
    assert asked.counts.count(0) == len(asked.counts) - 2  # asked only 32 or 64
    short = sum(
        o < a for o, a in zip(samples["output_tokens"], samples["asked_tokens"], strict=True)
    )
    assert 0 < short < 120
    assert replies.title == f"output tokens, 120 replies, {short} short of max_tokens"
    # exponential gaps spread wide: log bins, in ms
    assert gaps.log_x
    assert gaps.xlabel == "ms, log"
    ms = [g * 1e3 for g in samples["interarrival"]]
    assert gaps.edges[0] == min(ms)
    assert gaps.edges[-1] == max(ms)
    expected, _ = np.histogram(ms, bins=gaps.edges)
    assert gaps.bars[0].counts == tuple(int(c) for c in expected)
    assert gaps.bars[0].n == 119


def test_the_figure_draws_the_counts_it_was_given():
    figure = trafficplot.traffic(_cell(_traffic_samples()), TRAFFIC)
    assert figure is not None
    fig = plt.figure()
    try:
        trafficplot.draw_traffic(fig, figure)
        axes = fig.get_axes()
        assert len(axes) == 3
        for ax, panel in zip(axes, figure.panels, strict=True):
            drawn = [p.get_data() for p in ax.patches]
            assert [tuple(int(v) for v in d.values) for d in drawn] == [
                b.counts for b in panel.bars
            ]
            assert all(tuple(d.edges) == panel.edges for d in drawn)
            assert ax.get_title() == panel.title
            assert ax.get_xscale() == ("log" if panel.log_x else "linear")
    finally:
        plt.close(fig)


def test_narrow_or_constant_gaps_stay_linear_and_wide_token_ranges_are_binned():
    rng = np.random.default_rng(5)
    narrow = {
        "interarrival": [float(x) for x in rng.uniform(0.09, 0.11, 50)],
        "input_tokens": [float(x) for x in rng.integers(1, 4000, 50)],
    }
    figure = trafficplot.traffic(_cell(narrow), TRAFFIC)
    assert figure is not None
    sent, gaps = figure.panels
    assert not gaps.log_x
    assert gaps.xlabel == "ms"
    assert len(gaps.edges) == trafficplot.TRAFFIC_BINS + 1
    assert sum(gaps.bars[0].counts) == 50
    assert len(sent.edges) <= trafficplot.TRAFFIC_BINS + 1
    expected, _ = np.histogram(narrow["input_tokens"], bins=sent.edges)
    assert sent.bars[0].counts == tuple(int(c) for c in expected)
    constant = trafficplot.traffic(_cell({"interarrival": [0.05] * 9}), TRAFFIC)
    assert constant is not None
    (panel,) = constant.panels
    assert panel.bars[0].counts == (9,)
    assert panel.edges[0] < 50.0 < panel.edges[1]
    assert not panel.log_x


def test_missing_or_damaged_samples_are_noted_not_raised():
    closed = _traffic_samples(open_loop=False)
    closed["input_tokens"] = [*closed["input_tokens"], float("nan")]
    figure = trafficplot.traffic(_cell(closed), TRAFFIC)
    assert figure is not None
    assert [p.key for p in figure.panels] == ["input_tokens", "output_tokens"]
    assert figure.notes == (
        "1 non-finite input_tokens values left out",
        "no interarrival samples (a closed loop schedules no arrivals)",
    )
    assert figure.panels[0].bars[0].n == 120
    only_output = trafficplot.traffic(_cell({"output_tokens": [5.0, 7.0]}), TRAFFIC)
    assert only_output is not None
    assert [b.label for b in only_output.panels[0].bars] == ["output"]
    assert only_output.panels[0].title == "output tokens, 2 replies"
    (drawn,) = trafficplot.traffic_plots([_cell(closed)])
    assert drawn.caption.endswith(
        "Not drawn: 1 non-finite input_tokens values left out; "
        "no interarrival samples (a closed loop schedules no arrivals)."
    )
    assert drawn.svg.startswith("<svg")


@pytest.mark.parametrize("spec", [SPEC, ReportSpec(plots=(TTFT_CDF,)), None])
def test_a_record_without_the_samples_renders_as_before(tmp_path, spec):
    # an old record: no traffic samples, whether or not its workload declares the plot
    assert trafficplot.traffic(_cell({}), TRAFFIC) is None
    run = _write_run(tmp_path / "runs", [({}, spec)])
    page, figures = htmlpage.render(runset.load([run]))
    assert not any(f.name.startswith("traffic-") for f in figures)
    assert "Traffic carried" not in page
    assert "traffic-" not in page
    assert "cdf-ttft-streaming-1" in {f.name for f in figures}  # its latency CDF is there


def test_declaring_the_plot_changes_no_figure_of_a_record_without_the_samples(tmp_path):
    with_decl = _write_run(tmp_path / "a", [({}, SPEC)])
    without = _write_run(tmp_path / "b", [({}, ReportSpec(plots=(TTFT_CDF,)))])
    figures = [htmlpage.render(runset.load([run]))[1] for run in (with_decl, without)]
    assert [f.name for f in figures[0]] == [f.name for f in figures[1]]
    assert [(f.svg, f.png) for f in figures[0]] == [(f.svg, f.png) for f in figures[1]]


def test_samples_are_drawn_only_where_the_workload_declared_the_plot(tmp_path):
    samples = _traffic_samples()
    run = _write_run(
        tmp_path / "runs",
        [(samples, ReportSpec(plots=(CdfPlot(samples="ttft", what="TTFT"),))), (samples, SPEC)],
    )
    cells = plots.ok_cells(runset.load([run]))
    assert [len(c.record.samples["input_tokens"]) for c in cells] == [120, 120]
    # the second cell only (its parameters carry n=2)
    assert [f.name for f in trafficplot.traffic_plots(cells)] == [f"{NAME}-n-2"]


@pytest.mark.slow
def test_two_renders_give_identical_bytes(tmp_path):
    run = _write_run(
        tmp_path / "runs",
        [(_traffic_samples(), SPEC), (_traffic_samples(seed=4, open_loop=False), SPEC)],
    )
    first = htmlpage.write(runset.load([run]), tmp_path / "r1")
    second = htmlpage.write(runset.load([run]), tmp_path / "r2")
    traffic = [p for p in first.plots if p.name.startswith("traffic-")]
    assert sorted(p.name for p in traffic) == sorted(
        f"{name}{suffix}" for name in (NAME, f"{NAME}-n-2") for suffix in (".svg", ".png")
    )
    assert [p.name for p in first.plots] == [p.name for p in second.plots]
    for a, b in zip((first.html, *first.plots), (second.html, *second.plots), strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name
    # the hashed ids (markers, clip paths) are salted per plot: two figures share none
    ids = [
        set(re.findall(rb'id="([mp][0-9a-f]{10})"', (tmp_path / "r1" / "plots" / n).read_bytes()))
        for n in (f"{NAME}.svg", f"{NAME}-n-2.svg")
    ]
    assert ids[0]
    assert ids[1]
    assert not ids[0] & ids[1]
