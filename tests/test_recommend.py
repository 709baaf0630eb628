"""``harness.report.recommend``: constructed runs with hand-computed answers."""

import io
import json

import pytest
from rich.console import Console

from harness import cli
from harness.metrics import stats
from harness.metrics.streamtiming import parse_slos
from harness.report import recommend as rec
from harness.report.publicpaths import PathStyle
from harness.report.recommend import ranking
from harness.results import store
from harness.results.records import (
    CellRecord,
    Headline,
    Manifest,
    PlannedCell,
    Status,
    ValidityInfo,
)

ENV_A = {
    "cpu": {"model": "Test CPU A", "logical_cores": 8, "affinity": 8},
    "memory_bytes": 32 * 2**30,
    "gpu": {"present": False},
    "hostname": "a",
}
ENV_B = {**ENV_A, "cpu": {"model": "Test CPU B", "logical_cores": 16, "affinity": 16}}

TENSOR_HEADLINE = (
    Headline(label="p99", metric="e2e.p99", unit="ms", scale=1e3),
    Headline(label="tput", metric="throughput.requests_per_s", unit="req/s"),
)


def cell_id(workload, engine, params):
    return ".".join([workload, engine, *(f"{k}={v}" for k, v in params.items())])


def build(workload, engine, params, *, run_id, status=Status.OK, env=ENV_A, **fields):
    """A record as the plugin writes it; ok/invalid records carry a validity verdict."""
    base = {
        "run_id": run_id,
        "cell_id": cell_id(workload, engine, params),
        "workload": workload,
        "engine": engine,
        "params": params,
        "status": status,
        "started_at": "2026-01-01T00:00:00.000Z",
        "finished_at": "2026-01-01T00:00:05.000Z",
        "duration_s": 5.0,
        "environment": env,
    }
    if status is Status.OK:
        base["validity"] = ValidityInfo(verdict="valid", warnings=fields.pop("warnings", ()))
    elif status is Status.INVALID:
        base["validity"] = ValidityInfo(verdict="invalid", reasons=("too few samples",))
        base["reasons"] = ("too few samples",)
    return CellRecord(**(base | fields))


def served(e2e, *, window=1.0, failed=0):
    """What harness.load.serve_summary stores for a tensor cell: e2e per successful request."""
    ok = len(e2e)
    metrics = {
        "e2e": stats.to_json(stats.summarize(e2e, failed)),
        "throughput": {
            "requests_per_s": ok / window,
            "requests_per_s_ci95": list(stats.rate_ci(ok, window)),
            "items_per_s": ok / window,
            "goodput_requests_per_s": ok / window,
        },
        "requests": {"total": ok + failed, "ok": ok, "failed": failed, "met_slo": ok},
    }
    return {
        "metrics": metrics,
        "samples": {"e2e": list(e2e), "queue": [0.0] * ok},
        "window": {"duration_s": window, "requests": ok + failed},
        "headline": TENSOR_HEADLINE,
    }


def streamed(ttft, tpot, e2e, *, window, tokens_per_s, failed=0):
    """What harness.load.stream_summary stores: ttft/e2e once per successful request, tpot per
    request with more than one token."""
    ok = len(e2e)
    metrics = {
        name: stats.to_json(stats.summarize(values, failed))
        for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e))
    }
    metrics["throughput"] = {
        "requests_per_s": ok / window,
        "requests_per_s_ci95": list(stats.rate_ci(ok, window)),
        "output_tokens_per_s": tokens_per_s,
        "goodput_requests_per_s": ok / window,
    }
    metrics["requests"] = {"total": ok + failed, "ok": ok, "failed": failed, "met_slo": ok}
    return {
        "metrics": metrics,
        "samples": {"ttft": list(ttft), "tpot": list(tpot), "e2e": list(e2e)},
        "window": {"duration_s": window, "requests": ok + failed},
        "headline": (Headline(label="TTFT p99", metric="ttft.p99", unit="ms", scale=1e3),),
    }


def write_run(tmp_path, name, records, *, env=ENV_A, missing=()):
    """A run directory holding ``records``; ``missing``: planned cells with no record."""
    run = tmp_path / name
    (run / "cells").mkdir(parents=True)
    planned = [
        PlannedCell(
            cell_id=r.cell_id, workload=r.workload, engine=r.engine, params=r.params, nodeid="t"
        )
        for r in records
    ]
    planned += [
        PlannedCell(cell_id=cell_id(*m), workload=m[0], engine=m[1], params=m[2], nodeid="t")
        for m in missing
    ]
    manifest = Manifest(
        run_id=name,
        state="complete",
        created_at="2026-01-01T00:00:00.000Z",
        environment=env,
        planned=tuple(planned),
    )
    store.write_manifest(run, manifest)
    for r in records:
        store.write_record(run, r)
    return run


