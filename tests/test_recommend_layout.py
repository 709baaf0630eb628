"""What ``recommend`` prints (issue 35, item 9): the decisions first, what has no answer
in one line per workload, a configuration measured by several runs one candidate (never
ranked against itself), and a cell's second path named by what it measured."""

from __future__ import annotations

import json

from harness.metrics.streamtiming import parse_slos
from harness.report import recommend as rec
from harness.results import store
from harness.results.records import Status
from tests.test_recommend import (
    ENV_A,
    batching_run,
    build,
    int8_precision_record,
    one,
    write_run,
)

SLO = parse_slos("e2e_p99=50ms")


def skipped_run(tmp_path, name):
    """A generative workload every cell of which skipped, in two scenarios."""
    why = ("fast lacks capability family=generative that this workload needs",)
    recs = [
        build("streaming", "fast", params, run_id=name, status=Status.SKIPPED, reasons=why)
        for params in ({"load": "open", "level": 4}, {"load": "closed", "level": 1})
    ]
    return write_run(tmp_path, name, recs, env=ENV_A)


def two_runs(tmp_path):
    """The same batching configurations measured by two runs, beside skipped cells."""
    runs = [batching_run(tmp_path / n, n) for n in ("run-a", "run-b")]
    return [*runs, skipped_run(tmp_path, "skips-a"), skipped_run(tmp_path, "skips-b")]


def test_a_configuration_two_runs_measured_is_one_candidate_never_its_own_runner_up(tmp_path):
    result = rec.recommend(two_runs(tmp_path), SLO)
    w = one(result, "batching")
    best, runner = w.recommended, w.runner_up
    assert (best.engine, dict(best.params)["mode"]) == ("fast", "dynamic")
    # before: the runner-up was fast/dynamic again, from the other run, "a tie"
    assert (runner.engine, dict(runner.params)["mode"]) == ("fast", "static")
    assert [c.configuration_rank for c in w.candidates if c.identity == best.identity] == [1, 1]
    assert {c.run_id for c in w.candidates if c.identity == best.identity} == {"run-a", "run-b"}
    fast = next(v for v in w.engines if v.engine == "fast")
    assert fast.verdict == "recommended"
    slow = next(v for v in w.engines if v.engine == "slow")
    assert slow.verdict.startswith("misses the SLO in all 2 configurations;")  # not 4
    text = rec.render(result)
    assert "ties; the tie went to the winner by name and run" not in text
    assert "a tie within one request" not in text
    assert "RECOMMENDED: fast mode=dynamic [run run-a]: goodput 1000 req/s" in text
    assert "  also measured in run run-b: goodput 1000 req/s, e2e p99 10 ms <= 50 ms" in text
    assert "runner-up: fast mode=static [run run-a]: goodput 800 req/s" in text
    listed = text.split("all configurations (best first):\n")[1].split("\nPareto fronts")[0]
    assert [line.split(" [run ")[0] for line in listed.splitlines()] == [
        "  1. fast mode=dynamic",
        "  2. fast mode=static",
        "  3. slow mode=dynamic",
        "  4. slow mode=static",
    ]
    assert all("; also measured in run run-b: " in line for line in listed.splitlines())


def test_the_decisions_come_first_and_what_has_no_answer_is_one_line_per_workload(tmp_path):
    text = rec.render(rec.recommend(two_runs(tmp_path), SLO))
    lines = text.splitlines()
    assert lines[:2] == ["Recommendation for SLO e2e_p99<=50ms", "machine: Test CPU A x8, 32 GiB"]
    start = lines.index("decisions (each explained below):")
    assert start < 5
    assert lines[start + 1] == (
        "  batching rate=1000: fast mode=dynamic (goodput 1000 req/s, measured twice)"
    )
    assert lines[start + 2 : start + 4] == [
        "no answer (no valid cell was measured):",
        "  streaming: fast skipped (2 cells in 2 runs): fast lacks capability"
        " family=generative that this workload needs",
    ]
    # no section, no NO RECOMMENDATION and no second listing for the skipped workload
    assert "== streaming" not in text
    assert "NO RECOMMENDATION" not in text
    assert text.count("fast lacks capability family=generative") == 1
    # cells left out beside a recommendation: each once, however many runs have it
    assert "  cheat mode=static: failed (in 2 runs): engine raised: boom" in text
    assert text.count("cheat mode=static") == 1
    assert "every measured workload has a recommendation (exit 0)" in text


