"""Streaming metrics against hand-computed values."""

import pytest

from harness.metrics.streamtiming import SLO, RequestRecord, StreamMetrics, meets, parse_slos


def rec(times, tokens, *, t_sched=0.0, t_send=0.0, asked=None, reported=None, error=None):
    return RequestRecord(
        t_sched=t_sched,
        t_send=t_send,
        t_end=times[-1] if times else t_send,
        chunk_times=tuple(times),
        chunk_tokens=tuple(tokens),
        n_in=10,
        n_asked=asked if asked is not None else sum(tokens),
        n_out_reported=reported,
        error=error,
    )


def test_role_only_chunk_does_not_count_as_first_token():
    r = rec([0.05, 0.10, 0.12, 0.14], [0, 1, 1, 1], t_sched=0.0, t_send=0.02)
    assert r.t_first == 0.10
    assert r.t_last == 0.14
    assert r.tpot == pytest.approx(0.02)
    assert r.itl() == pytest.approx([0.02, 0.02])


def test_multi_token_chunk_spreads_its_gap_evenly():
    # first token at 0.1; next chunk at 0.4 carries 3 tokens: 3 ITL samples of 0.1 each
    r = rec([0.1, 0.4, 0.5], [1, 3, 1])
    assert r.n_counted == 5
    assert r.itl() == pytest.approx([0.1, 0.1, 0.1, 0.1])
    assert r.icl() == pytest.approx([0.3, 0.1])
    assert r.tpot == pytest.approx((0.5 - 0.1) / 4)


def test_engine_reported_count_wins_over_the_counted_one():
    r = rec([0.1, 0.2], [1, 1], reported=3)
    assert r.n_out == 3
    assert r.n_counted == 2
    m = StreamMetrics([r]).to_json()
    assert m["tokens"]["reported_vs_counted_mismatch"] == 1


def test_cell_metrics_from_scheduled_and_actual_send():
    a = rec([0.30, 0.40], [1, 1], t_sched=0.0, t_send=0.10)
    b = rec([1.10, 1.20], [1, 1], t_sched=1.0, t_send=1.0)
    m = StreamMetrics([a, b]).to_json()
    assert m["ttft"]["min"] == pytest.approx(0.10)
    assert m["ttft"]["max"] == pytest.approx(0.30)  # from scheduled: the late send counts
    assert m["ttft_send"]["max"] == pytest.approx(0.20)
    assert m["queue"]["max"] == pytest.approx(0.10)
    assert m["e2e"]["max"] == pytest.approx(0.40)
    assert m["throughput"]["output_tokens_per_s"] == pytest.approx(4 / 1.2)
    assert m["requests"] == {"total": 2, "ok": 2, "failed": 0, "met_slo": 2}


def test_failed_requests_count_in_adjusted_percentiles_and_goodput():
    ok = [
        rec([0.1 * i + 0.05, 0.1 * i + 0.06], [1, 1], t_sched=0.1 * i, t_send=0.1 * i)
        for i in range(6)
    ]
    bad = [rec([], [], t_sched=0.9, t_send=0.9, error="HTTP 500") for _ in range(4)]
    m = StreamMetrics([*ok, *bad], slos=parse_slos("ttft_p50=100ms,ttft_p90=100ms")).to_json()
    assert m["requests"]["failed"] == 4
    assert m["ttft"]["count"] == 6
    assert m["ttft"]["p50"] == pytest.approx(0.05)
    assert m["ttft"]["adjusted"]["p50"] == pytest.approx(0.05)  # rank 5 of 10: still a success
    assert m["ttft"]["adjusted"]["p90"] == float("inf")  # rank 9 of 10: a failure
    assert m["requests"]["met_slo"] == 6
    assert m["throughput"]["goodput_requests_per_s"] == pytest.approx(6 / 0.9)  # window: 0 .. 0.9
    assert m["errors"] == {"HTTP 500": 4}
    assert m["slo"]["ttft_p50"]["met"] is True
    assert m["slo"]["ttft_p90"]["met"] is False


def test_slo_parsing_and_per_request_check():
    slos = parse_slos("ttft_p99=200ms, tpot_p99=0.05,e2e_p99.9=2s")
    assert slos == (SLO("ttft", 99, 0.2), SLO("tpot", 99, 0.05), SLO("e2e", 99.9, 2.0))
    r = rec([0.15, 0.25, 0.35], [1, 1, 1])
    assert meets(r, slos[:1])
    assert not meets(r, (SLO("tpot", 99, 0.05),))
    assert not meets(rec([], [], error="x"), ())
    with pytest.raises(ValueError, match="METRIC_pNN"):
        parse_slos("ttft=1")
    # any latency name parses: whether a run declares it is checked once its cells are
    # known (tests/test_slo.py); a name that cannot be a metrics key is refused here
    assert parse_slos("batch_latency_p99=1") == (SLO("batch_latency", 99, 1.0),)
    with pytest.raises(ValueError, match="is not a latency name"):
        parse_slos("E2E_p99=1")


def test_retokenized_disagreement_is_flagged_not_corrected():
    agree = RequestRecord(
        0.0, 0.0, 0.2, (0.1, 0.2), (1, 1), 10, 2, n_out_reported=2, n_out_retokenized=2
    )
    differ = RequestRecord(
        0.0, 0.0, 0.2, (0.1, 0.2), (1, 1), 10, 2, n_out_reported=2, n_out_retokenized=3
    )
    tokens = StreamMetrics([agree, differ]).to_json()["tokens"]
    assert tokens["output"] == 4  # the server's count is what is reported
    assert tokens["retokenized"] == 5
    assert tokens["retokenized_requests"] == 2
    assert tokens["retokenized_mismatch"] == 1


def test_http_requests_split_first_token_time_into_network_and_the_rest():
    from harness.load.stream_summary import spans  # noqa: PLC0415
    from harness.metrics.streamtiming import RequestRecord  # noqa: PLC0415

    rec = RequestRecord(
        t_sched=0.0,
        t_send=0.001,
        t_end=0.1,
        chunk_times=(0.031, 0.05, 0.1),
        chunk_tokens=(1, 1, 1),
        n_in=3,
        n_asked=3,
        client_stats={"http_headers_s": 0.01},
    )
    got = {k: float(v[0]) for k, v in spans([rec]).items()}
    assert list(got) == ["queue", "network", "first_token", "decode"]
    assert got == pytest.approx(
        {"queue": 0.001, "network": 0.01, "first_token": 0.02, "decode": 0.069}
    )
    # without client timings there is no network span
    plain = RequestRecord(0.0, 0.001, 0.1, (0.031, 0.1), (1, 1), 3, 2)
    assert list(spans([plain])) == ["queue", "first_token", "decode"]