def batching_run(tmp_path, name="run-a", env=ENV_A):
    """Two engines x two configurations at one offered load, plus cells that must not win.

    fast/dynamic: 1000 requests at 10 ms in 1 s  -> meets, goodput 1000 req/s
    fast/static:   800 requests at 20 ms in 1 s  -> meets, goodput 800 (20 % lower)
    slow/dynamic:  980 at 10 ms + 20 at 61.2 ms  -> p99 (990th of 1000) 61.2 ms > 50 ms
    slow/static:  1000 at 70 ms                  -> p99 70 ms > 50 ms (+40 %)
    cheat/dynamic: invalid, 5000 requests at 1 ms (the best numbers, never recommended)
    """
    w, rate = "batching", {"rate": 1000.0}
    recs = [
        build(w, "fast", rate | {"mode": "dynamic"}, run_id=name, env=env, **served([0.01] * 1000)),
        build(w, "fast", rate | {"mode": "static"}, run_id=name, env=env, **served([0.02] * 800)),
        build(
            w,
            "slow",
            rate | {"mode": "dynamic"},
            run_id=name,
            env=env,
            **served([0.01] * 980 + [0.0612] * 20),
        ),
        build(w, "slow", rate | {"mode": "static"}, run_id=name, env=env, **served([0.07] * 1000)),
        build(
            w,
            "cheat",
            rate | {"mode": "dynamic"},
            run_id=name,
            env=env,
            status=Status.INVALID,
            **served([0.001] * 5000),
        ),
        build(
            w,
            "cheat",
            rate | {"mode": "static"},
            run_id=name,
            env=env,
            status=Status.FAILED,
            reasons=("engine raised: boom",),
        ),
    ]
    missing = [(w, "fast", rate | {"mode": "none"})]
    return write_run(tmp_path, name, recs, env=env, missing=missing)


def one(result, workload):
    found = [w for w in result.workloads if w.workload == workload]
    assert len(found) == 1, found
    return found[0]


def test_recommends_the_best_cell_meeting_the_slo_and_says_why_others_lost(tmp_path):
    run = batching_run(tmp_path)
    result = rec.recommend([run], parse_slos("e2e_p99=50ms"), None)
    w = one(result, "batching")
    assert w.scenario == (("rate", 1000.0),)
    assert w.slos_applied == ("e2e_p99<=50ms",)
    assert (w.recommended.engine, dict(w.recommended.params)["mode"]) == ("fast", "dynamic")
    assert w.recommended.goodput == pytest.approx(1000.0)
    assert w.recommended.method == "samples"
    assert (w.runner_up.engine, dict(w.runner_up.params)["mode"]) == ("fast", "static")
    verdicts = {v.engine: v.verdict for v in w.engines}
    assert verdicts["fast"] == "recommended"
    assert verdicts["slow"] == (
        "misses the SLO in all 2 configurations; closest: e2e p99 61.2 ms > 50 ms (+22.4 %)"
    )
    slow = next(v for v in w.engines if v.engine == "slow")
    assert dict(slow.best.params)["mode"] == "dynamic"
    assert slow.best.goodput == pytest.approx(980.0)  # 980 requests within 50 ms in 1 s
    assert result.exit_code == rec.EXIT_OK
    text = rec.render(result)
    assert "RECOMMENDED: fast mode=dynamic: goodput 1000 req/s" in text
    assert "runner-up: fast mode=static: goodput 800 req/s" in text
    assert "(20 % lower goodput" in text
    assert "e2e p99 70 ms > 50 ms (+40 %)" in text  # slow/static in the full list


def test_invalid_failed_and_missing_cells_are_never_recommended_but_listed(tmp_path):
    run = batching_run(tmp_path)
    w = one(rec.recommend([run], parse_slos("e2e_p99=50ms"), None), "batching")
    assert all(c.engine != "cheat" for c in w.candidates)
    left = {(n.engine, dict(n.params)["mode"]): (n.status, n.reasons) for n in w.not_considered}
    assert left[("cheat", "dynamic")] == ("invalid", ("too few samples",))
    assert left[("cheat", "static")] == ("failed", ("engine raised: boom",))
    assert left[("fast", "none")][0] == "missing"
    verdicts = {v.engine: v.verdict for v in w.engines}
    assert verdicts["cheat"] == "no valid cell (failed, invalid; see below)"
    text = rec.render(rec.recommend([run], parse_slos("e2e_p99=50ms"), None))
    assert "cheat mode=dynamic: invalid: too few samples" in text  # the rate is the title's
    assert "fast mode=none: missing: no record (interrupted run?)" in text


def test_no_cell_meeting_the_slo_is_a_nonzero_exit_with_reasons(tmp_path):
    run = batching_run(tmp_path)
    result = rec.recommend([run], parse_slos("e2e_p99=5ms"), None)
    w = one(result, "batching")
    assert w.recommended is None
    assert w.runner_up is None
    assert result.exit_code == rec.EXIT_NO_RECOMMENDATION == 3
    verdicts = {v.engine: v.verdict for v in w.engines}
    assert verdicts["fast"] == (
        "misses the SLO in all 2 configurations; closest: e2e p99 10 ms > 5 ms (+100 %)"
    )
    text = rec.render(result)
    assert "NO RECOMMENDATION: no valid cell meets the SLO" in text
    assert "no recommendation for: batching rate=1000 (exit 3)" in text


def test_failed_requests_count_as_infinite_latency(tmp_path):
    # 95 fine requests and 5 failures: the error-adjusted p99 is infinite
    record = build("batching", "e", {"mode": "none"}, run_id="r", **served([0.001] * 95, failed=5))
    run = write_run(tmp_path, "r", [record])
    w = one(rec.recommend([run], parse_slos("e2e_p99=50ms"), None), "batching")
    assert w.recommended is None
    assert "e2e p99 inf > 50 ms (failed requests count as infinite latency)" in w.engines[0].verdict
    data = json.loads(rec.to_json(rec.recommend([run], parse_slos("e2e_p99=50ms"))))
    assert data["workloads"][0]["candidates"][0]["checks"][0]["value_s"] == "Infinity"


