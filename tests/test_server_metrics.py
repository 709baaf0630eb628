"""The server's own view of a cell (harness.metrics.servermetrics): Prometheus text in one
vocabulary for vLLM, SGLang and TGI, the scraper, the client-versus-server gap and its
warning, the server's state in the slow-request log, the adapters' ``metrics_text``, the
workload helper, and the report's figure."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import httpx
import pytest

from engines.vllm import VllmEngine
from harness.engine import EngineConfig, EngineError, ExposesMetricsText
from harness.metrics import servermetrics as sm
from harness.metrics.slowlog import SlowLog, SlowRequest, with_telemetry
from harness.metrics.streamtiming import RequestRecord
from harness.report import htmlpage, plots, serverplot
from tests.support.report_runs import MACHINE, streaming
from tests.test_openai_http import RECORDED, engine_for, serve, server  # noqa: F401  (fixture)
from workloads.lib.generative import ServerWatch, watch_server

pytest.importorskip("prometheus_client")

DATA = Path(__file__).parent / "data"
VLLM_TEXT = DATA / "vllm-0.32-metrics.txt"

SGLANG_TEXT = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 7.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0"} 0.28
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 8128.0
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m"} 7557.0
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="m",cache_source="device"} 100.0
sglang:cached_tokens_total{model_name="m",cache_source="host"} 20.0
# HELP sglang:num_retracted_requests_total Total number of retracted requests.
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{model_name="m"} 2.0
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{model_name="m"} 2.5
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 4.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 10.0
sglang:time_to_first_token_seconds_count{model_name="m"} 10.0
# HELP sglang:e2e_request_latency_seconds Histogram of End-to-end request latency in seconds
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_sum{model_name="m"} 31.0
sglang:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 10.0
sglang:e2e_request_latency_seconds_count{model_name="m"} 10.0
# HELP sglang:queue_time_seconds Histogram of queueing time in seconds.
# TYPE sglang:queue_time_seconds histogram
sglang:queue_time_seconds_sum{model_name="m"} 0.5
sglang:queue_time_seconds_bucket{le="+Inf",model_name="m"} 10.0
sglang:queue_time_seconds_count{model_name="m"} 10.0
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="m"} 42.0
"""

