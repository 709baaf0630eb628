"""``harness.report.decision``: the Decision that opens the HTML report, from a run of
several engines and configurations with hand-computed answers (tests/support/report_runs.py
``GRID``), under the SLO given, the runs' own, or none."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.metrics.streamtiming import parse_slos
from harness.report import decision, paretoplot
from harness.report.publicpaths import PathStyle
from harness.report.recommend import Candidate, RecommendError
from harness.results import store
from harness.results.reading import read_run_dirs
from tests.support.report_runs import write_grid_run


def decide(runs: list[Path], slo: str | None = None, **prices: float) -> decision.Decision:
    slos = parse_slos(slo) if slo is not None else None
    return decision.decide(read_run_dirs(runs), decision.Options(slos, **prices))


@pytest.fixture
def grid(tmp_path: Path) -> Path:
    return write_grid_run(tmp_path / "runs")


def test_under_the_slo_the_runs_were_measured_with(grid):
    found = decide([grid])
    assert found.source == "runs"
    assert found.slo == (
        "SLO ttft_p99<=200ms, e2e_p99<=2000ms (the SLO the runs were measured with: their"
        " manifests' settings.slos)"
    )
    [q] = found.questions
    assert (q.id, q.title) == ("streaming-load-open-level-8", "streaming load=open level=8")
    assert q.slos == "SLO applied: ttft_p99<=200ms, e2e_p99<=2000ms"
    assert q.ranked_by == "highest goodput under the SLO (req/s)"
    pick = q.pick
    assert (pick.engine, pick.configuration) == ("vllm", "config=max_num_seqs=16")
    assert (pick.figure, pick.rate, pick.unit) == ("goodput", 12.0, "req/s")
    assert pick.ci95 == pytest.approx((9.949, 14.349), abs=1e-3)  # 120 requests in 10 s
    assert pick.energy == "0.25 J per output token (GPU energy from NVML)"
    assert pick.pareto == "TTFT, E2E"
    assert (q.runner_up.name, q.runner_up.rate) == ("sglang config=default", 11.0)
    assert q.runner_up.energy == "energy not measured: no GPU power reading: NVML not found"
    assert q.margin == "8.33 % lower goodput"
    assert q.overlap is True  # 110 vs 120 requests: the intervals overlap
    assert [(lost.name, lost.why, lost.pareto) for lost in q.lost] == [
        (
            "sglang config=default",
            "lost: meets the SLO but goodput 11 req/s is 8.33 % lower than the winner's",
            " [Pareto: E2E]",
        ),
        (
            "vllm config=max_num_seqs=4",
            "lost: meets the SLO but goodput 10 req/s is 16.7 % lower than the winner's",
            " [Pareto: TTFT, E2E]",
        ),
        ("tgi config=default", "not recommended: ttft p99 300 ms > 200 ms (+50 %)", ""),
    ]


def test_the_pareto_planes_hold_every_configuration_and_mark_the_front(grid):
    [q] = decide([grid]).questions
    assert q.plot == "pareto-streaming-load-open-level-8"
    ttft, e2e = q.planes
    assert (ttft.metric, ttft.rate, ttft.threshold_s) == ("ttft", "goodput (req/s)", 0.2)
    assert [(p.label, p.rate, p.latency_s, p.optimal, p.recommended) for p in ttft.points] == [
        ("vllm config=max_num_seqs=16", 12.0, 0.08, True, True),
        ("sglang config=default", 11.0, 0.1, False, False),  # beaten by max_num_seqs=16
        ("vllm config=max_num_seqs=4", 10.0, 0.05, True, False),
        ("tgi config=default", 0.0, 0.3, False, False),  # no request within the SLO
    ]
    assert [(p.label, p.optimal) for p in e2e.points] == [
        ("vllm config=max_num_seqs=16", True),
        ("sglang config=default", True),  # 700 ms: between 500 and 900
        ("vllm config=max_num_seqs=4", True),
        ("tgi config=default", False),
    ]
    assert e2e.threshold_s == 2.0
    assert q.off_plot == ()


def test_an_slo_given_replaces_the_runs_own(grid):
    found = decide([grid], "ttft_p99=60ms")
    assert found.slo == "SLO ttft_p99<=60ms (given with --slo)"
    [q] = found.questions
    assert (q.pick.engine, q.pick.configuration) == ("vllm", "config=max_num_seqs=4")
    assert (q.runner_up, q.margin, q.overlap) == (None, None, None)
    whys = {lost.name: lost.why for lost in q.lost}
    assert whys["vllm config=max_num_seqs=16"] == (
        "not recommended: ttft p99 80 ms > 60 ms (+33.3 %)"
    )
    assert q.planes[0].threshold_s == 0.06
    assert q.planes[1].threshold_s is None  # no E2E SLO


def test_without_any_slo_it_ranks_by_throughput_and_says_so(tmp_path):
    run = write_grid_run(tmp_path, slos=None)
    found = decide([run])
    assert (found.source, found.slo) == ("none", "no SLO: ranked by throughput")
    [q] = found.questions
    assert q.slos == "no SLO: ranked by throughput"
    # 130 requests in 10 s: tgi's slow first tokens do not matter without an SLO
    assert (q.pick.name, q.pick.figure, q.pick.rate) == ("tgi config=default", "throughput", 13.0)
    assert q.pick.energy == (
        "energy not measured: the record has no metrics.energy (no NVML reading kept)"
    )
    assert q.planes[0].rate == "throughput (req/s)"
    assert [p.optimal for p in q.planes[1].points] == [True, True, True, True]


def test_runs_measured_with_different_thresholds_use_the_tightest(tmp_path):
    loose = write_grid_run(tmp_path / "a", slos={"ttft_p99": 0.2})
    tight = write_grid_run(tmp_path / "b", slos={"ttft_p99": 0.09, "e2e_p99": "fast"})
    found = decide([loose, tight])
    assert found.slo.startswith("SLO ttft_p99<=90ms (")
    assert found.notes == (
        f"run {tight.name}: SLO setting 'e2e_p99' ignored: not an SLO",
        "the runs were measured with different ttft_p99 thresholds (ttft_p99<=200ms,"
        " ttft_p99<=90ms): the tightest, ttft_p99<=90ms, is used",
    )
    [q] = found.questions  # one machine, one scenario: both runs answer one question
    # each configuration twice, once per run: one candidate with two measurements (the
    # run tells the labels apart); the runner-up is the next configuration, never the
    # pick measured again (issue 35)
    runs = sorted([loose.name, tight.name])
    assert q.pick.name == f"vllm config=max_num_seqs=16 [run {runs[0]}]"
    assert q.runner_up is not None
    assert q.runner_up.name == f"vllm config=max_num_seqs=4 [run {runs[0]}]"
    assert q.margin == "16.7 % lower goodput"
    assert q.overlap is True
    # each other configuration once, with what the other run measured of it
    assert [lost.name.split(" [run ")[0] for lost in q.lost] == [
        "vllm config=max_num_seqs=4",
        "sglang config=default",
        "tgi config=default",
    ]
    assert all(f"; also measured in run {runs[1]}: goodput " in lost.why for lost in q.lost)


def test_the_decision_is_a_pure_function_of_the_records(grid):
    first, second = decide([grid]), decide([grid])
    assert first == second
    a, b = paretoplot.pareto_plots(first), paretoplot.pareto_plots(second)
    assert [p.name for p in a] == ["pareto-streaming-load-open-level-8"]
    assert a[0].svg == b[0].svg
    assert a[0].png == b[0].png
    svg = a[0].svg
    for gid in ("front-ttft", "front-e2e", "recommended-ttft", "recommended-e2e"):
        assert f'id="pareto-streaming-load-open-level-8-{gid}"' in svg
    assert "vllm config=max_num_seqs=4" in svg  # points are labeled
    assert "Pareto front" in svg


def test_energy_is_read_never_estimated(grid):
    [run] = read_run_dirs([grid])
    rec = next(r for r in run.records if r.params["config"] == "max_num_seqs=16")
    candidate = Candidate(
        run.manifest.run_id,
        rec.cell_id,
        "vllm",
        (),
        None,
        None,
        (),
        "no SLO",
        12.0,
        12.0,
        "req/s",
        "requests",
    )
    assert decision.energy_text(rec, candidate, shared=False) == (
        "0.25 J per output token (GPU energy from NVML)"
    )
    per_request = {"per_request_j": 1.5, "mean_power_w": 75.0}
    other = rec.model_copy(update={"metrics": {**rec.metrics, "energy": per_request}})
    assert decision.energy_text(other, candidate, shared=False) == (
        "1.50 J per request (GPU energy from NVML, mean GPU power 75 W)"
    )
    uncounted = rec.model_copy(update={"metrics": {**rec.metrics, "energy": {"joules": 9.0}}})
    assert decision.energy_text(uncounted, candidate, shared=False) == (
        "9 J over the window, with nothing counted to divide it by"
    )
    swept = dataclasses.replace(candidate, load=4.0, load_unit="req/s")
    assert decision.energy_text(rec, swept, shared=False) == (
        "energy not measured for this load point: a load search records the energy of one"
        " load point, not of each"
    )
    assert decision.energy_text(rec, candidate, shared=True) == (
        "energy not measured per configuration: the energy of a cell measuring two"
        " configurations is not split between them"
    )


def test_options_and_decision_types_validate_themselves():
    with pytest.raises(RecommendError, match="--gpu-hour-cost must be a positive number"):
        decision.Options(gpu_hour_cost=-1.0)
    with pytest.raises(RecommendError, match="--energy-price must be a positive number"):
        decision.Options(energy_price=0.0)
    point = decision.PlanePoint("a", 10.0, 0.1, optimal=False, recommended=False)
    with pytest.raises(ValueError, match="optimal points are its Pareto front"):
        decision.Plane("e2e", "goodput (req/s)", (point,), None)
    with pytest.raises(ValueError, match="with points"):
        decision.Plane("itl", "goodput (req/s)", (), None)
    with pytest.raises(ValueError, match="a pick or says why"):
        decision.Question("q", "t", "m", "s", False, "r", None, None, None, None, None, (), (), ())


def test_a_run_without_records_has_questions_without_a_pick(tmp_path):
    run = write_grid_run(tmp_path)
    for cell in (run / "cells").iterdir():
        cell.unlink()
    manifest = store.read_manifest(run)
    store.write_manifest(run, manifest.model_copy(update={"state": "incomplete"}))
    [q] = decide([run]).questions
    assert q.pick is None
    assert q.no_pick == "no valid cell to recommend from"
    assert (q.planes, q.plot) == ((), None)
    assert {lost.why for lost in q.lost} == {
        "not considered: missing: no record (interrupted run?)"
    }


def test_the_plot_shows_no_machine_path_even_in_its_pixels(tmp_path):
    # the run's --model poses the question: its path is in the title the PNG draws
    run = write_grid_run(tmp_path)
    manifest = store.read_manifest(run)
    settings = {**manifest.settings, "model": "/work/proj/models/m.onnx"}
    store.write_manifest(run, manifest.model_copy(update={"settings": settings}))
    [q] = decide([run]).questions
    assert q.title == "streaming model=/work/proj/models/m.onnx load=open level=8"
    style = PathStyle.of(Path("/work/proj"), Path("/home/ann"))
    [plot] = paretoplot.pareto_plots(decide([run]), style.text)
    assert plot.title == "streaming model=models/m.onnx load=open level=8: goodput vs p99 latency"
    assert "/work/proj" not in plot.svg
    [unstyled] = paretoplot.pareto_plots(decide([run]))
    assert unstyled.png != plot.png  # what is drawn, not only the text, changed