def test_cells_from_different_hardware_are_never_mixed(tmp_path):
    run_a = batching_run(tmp_path, "run-a", ENV_A)
    # the other machine: only the slow engine ran, and there it is fast enough
    fast_b = build(
        "batching",
        "slow",
        {"rate": 1000.0, "mode": "static"},
        run_id="run-b",
        env=ENV_B,
        **served([0.005] * 1000),
    )
    run_b = write_run(tmp_path, "run-b", [fast_b], env=ENV_B)
    result = rec.recommend([run_a, run_b], parse_slos("e2e_p99=50ms"), None)
    assert result.hardware == ("Test CPU A x8, 32 GiB", "Test CPU B x16, 32 GiB")
    per_machine = {w.hardware: w for w in result.workloads if w.workload == "batching"}
    assert per_machine["Test CPU A x8, 32 GiB"].recommended.engine == "fast"
    b = per_machine["Test CPU B x16, 32 GiB"]
    assert b.recommended.engine == "slow"
    assert b.recommended.run_id == "run-b"
    assert {c.run_id for c in per_machine["Test CPU A x8, 32 GiB"].candidates} == {"run-a"}
    text = rec.render(result)
    assert "cells come from 2 different machines" in text
    assert "== batching rate=1000 on Test CPU B x16, 32 GiB ==" in text


def test_gpu_hour_cost_per_thousand_requests_and_images(tmp_path):
    run = batching_run(tmp_path)
    images = build(
        "preprocessing",
        "e",
        {"backend": "pil", "batch": 8},
        run_id="p",
        metrics={"latency": {"p50": 0.04}, "throughput": {"images_per_s": 200.0}},
        window={"duration_s": 4.0},
    )
    result = rec.recommend(
        [run, write_run(tmp_path, "p", [images])], parse_slos("e2e_p99=50ms"), 3.6
    )
    best = one(result, "batching").recommended
    # 3.6 per hour = 0.001 per second; at 1000 req/s a thousand requests take 1 s
    assert (best.cost.amount, best.cost.per) == (pytest.approx(0.001), "1k requests")
    prep = one(result, "preprocessing")
    assert prep.slos_applied == ()
    assert prep.recommended.method == "no SLO"
    assert prep.recommended.engine == "e/pil"
    # 1000 images at 200 img/s take 5 s: 0.005
    cost = prep.recommended.cost
    assert (cost.amount, cost.per) == (pytest.approx(0.005), "1k images")
    text = rec.render(result)
    assert "no SLO applied: none of the given SLOs is measured by this workload" in text
    assert "lowest cost per 1k requests at 3.6 per machine-hour" in text


def generative_run(tmp_path, *, single_token=False):
    """120 requests in 10 s per cell.

    good: ttft 100 ms (one request 300 ms), tpot 20 ms -> p99 (119th of 120) meets
          ttft<=200ms and tpot<=50ms; 119 requests meet both: goodput 11.9 req/s
    slow: tpot 60 ms for every request -> tpot p99 60 ms > 50 ms (+20 %)
    """
    ttft = [0.1] * 119 + [0.3]
    tpot = [0.02] * 120
    e2e = [t + 31 * 0.02 for t in ttft]
    if single_token:  # a one-token request has no tpot: the columns no longer align
        tpot = tpot[:-1]
    good = streamed(ttft, tpot, e2e, window=10.0, tokens_per_s=500.0)
    slow = streamed([0.1] * 120, [0.06] * 120, [1.96] * 120, window=10.0, tokens_per_s=300.0)
    recs = [
        build("streaming", "vllm", {"max_num_seqs": 16}, run_id="g", **good),
        build("streaming", "other", {"max_num_seqs": 16}, run_id="g", **slow),
    ]
    return write_run(tmp_path, "g", recs)


def test_generative_ttft_and_tpot_slos_with_goodput_from_samples(tmp_path):
    run = generative_run(tmp_path)
    slos = parse_slos("ttft_p99=200ms,tpot_p99=50ms,e2e_p99=2s")
    result = rec.recommend([run], slos, None)
    w = one(result, "streaming")
    assert w.slos_applied == ("ttft_p99<=200ms", "tpot_p99<=50ms", "e2e_p99<=2000ms")
    assert w.recommended.engine == "vllm"
    assert w.recommended.method == "samples"
    assert w.recommended.goodput == pytest.approx(119 / 10.0)
    verdicts = {v.engine: v.verdict for v in w.engines}
    assert verdicts["other"] == (
        "misses the SLO in its only configuration; closest: tpot p99 60 ms > 50 ms (+20 %)"
    )


def test_generative_cost_per_million_output_tokens(tmp_path):
    run = generative_run(tmp_path)
    result = rec.recommend([run], parse_slos("ttft_p99=200ms"), 3.6)
    w = one(result, "streaming")
    # both meet the TTFT SLO; 0.001 per second / 500 tokens/s * 1e6 = 2.0 per 1M tokens
    best, second = w.recommended.cost, w.runner_up.cost
    assert (best.amount, best.per) == (pytest.approx(2.0), "1M output tokens")
    assert second.amount == pytest.approx(0.001 / 300 * 1e6)
    assert "lowest cost per 1M output tokens" in w.ranked_by
    assert "same order as highest output tokens/s" in w.ranked_by