TGI_TEXT = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 5
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 8
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.5"} 1
tgi_request_duration_bucket{le="+Inf"} 4
tgi_request_duration_sum 6
tgi_request_duration_count 4
# TYPE tgi_request_queue_duration histogram
tgi_request_queue_duration_bucket{le="+Inf"} 4
tgi_request_queue_duration_sum 0.2
tgi_request_queue_duration_count 4
# TYPE tgi_request_input_length histogram
tgi_request_input_length_bucket{le="+Inf"} 4
tgi_request_input_length_sum 512
tgi_request_input_length_count 4
# TYPE tgi_request_generated_tokens histogram
tgi_request_generated_tokens_bucket{le="+Inf"} 4
tgi_request_generated_tokens_sum 256
tgi_request_generated_tokens_count 4
# TYPE tgi_request_count counter
tgi_request_count 4
"""


# -- the vocabulary ----------------------------------------------------------------------


def test_real_vllm_metrics_text_maps_to_the_vocabulary():
    text = VLLM_TEXT.read_text()
    assert text.startswith("# Captured from the real vLLM")  # where it came from
    got = sm.parse(text)
    # 20 long requests at once on 16 sequences, after 3 short ones
    assert (got["requests_running"], got["requests_waiting"]) == (16.0, 4.0)
    assert got["kv_cache_usage"] == pytest.approx(0.0019533634476864847)  # a fraction
    assert (got["prompt_tokens"], got["generation_tokens"]) == (274.0, 370.0)
    assert got["ttft_count"] == 19.0  # every request that has its first token
    assert got["e2e_count"] == got["queue_count"] == 3.0  # the finished ones
    assert 0.0 < got["ttft_sum"] < 19 * 0.1
    assert (got["preemptions"], got["prefix_cache_queries"], got["prefix_cache_hits"]) == (0, 0, 0)
    # outside the vocabulary: raw names, per-reason waiting summed; no buckets, no _created
    assert got["vllm:num_requests_waiting_by_reason"] == 4.0
    assert not [k for k in got if k.endswith(("_bucket", "_created"))]
    assert "vllm:time_to_first_token_seconds_sum" not in got  # it is ttft_sum


def test_real_vllm_metrics_read_only_the_vocabulary_when_asked():
    got = sm.parse(VLLM_TEXT.read_text(), sm.SERVER_NAMES)
    assert set(got) <= set(sm.VOCABULARY)
    assert got == {k: v for k, v in sm.parse(VLLM_TEXT.read_text()).items() if k in sm.VOCABULARY}


def test_sglang_names_map_to_the_vocabulary():
    got = sm.parse(SGLANG_TEXT)
    assert {k: got[k] for k in sm.VOCABULARY if k in got} == {
        "requests_running": 3.0,
        "requests_waiting": 7.0,
        "kv_cache_usage": 0.28,
        "preemptions": 2.0,
        "prefix_cache_hits": 120.0,  # summed over its cache sources
        "prompt_tokens": 8128.0,
        "generation_tokens": 7557.0,
        "ttft_sum": 2.5,
        "ttft_count": 10.0,
        "e2e_sum": 31.0,
        "e2e_count": 10.0,
        "queue_sum": 0.5,
        "queue_count": 10.0,
    }
    assert got["sglang:gen_throughput"] == 42.0  # unknown: its raw name


def test_tgi_names_map_to_the_vocabulary():
    got = sm.parse(TGI_TEXT)
    assert {k: got[k] for k in sm.VOCABULARY if k in got} == {
        "requests_running": 8.0,
        "requests_waiting": 5.0,
        "prompt_tokens": 512.0,
        "generation_tokens": 256.0,
        "e2e_sum": 6.0,
        "e2e_count": 4.0,
        "queue_sum": 0.2,
        "queue_count": 4.0,
    }
    assert got["tgi_request_count_total"] == 4.0  # a counter, as the parser names it
    assert "ttft_sum" not in got  # TGI keeps no TTFT histogram


def test_labels_are_summed_and_a_fraction_averaged_over_engines():
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 3.0\n'
        'vllm:num_requests_running{engine="1"} 4.0\n'
        "# TYPE vllm:num_requests_waiting_by_reason gauge\n"
        'vllm:num_requests_waiting_by_reason{reason="capacity"} 9.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0"} 0.2\n'
        'vllm:kv_cache_usage_perc{engine="1"} 0.6\n'
    )
    got = sm.parse(text, sm.SERVER_NAMES)
    # a name that merely starts like a vocabulary name is not read as it
    assert got == {"requests_running": 7.0, "kv_cache_usage": pytest.approx(0.4)}


def test_text_that_is_not_prometheus_raises():
    with pytest.raises(ValueError, match="could not convert"):
        sm.parse("vllm:num_requests_running{ 3 nonsense\n")


# -- the scraper -------------------------------------------------------------------------


def _text(running: int, ttft_sum: float = 0.0, count: int = 0) -> str:
    return (
        f"vllm:num_requests_running {running}\n"
        f"vllm:time_to_first_token_seconds_sum {ttft_sum}\n"
        f"vllm:time_to_first_token_seconds_count {count}\n"
    )


def test_a_scrape_is_stamped_in_the_middle_of_its_fetch_and_failures_are_counted():
    ticks = itertools.count(10.0, 1.0)  # every clock reading one second later
    answers = iter([_text(1), "not prometheus {", RuntimeError("connection refused"), _text(2)])

    def source() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    scraper = sm.Scraper(source, clock=lambda: next(ticks))
    for _ in range(3):
        scraper.scrape()
    got = scraper.stop()  # never started: the last scrape only
    assert got.t == (10.5, 18.5)  # (before + fetched) / 2 of the two good ones
    assert [v["requests_running"] for v in got.values] == [1.0, 2.0]
    assert got.failed == 2
    assert got.first_error is not None
    assert got.first_error.startswith("ValueError")
    assert len(got.cost_s) == 4
    assert scraper.stop() is got  # idempotent


def test_the_scraper_thread_samples_until_stopped():
    calls = []
    enough = threading.Event()

    def source() -> str:
        calls.append(1)
        if len(calls) >= 5:
            enough.set()
        return _text(len(calls))

    scraper = sm.Scraper(source, interval_s=0.001)
    scraper.start()
    assert enough.wait(5.0)
    got = scraper.stop()
    after = len(calls)
    assert len(got.t) == after >= 6  # the thread's scrapes, then one at stop
    assert list(got.t) == sorted(got.t)
    assert [v["requests_running"] for v in got.values] == [float(i) for i in range(1, after + 1)]
    assert got.failed == 0
    assert len(calls) == after  # stopped: no more scrapes


def test_the_series_counts_from_the_origin_with_holes_where_a_scrape_lacked_a_name():
    scrapes = sm.Scrapes(
        t=(99.5, 100.0, 100.25),
        values=({"requests_running": 1.0}, {"requests_running": 2.0, "ttft_sum": 0.5}, {}),
    )
    assert scrapes.series(100.0) == {
        "t": [-0.5, 0.0, 0.25],
        "requests_running": [1.0, 2.0, None],
        "ttft_sum": [None, 0.5, None],
    }
    assert scrapes.state_at(100.1) == {"scrape_age_s": 0.1, "requests_running": 2.0}
    assert scrapes.state_at(99.0) is None


def test_the_series_starts_a_second_before_the_first_request():
    # scrapes while the client measured its own ceiling, seconds before the cell's load
    t = (90.0, 95.0, 98.5, 99.2, 99.7, 100.3)
    scrapes = sm.Scrapes(t=t, values=tuple({"requests_running": float(i)} for i in range(6)))
    series = scrapes.series(100.0)
    assert series == {"t": [-1.5, -0.8, -0.3, 0.3], "requests_running": [2.0, 3.0, 4.0, 5.0]}
    assert scrapes.series(100.0, lead_s=20.0)["t"][0] == -10.0


# -- client versus server ----------------------------------------------------------------


def _record(t_sched: float, ttft: float, e2e: float, ok: bool = True) -> RequestRecord:
    return RequestRecord(
        t_sched=t_sched,
        t_send=t_sched + 0.0005,
        t_end=t_sched + e2e + 0.0001,
        chunk_times=(t_sched + ttft, t_sched + e2e) if ok else (),
        chunk_tokens=(1, 1) if ok else (),
        n_in=8,
        n_asked=2,
        error=None if ok else "timeout",
    )


def _series(server_ttft: float, server_e2e: float, n: int = 4) -> dict[str, list[float]]:
    """Scrapes at -1 s (mid warm-up), -0.1 s (warm-up done: 4 requests of 1 s each),
    2 s and 4 s (the cell's ``n`` requests counted)."""
    return {
        "t": [-1.0, -0.1, 2.0, 4.0],
        "ttft_sum": [1.0, 4.0, 4.0 + server_ttft * n / 2, 4.0 + server_ttft * n],
        "ttft_count": [1.0, 4.0, 4.0 + n / 2, 4.0 + n],
        "e2e_sum": [1.0, 4.0, 4.0, 4.0 + server_e2e * n],
        "e2e_count": [1.0, 4.0, 4.0, 4.0 + n],
        "requests_running": [1.0, 0.0, 2.0, 0.0],
    }


RECORDS = [_record(float(i), ttft=0.052, e2e=0.302) for i in range(4)]


def test_the_gap_is_the_clients_mean_minus_the_servers_over_the_cell_only():
    got = sm.client_vs_server(_series(0.050, 0.300), RECORDS)
    assert got["server"] == {
        "ttft_mean_s": pytest.approx(0.050),
        "ttft_requests": 4,
        "e2e_mean_s": pytest.approx(0.300),
        "e2e_requests": 4,
    }  # the warm-up requests before t = 0 are not in it
    assert got["client"]["requests"] == 4
    assert got["client"]["ttft_mean_s"] == pytest.approx(0.052)
    assert got["client"]["ttft_send_mean_s"] == pytest.approx(0.0515)
    assert got["gap"] == {"ttft_s": pytest.approx(0.002), "e2e_s": pytest.approx(0.002)}
    assert got["bound"]["ttft_s"] == pytest.approx(0.010)  # 20 % of 50 ms is less
    assert got["bound"]["e2e_s"] == pytest.approx(0.060)  # 20 % of 300 ms is more
    assert got["exceeds"] == []
    assert sm.gap_warnings(got) == ()


def test_a_gap_above_the_bound_becomes_a_warning_naming_it():
    got = sm.client_vs_server(_series(0.020, 0.280), RECORDS)
    assert got["gap"]["ttft_s"] == pytest.approx(0.032)
    assert got["exceeds"] == ["ttft"]  # e2e: 22 ms over is under 20 % of 280 ms
    (warning,) = sm.gap_warnings(got)
    assert warning.startswith("client-server gap: the client's mean TTFT 52.0 ms is 32.0 ms")
    assert "server's own 20.0 ms (bound 10.0 ms)" in warning


def test_other_traffic_on_the_server_makes_the_means_not_comparable():
    got = sm.client_vs_server(_series(0.050, 0.300, n=6), RECORDS)
    assert got["gap"] == {}
    assert got["exceeds"] == []
    assert got["not_comparable"][0].startswith("the server counted 6 ttft over the cell")
    failed = [*RECORDS[:3], _record(3.0, 0.0, 0.3, ok=False)]  # the server saw it finish
    assert sm.client_vs_server(_series(0.050, 0.300), failed)["gap"]["e2e_s"] > 0


def test_a_server_without_latency_histograms_has_nothing_to_compare():
    series = {"t": [0.0, 1.0], "requests_running": [1.0, 2.0]}
    assert sm.client_vs_server(series, RECORDS) == {
        "absent": "the server's metrics have no TTFT or E2E histogram"
    }


# -- into the record ---------------------------------------------------------------------


def _scrapes(origin: float) -> sm.Scrapes:
    series = _series(0.050, 0.300)
    values = tuple(
        {k: v[i] for k, v in series.items() if k != "t"} for i in range(len(series["t"]))
    )
    return sm.Scrapes(t=tuple(origin + t for t in series["t"]), values=values, cost_s=(0.002,))


def test_a_slow_request_carries_the_servers_state_when_it_was_sent():
    slow = SlowRequest(
        index=2, t_sched=101.9, t_end=103.0, latency_s=1.1, why="slow", spans={"queue": 0.2}
    )
    log = sm.with_server_state(SlowLog(0.5, 1, (slow,)), _scrapes(100.0))
    assert log is not None
    # sent at 102.1: the scrape at 102.0 is the last one before it
    assert log.requests[0].server == {"scrape_age_s": 0.1, "requests_running": 2.0}
    (entry,) = with_telemetry(log, {}, None)
    assert entry["server"] == {"scrape_age_s": 0.1, "requests_running": 2.0}
    assert sm.with_server_state(None, _scrapes(100.0)) is None


def test_the_record_part_aligns_everything_on_the_first_scheduled_request():
    records = [_record(100.0 + i, ttft=0.052, e2e=0.302) for i in range(4)]
    view = sm.observe(_scrapes(100.0), records, None)
    part = view.metrics
    assert part["series"]["t"] == [-1.0, -0.1, 2.0, 4.0]
    assert part["scheduled"] == [0.0, 1.0, 2.0, 3.0]
    assert (part["scrapes"], part["failed"], part["interval_s"]) == (4, 0, 0.25)
    assert part["scrape_ms"] == {"mean": 2.0, "max": 2.0}
    assert part["client_vs_server"]["gap"]["ttft_s"] == pytest.approx(0.002)
    assert (view.slow, view.warnings) == (None, ())


def test_no_good_scrape_is_recorded_as_absent_with_the_error():
    part = sm.record(sm.Scrapes(t=(), values=(), failed=3, first_error="OSError: down"), RECORDS)
    assert part["client_vs_server"] == {"absent": "no scrape succeeded (OSError: down)"}
    assert (part["scrapes"], part["failed"], part["first_error"]) == (0, 3, "OSError: down")


# -- the adapters and the workload helper ------------------------------------------------


def _metrics_server(by_name: bool, seen: list[str]):
    """/metrics serves everything; /metrics/ (prometheus_client's mount, as vLLM's) only
    the ``name[]`` asked for, or, ``by_name`` False, is not there."""

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if not path.startswith("/metrics"):
            return server(RECORDED)(request)
        seen.append(path)
        if path == "/metrics":
            return httpx.Response(200, text=_text(3, 0.5, 2) + "other_metric 1\n")
        if not by_name:
            return httpx.Response(404, text="Not Found")
        asked = request.url.params.get_list("name[]")
        lines = _text(3, 0.5, 2).splitlines(keepends=True)
        return httpx.Response(200, text="".join(x for x in lines if x.split()[0] in asked))

    return handler


@pytest.mark.parametrize("by_name", [True, False])
def test_the_openai_adapter_asks_the_server_for_the_names_it_reads(serve, by_name):  # noqa: F811
    seen: list[str] = []
    engine = engine_for(serve, _metrics_server(by_name, seen))
    assert isinstance(engine, ExposesMetricsText)
    try:
        texts = [engine.metrics_text(sm.SERVER_NAMES) for _ in range(3)]
        whole = engine.metrics_text()
    finally:
        engine.close()
    if by_name:
        assert seen == ["/metrics/"] * 3 + ["/metrics"]
        assert texts[0] == _text(3, 0.5, 2)  # only the vocabulary's names came
    else:  # tried once, then the whole text every time
        assert seen == ["/metrics/", "/metrics", "/metrics", "/metrics", "/metrics"]
        assert texts[0] == _text(3, 0.5, 2) + "other_metric 1\n"
    assert texts[0] == texts[1] == texts[2]
    assert "other_metric 1" in whole
    assert sm.parse(texts[0], sm.SERVER_NAMES) == {
        "requests_running": 3.0,
        "ttft_sum": 0.5,
        "ttft_count": 2.0,
    }


def test_the_in_process_vllm_adapter_exposes_its_registry():
    engine = VllmEngine(EngineConfig(model=Path("m"), options={}))
    assert isinstance(engine, ExposesMetricsText)
    with pytest.raises(EngineError, match="not loaded"):
        engine.metrics_text()


def test_watch_server_records_an_engine_without_metrics_as_absent():
    class Plain:
        pass

    watch = watch_server(None, Plain())  # type: ignore[arg-type]
    view = watch.observe(RECORDS, None)
    assert view.metrics == {"absent": "Plain exposes no Prometheus metrics (ExposesMetricsText)"}
    assert isinstance(watch, ServerWatch)


def test_watch_server_scrapes_until_observed():
    finalizers = []

    class Request:
        def addfinalizer(self, fn):
            finalizers.append(fn)

    class Exposing:
        def metrics_text(self, names=None):
            assert names is sm.SERVER_NAMES
            return _text(2, 0.5, 2)

    watch = watch_server(Request(), Exposing())  # type: ignore[arg-type]
    view = watch.observe(RECORDS, None)
    assert view.metrics["scrapes"] >= 2
    assert view.metrics["series"]["requests_running"][0] == 2.0
    assert len(finalizers) == 1
    assert watch.scraper is not None
    assert finalizers[0]() is watch.scraper.stop()


# -- the report --------------------------------------------------------------------------


def _cell(server: bool = True) -> plots.Cell:
    rec = streaming("onnxruntime", "r", MACHINE, server=server)
    return plots.Cell("onnxruntime", rec, rec.reporting())


def test_the_figure_draws_client_latency_above_the_servers_gauges():
    figure = serverplot.server_over_time(_cell())
    assert figure is not None
    assert figure.name == "server-streaming-onnxruntime-concurrency-4"
    assert [p.label for p in figure.client] == ["TTFT", "E2E"]
    assert all(len(p.t) == len(p.ms) == 120 for p in figure.client)
    assert set(figure.gauges) == {"requests_running", "requests_waiting", "kv_cache_usage"}
    assert len(figure.t) == 124
    assert figure.notes == ()
    assert figure.gap == "Client mean minus the server's own: TTFT +1.2 ms, E2E +1.5 ms."
    assert serverplot.server_over_time(_cell(server=False)) is None


def test_the_figure_is_the_same_bytes_every_time():
    first, second = (serverplot.server_plots([_cell()]) for _ in range(2))
    assert [p.name for p in first] == ["server-streaming-onnxruntime-concurrency-4"]
    assert first[0].svg == second[0].svg
    assert first[0].png == second[0].png
    assert first[0].section == "Server over time"
    assert "client and server over time" in first[0].svg
    assert "how full its KV cache was (at most 20 %)" in first[0].caption
    assert first[0].caption.endswith("TTFT +1.2 ms, E2E +1.5 ms.")


def test_the_drill_down_summarizes_the_server_series():
    text = htmlpage.drill_down(_cell().record)
    assert '"requests_running": "124 values"' in text
    assert '"scheduled": "120 values"' in text