def test_a_precision_cell_s_paths_are_named_by_what_they_measured(tmp_path):
    record = int8_precision_record()
    text = rec.render(rec.recommend([write_run(tmp_path, "q", [record])], ()))  # no latency
    # before: "RECOMMENDED: e precision=int8 [its fp32 reference path]"
    assert (
        "RECOMMENDED: e fp32 reference path (measured in the precision=int8 cell):"
        " throughput 4730 items/s"
    ) in text
    assert "runner-up: e precision=int8: throughput 521 items/s" in text


def test_json_keeps_every_measurement_and_says_which_are_one_configuration(tmp_path):
    data = json.loads(rec.to_json(rec.recommend(two_runs(tmp_path), SLO)))
    assert data["schema_version"] == 2
    batching = next(w for w in data["workloads"] if w["workload"] == "batching")
    ranks = [
        (c["engine"], c["params"]["mode"], c["configuration_rank"]) for c in batching["candidates"]
    ]
    assert len(ranks) == 8  # every measurement of both runs is still there
    assert sorted(set(ranks)) == [
        ("fast", "dynamic", 1),
        ("fast", "static", 2),
        ("slow", "dynamic", 3),
        ("slow", "static", 4),
    ]
    assert batching["runner_up"]["params"]["mode"] == "static"


def test_one_run_reads_as_before_less_the_repetition(tmp_path):
    # a single run: no "measured twice", no run names, the same sections
    run = batching_run(tmp_path)
    text = rec.render(rec.recommend([run], SLO))
    assert "also measured" not in text
    assert "[run " not in text
    assert "  batching rate=1000: fast mode=dynamic (goodput 1000 req/s)" in text
    assert text.endswith(
        f"run run-a: {run}\nevery measured workload has a recommendation (exit 0)\n"
    )


def with_engine_options(run, options):
    manifest = store.read_manifest(run)
    settings = {**manifest.settings, "engine_options": options}
    store.write_manifest(run, manifest.model_copy(update={"settings": settings}))
    return run


def test_runs_made_with_other_engine_options_measured_other_configurations(tmp_path):
    one_thread = with_engine_options(
        batching_run(tmp_path / "a", "run-a"), {"fast": {"threads": "1"}}
    )
    two = with_engine_options(
        batching_run(tmp_path / "b", "run-b"), {"fast": {"threads": "2", "api_key": "sk-123"}}
    )
    result = rec.recommend([one_thread, two], SLO)
    w = one(result, "batching")
    # fast/dynamic in each run is a configuration of its own: the other is its runner-up
    assert (w.recommended.engine, w.runner_up.engine) == ("fast", "fast")
    assert dict(w.runner_up.params) == dict(w.recommended.params)
    assert w.runner_up.identity != w.recommended.identity
    text = rec.render(result)
    assert "RECOMMENDED: fast mode=dynamic (--engine-opt threads=1) [run run-a]" in text
    assert (
        "runner-up: fast mode=dynamic (--engine-opt api_key=[REDACTED] --engine-opt threads=2)"
        " [run run-b]"
    ) in text
    assert "sk-123" not in text
    fast = [line for line in text.splitlines() if " fast " in line]
    assert fast
    assert not any("also measured" in line for line in fast)
    # the slow engine had no --engine-opt in either run: one configuration, measured twice
    assert "slow mode=static [run run-a]: not recommended" in text
    data = json.loads(rec.to_json(result))
    batching = next(x for x in data["workloads"] if x["workload"] == "batching")
    assert batching["recommended"]["engine_options"] == {"threads": "1"}