def test_unaligned_samples_fall_back_to_percentiles(tmp_path):
    run = generative_run(tmp_path, single_token=True)
    w = one(rec.recommend([run], parse_slos("ttft_p99=200ms,tpot_p99=50ms"), None), "streaming")
    assert w.recommended.method == "percentiles"
    assert w.recommended.goodput == pytest.approx(12.0)  # its throughput: 120 in 10 s
    assert "credited its throughput" in rec.render(
        rec.recommend([run], parse_slos("ttft_p99=200ms,tpot_p99=50ms"), None)
    )


def point(load, throughput, p99, *, offered=None, valid=True):
    return {
        "load": load,
        "offered": offered if offered is not None else load,
        "valid": valid,
        "reasons": [] if valid else ["too few samples"],
        "throughput": throughput,
        "throughput_ci95": [throughput * 0.95, throughput * 1.05],
        "error_rate": 0.0,
        "e2e": {"p50": p99 / 2, "p99": p99, "p99_adjusted": p99},
        "samples": 1000,
        "failed": 0,
        "window_s": 4.0,
        "warnings": [],
    }


def test_capacity_search_candidate_is_its_best_point_meeting_the_slo(tmp_path):
    points = [
        point(100.0, 100.0, 0.004),
        point(200.0, 199.0, 0.030),
        point(400.0, 390.0, 0.080),  # misses 50 ms
        point(300.0, 240.0, 0.040, offered=300.0),  # saturated: 80 % of offered
        point(250.0, 248.0, 0.010, valid=False),  # invalid: never a candidate
    ]
    metrics = {
        "search": {"points": points},
        "capacity": {"load": 200.0, "unit": "req/s"},
        "at_capacity": {},
    }
    record = build("capacity", "e", {"batching": "none"}, run_id="c", metrics=metrics)
    w = one(
        rec.recommend([write_run(tmp_path, "c", [record])], parse_slos("e2e_p99=50ms"), None),
        "capacity",
    )
    best = w.recommended
    assert (best.load, best.load_unit, best.goodput) == (200.0, "req/s", 199.0)
    assert best.method == "load points"
    assert best.configuration() == "batching=none at load 200 req/s"
    assert best.e2e_p99_s == pytest.approx(0.030)  # its own point's, not the settled one's
    assert (best.pareto, best.pareto_absent) == (("e2e",), None)
    tight = one(
        rec.recommend(
            [write_run(tmp_path, "c2", [record.model_copy(update={"run_id": "c2"})])],
            parse_slos("e2e_p99=2ms"),
            None,
        ),
        "capacity",
    )
    assert tight.recommended is None
    assert "e2e p99 4 ms > 2 ms (+100 %)" in tight.engines[0].verdict  # the closest point


def test_saturated_cell_is_not_recommended(tmp_path):
    warning = "saturated: completed 3270 req/s of 3518 offered (93%); latency grows with the window"
    record = build(
        "batching", "e", {"mode": "none"}, run_id="s", warnings=(warning,), **served([0.001] * 500)
    )
    w = one(
        rec.recommend([write_run(tmp_path, "s", [record])], parse_slos("e2e_p99=50ms"), None),
        "batching",
    )
    assert w.recommended is None
    assert warning in w.engines[0].verdict


def test_a_faster_path_that_changes_the_answers_is_not_recommended(tmp_path):
    breach = "parity vs pil: max abs diff 0.683 > 0.1"
    fast = build(
        "batching",
        "e",
        {"mode": "opencv"},
        run_id="p",
        warnings=(breach,),
        **served([0.001] * 900),
    )
    slow = build("batching", "e", {"mode": "pil"}, run_id="p", **served([0.001] * 500))
    run = write_run(tmp_path, "p", [fast, slow])
    w = one(rec.recommend([run], parse_slos("e2e_p99=50ms"), None), "batching")
    assert w.recommended is not None
    assert dict(w.recommended.params) == {"mode": "pil"}
    text = rec.render(rec.recommend([run], parse_slos("e2e_p99=50ms"), None))
    assert f"not recommended: changes the model's answers beyond tolerance: {breach}" in text


def test_offered_load_and_model_are_the_question_not_the_answer(tmp_path):
    # at 100 req/s nothing can reach the goodput of a 3500 req/s cell: they are not ranked
    # together; the rate is part of the scenario, the batching mode the configuration
    low = build(
        "batching", "e", {"rate": 100.0, "mode": "none"}, run_id="s", **served([0.01] * 100)
    )
    high = build(
        "batching", "e", {"rate": 3500.0, "mode": "none"}, run_id="s", **served([0.01] * 3500)
    )
    result = rec.recommend([write_run(tmp_path, "s", [low, high])], parse_slos("e2e_p99=50ms"))
    titles = [w.title for w in result.workloads]
    assert titles == ["batching rate=100", "batching rate=3500"]
    assert all(len(w.candidates) == 1 for w in result.workloads)
    assert result.workloads[0].recommended.configuration() == "mode=none"


