"""SLOs on any declared latency (harness.metrics.slo): parsed by syntax, held to what the
cells declare (``ReportSpec.latencies``), judged in one place for a run's summaries and
for ``recommend``; an SLO naming a latency nothing declares is a usage error.

The pytest side (a run refusing such an SLO before it measures, a workload's own latency
judged in its records) is in tests/test_workload_contract.py."""

from __future__ import annotations

import re

import numpy as np
import pytest

from harness import cli
from harness.exceptions import UsageError
from harness.load.serve_summary import summarize_trace
from harness.metrics import stats
from harness.metrics.slo import (
    SLO,
    check_named,
    parse_slos,
    slo_verdicts,
    slos_on,
    within,
)
from harness.metrics.streamtiming import StreamMetrics
from harness.report import recommend as rec
from harness.results.reportspec import Latency, Rate, ReportSpec
from harness.session.cell import check_declared
from tests.test_recommend import build, run_cli, served, write_run
from tests.test_slowlog import _serve_fake
from tests.test_stream_timing import rec as request

# --- parsing: any latency name, by syntax --------------------------------------------


def test_any_latency_name_parses():
    assert parse_slos("batch_latency_p99=20ms, e2e_p99.9=1s") == (
        SLO("batch_latency", 99, 0.02),
        SLO("e2e", 99.9, 1.0),
    )
    assert parse_slos("") == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("E2E_p99=1s", "'E2E' is not a latency name"),
        ("9lives_p99=1s", "'9lives' is not a latency name"),
        ("e2e.p99_p99=1s", "'e2e.p99' is not a latency name"),
        ("e2e=1s", "expected METRIC_pNN=DURATION"),
        ("e2e_p100=1s", "percentile must be in (0, 100)"),
        ("e2e_p99=soon", "'soon' is not a duration"),
        ("e2e_p99=1s,e2e_p99=2s", "e2e_p99 is given twice"),
    ],
)
def test_a_malformed_slo_is_refused_naming_it(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_slos(text)


# --- which SLOs apply, and a name nothing declares ------------------------------------


def test_a_cell_is_held_to_the_slos_on_its_latencies_in_their_order():
    slos = parse_slos("ttft_p99=1s,batch_latency_p50=2ms,e2e_p99=3s")
    assert slos_on(slos, ("e2e", "ttft")) == (slos[0], slos[2])
    assert slos_on(slos, ("batch_latency",)) == (slos[1],)
    assert slos_on(slos, ()) == ()


def test_an_slo_on_a_latency_nothing_declares_is_a_one_line_usage_error():
    slos = parse_slos("e2e_p99=1s,batch_latency_p99=2ms,batch_latency_p50=1ms")
    check_named(slos[:1], {"e2e", "ttft"}, where="the selected cells", fix="do this")
    with pytest.raises(UsageError) as raised:
        check_named(slos, {"ttft", "e2e"}, where="the selected cells", fix="do this")
    assert str(raised.value) == (
        "--slo batch_latency_p99, batch_latency_p50: no latency named batch_latency in the"
        " selected cells; they declare: e2e, ttft; do this"
    )
    with pytest.raises(UsageError, match=r"in these runs; they declare none; do that$"):
        check_named(slos, set(), where="these runs", fix="do that")


# --- judging: per cell and per request ------------------------------------------------


def test_a_cell_is_judged_on_the_error_adjusted_percentile_of_its_own_latency():
    # 100 requests of 10 ms and one failed: the adjusted p99 is the 100th of 101, 10 ms
    metrics = {
        "batch_latency": stats.to_json(stats.summarize([0.01] * 100, failed=1)),
        "e2e": stats.to_json(stats.summarize([0.5] * 10)),  # too few samples for a p99
    }
    slos = parse_slos("batch_latency_p99=20ms,e2e_p99=1s,ttft_p99=1s")
    verdicts = slo_verdicts(metrics, slos, ("batch_latency", "e2e"))
    assert verdicts == {
        "batch_latency_p99": {"threshold_s": 0.02, "value_s": 0.01, "met": True},
        "e2e_p99": {"threshold_s": 1.0, "value_s": None, "met": False},
    }  # ttft is another workload's: left out
    assert slo_verdicts(metrics, parse_slos("batch_latency_p99=5ms"), ("batch_latency",)) == {
        "batch_latency_p99": {"threshold_s": 0.005, "value_s": 0.01, "met": False}
    }


def test_a_request_is_within_every_slo_on_a_latency_it_has():
    values = {"e2e": np.array([0.01, 0.02, 0.03]), "ttft": np.array([0.001, 0.005, 0.001])}
    slos = parse_slos("e2e_p99=25ms,ttft_p50=2ms,batch_latency_p99=1us")
    assert within(values, slos).tolist() == [True, False, False]
    assert within(values, ()).tolist() == [True, True, True]
    assert within({"e2e": [0.5]}, parse_slos("e2e_p99=1s")).tolist() == [True]


def test_a_served_trace_is_held_to_its_e2e_slos_only():
    """What each tensor workload filtered itself (``e2e_slos``) is the summary's now: the
    run's other SLOs, another workload's, change nothing in its metrics."""
    trace = _serve_fake(stall_call=150, stall_s=0.030, n=300, rate=200.0)
    alone = summarize_trace(trace, 200.0, parse_slos("e2e_p99=5ms"))
    mixed = summarize_trace(
        trace, 200.0, parse_slos("ttft_p99=1us,e2e_p99=5ms,batch_latency_p50=1us")
    )
    assert mixed.metrics == alone.metrics
    assert list(mixed.metrics["slo"]) == ["e2e_p99"]
    assert mixed.slow is not None
    assert alone.slow is not None
    assert mixed.slow.threshold_s == alone.slow.threshold_s == 0.005  # the SLO sets the bar
    assert 0 < alone.metrics["requests"]["met_slo"] < 300


def test_a_stream_is_held_to_its_own_latencies_only():
    reqs = [
        request([0.1 * i + 0.05, 0.1 * i + 0.07], [1, 1], t_sched=0.1 * i, t_send=0.1 * i)
        for i in range(5)
    ]
    alone = StreamMetrics(reqs, parse_slos("ttft_p50=60ms")).to_json()
    mixed = StreamMetrics(reqs, parse_slos("batch_latency_p50=1us,ttft_p50=60ms")).to_json()
    assert mixed == alone
    assert list(alone["slo"]) == ["ttft_p50"]
    assert alone["requests"]["met_slo"] == 5


# --- the declaration --------------------------------------------------------------------


def test_a_latency_declaration_is_checked_when_it_is_made():
    spec = ReportSpec(latencies=(Latency(name="batch_latency", samples="batch_latency"),))
    assert spec.latency_names() == ("batch_latency",)
    assert ReportSpec().latency_names() == ()
    with pytest.raises(ValueError, match="'Batch latency' is not a latency name"):
        Latency(name="Batch latency")
    with pytest.raises(ValueError, match="latencies: each name once"):
        ReportSpec(latencies=(Latency(name="e2e"), Latency(name="e2e")))
    with pytest.raises(ValueError, match="unit"):
        Latency(name="e2e", unit="ms")  # type: ignore[arg-type]


def test_a_declared_latency_the_metrics_lack_fails_the_cell_naming_it():
    spec = ReportSpec(latencies=(Latency(name="batch_latency"),))
    check_declared({"batch_latency": {"p50": 0.1}}, (), spec)
    message = (
        "report_spec latency 'batch_latency' names metrics path 'batch_latency', which this"
        " cell lacks: metrics has no 'batch_latency' (it has: latency)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_declared({"latency": {"p50": 0.1}}, (), spec)


# --- recommend: a workload's own latency, and a name no run declares -------------------

OWN = ReportSpec(
    throughput=Rate(
        metric="throughput.requests_per_s", unit="req/s", counts="requests", completed="done"
    ),
    latencies=(Latency(name="batch_latency", samples="batch_latency"),),
)


def own_latency(engine: str, latencies: list[float], spec: ReportSpec = OWN, run_id="own"):
    """A record of a new workload, ``batches``, which measures its own latency."""
    n = len(latencies)
    return build(
        "batches",
        engine,
        {},
        run_id=run_id,
        metrics={
            "batch_latency": stats.to_json(stats.summarize(latencies)),
            "throughput": {"requests_per_s": n / 1.0},
            "done": n,
        },
        samples={"batch_latency": latencies},
        window={"duration_s": 1.0},
        report_spec=spec,
    )


def own_run(tmp_path):
    # fast: every batch within 20 ms; slow: 150 of 200 within 20 ms, p99 50 ms
    return write_run(
        tmp_path,
        "own",
        [
            own_latency("fast", [0.01] * 200),
            own_latency("slow", [0.01] * 150 + [0.05] * 50),
        ],
    )


def test_recommend_holds_a_workload_to_its_own_declared_latency(tmp_path):
    result = rec.recommend([own_run(tmp_path)], parse_slos("batch_latency_p99=20ms"))
    (w,) = result.workloads
    assert w.slos_applied == ("batch_latency_p99<=20ms",)
    assert w.recommended.engine == "fast"
    assert w.recommended.method == "samples"  # recounted from the declared samples
    slow = next(c for c in w.candidates if c.engine == "slow")
    assert (slow.goodput, slow.meets) == (150.0, False)  # its p99 misses; 150 within
    assert "batch_latency p99 50 ms > 20 ms (+150 %)" in rec.render(result)
    # under a p50 SLO both meet it; goodput counts each request's own latency: 150 of 200
    (w,) = rec.recommend([tmp_path / "own"], parse_slos("batch_latency_p50=20ms")).workloads
    assert {c.engine: (c.meets, c.goodput) for c in w.candidates} == {
        "fast": (True, 200.0),
        "slow": (True, 150.0),
    }


def test_recommend_refuses_an_slo_on_a_latency_no_run_declares(tmp_path):
    with pytest.raises(rec.RecommendError) as raised:
        rec.recommend([own_run(tmp_path)], parse_slos("e2e_p99=1s"))
    assert str(raised.value) == (
        "--slo e2e_p99: no latency named e2e in these runs; they declare: batch_latency;"
        " name one of those, or leave --slo out to rank by throughput"
    )
    code, out = run_cli([str(tmp_path / "own"), "--slo", "e2e_p99=1s"])
    assert code == rec.EXIT_USAGE
    assert out.startswith("error: --slo e2e_p99: no latency named e2e in these runs;")
    # without --slo: every question ranked by throughput
    code, out = run_cli([str(tmp_path / "own")])
    assert code == rec.EXIT_OK, out
    assert "Recommendation for SLO (none)" in out
    assert "no SLO given: ranked by throughput" in out


def test_report_html_refuses_such_an_slo_too(tmp_path, capsys):
    own_run(tmp_path)
    code = cli.main(["report", str(tmp_path / "own"), "--html", "--slo", "e2e_p99=1s"])
    assert code == 2
    assert "error: --slo e2e_p99: no latency named e2e in these runs" in capsys.readouterr().out


def test_records_that_declare_no_latencies_hold_those_of_the_built_in_ones_they_have(tmp_path):
    """Records written before latencies were declared (no spec at all, or a spec without
    the field) are read as the reports always read them."""
    legacy = build("batching", "a", {"rate": 1.0}, run_id="old", **served([0.01] * 200))
    undeclared = own_latency("b", [0.01] * 200, OWN.model_copy(update={"latencies": None}), "old")
    run = write_run(tmp_path, "old", [legacy, undeclared])
    result = rec.recommend([run], parse_slos("e2e_p99=50ms"))
    applied = {w.workload: w.slos_applied for w in result.workloads}
    assert applied == {"batching": ("e2e_p99<=50ms",), "batches": ()}
    with pytest.raises(rec.RecommendError, match="they declare: e2e;"):
        rec.recommend([run], parse_slos("batch_latency_p99=50ms"))