def int8_precision_record():
    """A precision cell of engine e: int8 against its fp32 reference path, in run q."""
    metrics = {
        "precision": "int8",
        "reference": {"p50": 0.0017},
        "reduced": {"p50": 0.0154},
        "throughput": {"reference_items_per_s": 4730.0, "reduced_items_per_s": 521.0},
    }
    return build("precision", "e", {"model": "m", "precision": "int8"}, run_id="q", metrics=metrics)


def test_precision_cell_offers_its_fp32_reference_as_a_configuration(tmp_path):
    record = int8_precision_record()
    # no latency to hold it to: an SLO would be a usage error (test_slo.py), so none
    result = rec.recommend([write_run(tmp_path, "q", [record])], (), 3.6)
    w = one(result, "precision")
    assert w.title == "precision model=m"
    # named by what it measured (issue 35: it read "precision=int8 [its fp32 reference path]")
    assert (
        w.recommended.configuration() == "fp32 reference path (measured in the precision=int8 cell)"
    )
    assert w.runner_up.configuration() == "precision=int8"
    assert w.recommended.goodput == 4730.0
    assert w.runner_up.variant is None
    assert w.runner_up.cost.per == "1k items"


def parser():
    return cli.parser()


def run_cli(argv):
    out = io.StringIO()
    args = parser().parse_args(["recommend", *argv])
    code = args.func(args, Console(file=out, width=300))
    return code, out.getvalue()


def test_cli_prints_the_recommendation_and_exit_status(tmp_path):
    run = batching_run(tmp_path)
    code, out = run_cli([str(run), "--slo", "e2e_p99=50ms", "--gpu-hour-cost", "3.6"])
    assert code == 0
    assert "Recommendation for SLO e2e_p99<=50ms; machine cost 3.6 per hour" in out
    assert "RECOMMENDED: fast mode=dynamic: goodput 1000 req/s" in out
    assert "0.001 per 1k requests" in out
    code, out = run_cli([str(run), "--slo", "e2e_p99=1ms"])
    assert code == 3
    assert "NO RECOMMENDATION" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--slo", "e2e=50ms"],
            "bad --slo 'e2e=50ms': SLO 'e2e=50ms': expected METRIC_pNN=DURATION",
        ),
        (["--slo", "e2e_p99=fast"], "bad --slo 'e2e_p99=fast'"),
        (["--slo", "e2e_p99=50ms,e2e_p99=60ms"], "is given twice"),
        (["--slo", "e2e_p99=50ms", "--gpu-hour-cost", "-1"], "--gpu-hour-cost must be a positive"),
    ],
)
def test_cli_bad_input_is_a_usage_error(tmp_path, argv, message):
    run = batching_run(tmp_path)
    code, out = run_cli([str(run), *argv])
    assert code == 2
    assert message in out
    assert out.startswith("error: ")


def test_cli_unreadable_run_dir_is_a_usage_error(tmp_path):
    code, out = run_cli([str(tmp_path / "nope"), "--slo", "e2e_p99=50ms"])
    assert code == 2
    assert "cannot read run directory" in out
    assert "no manifest.json" in out
    run = batching_run(tmp_path)
    (run / "cells" / "x.json").write_text("{")
    code, out = run_cli([str(run), "--slo", "e2e_p99=50ms"])
    assert code == 2
    assert "x.json: corrupt" in out


def test_json_output_is_byte_identical_and_complete(tmp_path):
    run = batching_run(tmp_path)
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    for path in (first, second):
        code, out = run_cli([str(run), "--slo", "e2e_p99=50ms", "--json", str(path)])
        assert code == 0
        assert f"wrote {PathStyle.here().path(path)}" in out  # as published
    assert first.read_bytes() == second.read_bytes()
    data = json.loads(first.read_bytes())
    assert data["exit_code"] == 0
    batching = data["workloads"][0]
    assert batching["recommended"]["engine"] == "fast"
    assert batching["recommended"]["goodput"] == pytest.approx(1000.0)
    assert batching["recommended"]["checks"][0]["value_s"] == pytest.approx(0.01)
    assert batching["recommended"]["params"] == {"rate": 1000.0, "mode": "dynamic"}
    assert batching["recommended"]["meets"] is True
    failing = [c for c in batching["candidates"] if not c["meets"]]
    assert [c["engine"] for c in failing] == ["slow", "slow"]


def candidate(**fields):
    base = {
        "run_id": "r",
        "cell_id": "c",
        "engine": "e",
        "params": (),
        "load": None,
        "load_unit": None,
        "checks": (),
        "method": "no SLO",
        "goodput": 10.0,
        "throughput": 10.0,
        "unit": "req/s",
        "counts": "requests",
    }
    return rec.Candidate(**(base | fields))


def test_pareto_fields_validate_themselves():
    assert candidate(e2e_p99_s=0.01, pareto=("e2e",)).pareto == ("e2e",)
    with pytest.raises(ValueError, match="finite number of seconds"):
        candidate(e2e_p99_s=-0.01)
    with pytest.raises(ValueError, match="finite number of seconds"):
        candidate(ttft_p99_s=float("nan"))
    with pytest.raises(ValueError, match="has that front's latency"):
        candidate(pareto=("ttft",), e2e_p99_s=0.01)
    with pytest.raises(ValueError, match="once each"):
        candidate(pareto=("itl",))
    with pytest.raises(ValueError, match="a rate and no blocker"):
        candidate(e2e_p99_s=0.01, pareto=("e2e",), blocker="saturated")
    with pytest.raises(ValueError, match="only on its question's fronts"):
        rec.WorkloadAdvice(
            workload="w",
            hardware="h",
            scenario=(),
            slos_applied=(),
            slos_not_applicable=(),
            ranked_by="throughput",
            recommended=None,
            runner_up=None,
            engines=(),
            candidates=(candidate(e2e_p99_s=0.01, pareto=("e2e",)),),
            not_considered=(),
            fronts=(),
        )


def test_result_types_validate_themselves():
    with pytest.raises(ValueError, match="positive duration"):
        rec.Check("e2e_p99", "e2e", 99.0, 0.0, 0.01)
    with pytest.raises(ValueError, match="says why"):
        rec.Check("e2e_p99", "e2e", 99.0, 0.05, None)
    with pytest.raises(ValueError, match="finite"):
        rec.Cost(float("inf"), "1k requests")


SATURATED = "saturated: completed 1080 req/s of 1200 offered (90%); latency grows with the window"


def pareto_run(tmp_path):
    """Five configurations of one question (an engine grid: the ``config`` parameter),
    1000 req/s offered, under e2e_p99=50ms:

    a max_num_seqs=16: 1000 requests at 40 ms in 1 s -> goodput 1000, p99 40 ms: the
                       recommendation, on the E2E front (the most goodput)
    a max_num_seqs=4:   900 at 20 ms -> 900, p99 20 ms: on the front (the least latency),
                       lost by 10 %
    b default:          800 at 30 ms -> 800, p99 30 ms: beaten by a max_num_seqs=4 (more
                       goodput at less latency), lost by 20 %
    c default:         1000 at 70 ms, its samples not aligned with its requests: misses
                       the SLO with no goodput figure, so it is no point of the front
    d default:         1200 at 5 ms but saturated: never an operating point
    """
    w, rate = "batching", {"rate": 1000.0}
    unaligned = served([0.07] * 1000)
    unaligned["samples"] = {"e2e": [0.07] * 10}
    recs = [
        build(w, "a", rate | {"config": "max_num_seqs=16"}, run_id="p", **served([0.04] * 1000)),
        build(w, "a", rate | {"config": "max_num_seqs=4"}, run_id="p", **served([0.02] * 900)),
        build(w, "b", rate | {"config": "default"}, run_id="p", **served([0.03] * 800)),
        build(w, "c", rate | {"config": "default"}, run_id="p", **unaligned),
        build(
            w,
            "d",
            rate | {"config": "default"},
            run_id="p",
            warnings=(SATURATED,),
            **served([0.005] * 1200),
        ),
    ]
    return write_run(tmp_path, "p", recs)


def test_the_config_parameter_is_part_of_the_configuration_not_the_question(tmp_path):
    w = one(rec.recommend([pareto_run(tmp_path)], parse_slos("e2e_p99=50ms")), "batching")
    assert w.title == "batching rate=1000"
    assert [c.configuration() for c in w.candidates] == [
        "config=max_num_seqs=16",
        "config=max_num_seqs=4",
        "config=default",
        "config=default",
        "config=default",
    ]


def test_pareto_front_of_goodput_against_e2e_p99(tmp_path):
    w = one(rec.recommend([pareto_run(tmp_path)], parse_slos("e2e_p99=50ms")), "batching")
    assert w.fronts == ("e2e",)  # tensor cells: E2E only
    found = {(c.engine, c.configuration()): c for c in w.candidates}
    assert {k: c.pareto for k, c in found.items()} == {
        ("a", "config=max_num_seqs=16"): ("e2e",),
        ("a", "config=max_num_seqs=4"): ("e2e",),
        ("b", "config=default"): (),
        ("c", "config=default"): (),
        ("d", "config=default"): (),
    }
    assert {k: c.e2e_p99_s for k, c in found.items()} == pytest.approx(
        {
            ("a", "config=max_num_seqs=16"): 0.04,
            ("a", "config=max_num_seqs=4"): 0.02,
            ("b", "config=default"): 0.03,
            ("c", "config=default"): 0.07,
            ("d", "config=default"): 0.005,
        }
    )
    assert all(c.ttft_p99_s is None for c in w.candidates)
    assert found[("b", "config=default")].pareto_absent is None  # placed, but beaten
    assert found[("c", "config=default")].pareto_absent.startswith("no goodput figure")
    assert found[("d", "config=default")].pareto_absent == f"not an operating point: {SATURATED}"


def test_every_configuration_meeting_the_slo_says_why_it_lost(tmp_path):
    text = rec.render(rec.recommend([pareto_run(tmp_path)], parse_slos("e2e_p99=50ms")))
    lines = text.splitlines()
    listed = lines[lines.index("all configurations (best first):") + 1 :][:6]
    assert listed[0].startswith("  1. a config=max_num_seqs=16: goodput 1000 req/s [95% ")
    assert listed[0].endswith("e2e p99 40 ms <= 50 ms [Pareto: E2E]")
    assert listed[1].startswith("  2. a config=max_num_seqs=4: goodput 900 req/s [95% ")
    assert listed[1].endswith(
        "e2e p99 20 ms <= 50 ms; lost: meets the SLO but goodput 900 req/s is 10 % lower than"
        " the winner's [Pareto: E2E]"
    )
    assert listed[2].endswith(
        "e2e p99 30 ms <= 50 ms; lost: meets the SLO but goodput 800 req/s is 20 % lower than"
        " the winner's"
    )
    assert listed[3] == (
        "  4. c config=default: not recommended: e2e p99 70 ms > 50 ms (+40 %) [no Pareto"
        " point: no goodput figure (it misses the SLO; its record cannot recount the requests"
        " that met it)]"
    )
    assert listed[4] == (
        f"  5. d config=default: not recommended: {SATURATED} [no Pareto point: not an"
        f" operating point: {SATURATED}]"
    )
    assert listed[5] == "Pareto fronts: goodput vs E2E p99"
    # what the mark means is said once, before the questions
    assert text.count("[Pareto: ...] marks a configuration no other of its question beats") == 1


def test_generative_cells_have_a_ttft_and_an_e2e_front(tmp_path):
    # ttft_p99<=200ms: vllm 119 requests of 120 within it (11.9 req/s), other all 120 (12);
    # both have TTFT p99 100 ms, so other beats vllm on TTFT; vllm's E2E p99 is 720 ms,
    # other's 1960 ms, so on E2E each is optimal
    result = rec.recommend([generative_run(tmp_path)], parse_slos("ttft_p99=200ms"))
    w = one(result, "streaming")
    assert w.fronts == ("ttft", "e2e")
    found = {c.engine: c for c in w.candidates}
    assert (found["other"].ttft_p99_s, found["other"].e2e_p99_s) == pytest.approx((0.1, 1.96))
    assert (found["vllm"].ttft_p99_s, found["vllm"].e2e_p99_s) == pytest.approx((0.1, 0.72))
    assert found["other"].pareto == ("ttft", "e2e")
    assert found["vllm"].pareto == ("e2e",)
    text = rec.render(result)
    assert "  1. other max_num_seqs=16: goodput 12 req/s" in text
    assert text.count("[Pareto: TTFT, E2E]") == 1
    assert "lower than the winner's [Pareto: E2E]" in text
    assert "Pareto fronts: goodput vs TTFT p99 and goodput vs E2E p99\n" in text
    data = json.loads(rec.to_json(result))
    streaming = data["workloads"][0]
    assert streaming["fronts"] == ["ttft", "e2e"]
    assert streaming["recommended"]["pareto"] == ["ttft", "e2e"]
    assert streaming["recommended"]["ttft_p99_s"] == pytest.approx(0.1)
    assert [c["pareto"] for c in streaming["candidates"]] == [["ttft", "e2e"], ["e2e"]]
    assert [c["pareto_absent"] for c in streaming["candidates"]] == [None, None]


def test_a_workload_without_latency_figures_has_no_front(tmp_path):
    images = [
        build(
            "preprocessing",
            "e",
            {"backend": backend},
            run_id="p",
            metrics={"throughput": {"images_per_s": rate}},
        )
        for backend, rate in (("pil", 200.0), ("opencv", 300.0))
    ]
    w = one(rec.recommend([write_run(tmp_path, "p", images)], ()), "preprocessing")
    assert w.fronts == ()
    assert all(c.pareto == () for c in w.candidates)
    assert {c.pareto_absent for c in w.candidates} == {"no p99 latency figure"}
    text = rec.render(rec.recommend([tmp_path / "p"], ()))
    assert "no SLO given: ranked by throughput" in text
    assert "lost: no SLO applied; throughput 200 img/s is 33.3 % lower than the winner's" in text
    assert "Pareto" not in text  # no front, no mark: nothing to explain


def test_a_tie_on_goodput_goes_to_the_lower_latency(tmp_path):
    # an open loop offers every configuration the same 1000 requests; both complete them
    # all within the SLO: the quicker one wins, though its name sorts after the other's
    w, rate = "batching", {"rate": 1000.0}
    recs = [
        build(w, "a", rate | {"config": "x"}, run_id="t", **served([0.02] * 1000)),
        build(w, "b", rate | {"config": "x"}, run_id="t", **served([0.01] * 1000)),
    ]
    result = rec.recommend([write_run(tmp_path, "t", recs)], parse_slos("e2e_p99=50ms"), 3.6)
    w = one(result, "batching")
    assert (w.recommended.engine, w.runner_up.engine) == ("b", "a")
    assert w.recommended.pareto == ("e2e",)
    assert w.runner_up.pareto == ()
    verdicts = {v.engine: v.verdict for v in w.engines}
    assert verdicts["a"] == (
        "meets the SLO but costs what the winner does; its E2E p99 20 ms is higher than the"
        " winner's 10 ms"
    )
    text = rec.render(result)
    assert "(the same cost; its E2E p99 20 ms is higher than the winner's 10 ms;" in text
    unpriced = rec.render(rec.recommend([tmp_path / "t"], parse_slos("e2e_p99=50ms")))
    assert (
        "lost: meets the SLO but goodput 1000 req/s ties; its E2E p99 20 ms is higher than the"
        " winner's 10 ms"
    ) in unpriced


def tie_run(tmp_path):
    """Three configurations offered the same 1000 requests, under e2e_p99=50ms:

    a: all 1000 at 40 ms over a 1.0 s window      -> goodput 1000 req/s, the highest
    b: all 1000 at 10 ms over a 1.0004 s window   -> 999.6: less than one request (1/1.0004
       req/s) behind a, the windows' lengths only: a tie that b's lower p99 wins
    c: 997 of them at 5 ms over a 1.0 s window    -> 997: three requests behind a, a real
       difference however much its interval overlaps a's, so c stays behind on goodput
    """
    w, rate = "batching", {"rate": 1000.0}
    recs = [
        build(w, "a", rate, run_id="n", **served([0.04] * 1000)),
        build(w, "b", rate, run_id="n", **served([0.01] * 1000, window=1.0004)),
        build(w, "c", rate, run_id="n", **served([0.005] * 997)),
    ]
    return write_run(tmp_path, "n", recs)


def test_goodputs_within_one_request_tie_and_the_lower_p99_wins(tmp_path):
    result = rec.recommend([tie_run(tmp_path)], parse_slos("e2e_p99=50ms"))
    w = one(result, "batching")
    assert [c.engine for c in w.candidates] == ["b", "a", "c"]
    assert [c.goodput_tie for c in w.candidates] == [True, True, False]
    assert [c.goodput_step for c in w.candidates] == pytest.approx([1 / 1.0004, 1.0, 1.0])
    assert ranking.overlap(w.candidates[2], w.candidates[0])  # c's interval reaches b's
    verdicts = {v.engine: v.verdict for v in w.engines}
    assert verdicts["a"] == (
        "meets the SLO but goodput 1000 req/s is 0.04 % higher than the winner's, a tie within"
        " one request over the window; its E2E p99 40 ms is higher than the winner's 10 ms"
    )
    assert verdicts["c"] == (
        "meets the SLO but goodput 997 req/s is 0.26 % lower than the winner's"
    )
    text = rec.render(result)
    assert (
        "(0.04 % higher goodput, a tie within one request over the window; its E2E p99 40 ms"
        " is higher than the winner's 10 ms; their 95% intervals overlap" in text
    )
    data = json.loads(rec.to_json(result))["workloads"][0]
    assert data["recommended"]["goodput_tie"] is True
    assert data["recommended"]["goodput_step"] == pytest.approx(1 / 1.0004)


def test_a_goodput_ahead_of_the_winner_but_behind_the_highest_says_so(tmp_path):
    # a: 1002 requests in 1 s at 40 ms, the highest goodput; d: 500 in 0.49975 s (1000.5
    # req/s; one request there is 2 req/s) at 30 ms: within one request of a, and quicker,
    # so it wins; b: 1001 in 1 s at 35 ms, one full request behind a: no tie, though its
    # goodput is above the winner's
    w, rate = "batching", {"rate": 1000.0}
    recs = [
        build(w, "a", rate, run_id="m", **served([0.04] * 1002)),
        build(w, "b", rate, run_id="m", **served([0.035] * 1001)),
        build(w, "d", rate, run_id="m", **served([0.03] * 500, window=0.49975)),
    ]
    result = rec.recommend([write_run(tmp_path, "m", recs)], parse_slos("e2e_p99=50ms"))
    w = one(result, "batching")
    assert [c.engine for c in w.candidates] == ["d", "a", "b"]
    assert [c.goodput_tie for c in w.candidates] == [True, True, False]
    verdicts = {v.engine: v.verdict for v in w.engines}
    assert verdicts["b"] == (
        "meets the SLO but goodput 1001 req/s is 0.05 % higher than the winner's, but more"
        " than one request behind the highest goodput, which the winner's ties (within one"
        " request) with a lower p99 latency"
    )
    assert verdicts["a"].endswith(
        "a tie within one request over the window; its E2E p99 40 ms is higher than the"
        " winner's 30 ms"
    )


def powered(served_fields, watts):
    """``served_fields`` with a GPU energy measurement over its window."""
    window = served_fields["window"]["duration_s"]
    served_fields["metrics"]["energy"] = {"mean_power_w": watts, "window_s": window}
    return served_fields


def test_energy_priced_costs_keep_their_order_whatever_the_latency(tmp_path):
    # energy is not proportional to time and has no interval: the cheaper configuration
    # leads even when its goodput is within one request of a quicker one's. a: 1000 req/s
    # at 100 W, 40 ms; b: 999.6 req/s at 300 W, 10 ms: a costs a third of b's energy
    w, rate = "batching", {"rate": 1000.0}
    recs = [
        build(w, "a", rate, run_id="e", **powered(served([0.04] * 1000), 100.0)),
        build(w, "b", rate, run_id="e", **powered(served([0.01] * 1000, window=1.0004), 300.0)),
    ]
    run = write_run(tmp_path, "e", recs)
    priced = one(rec.recommend([run], parse_slos("e2e_p99=50ms"), energy_price=0.2), "batching")
    assert priced.energy_note is None
    assert [c.engine for c in priced.candidates] == ["a", "b"]
    assert [c.goodput_tie for c in priced.candidates] == [None, None]
    unpriced = one(rec.recommend([run], parse_slos("e2e_p99=50ms")), "batching")
    assert [c.engine for c in unpriced.candidates] == ["b", "a"]  # the tie rule
