"""benchmarks/client_vs_vllm.py's judgement, on made-up points: when a point is sustained,
when a rate holds over repeats, what a ceiling is, and what vLLM's saved result says."""

from __future__ import annotations

from benchmarks.client_vs_vllm import Point, _vllm_summary, ceilings, summary


def point(client: str, rate: float, ok: bool, lag_s: float | None = 0.001) -> Point:
    done = 100 if ok else 50
    return Point(client, rate, rate, 100, done, 0, rate * done / 100, lag_s, None, None)


def test_a_point_is_sustained_at_95_percent_with_no_failure_and_the_lag_bound():
    assert point("harness", 1000, ok=True).sustained
    assert not point("harness", 1000, ok=False).sustained  # 0.5 of offered
    assert not point("harness", 1000, ok=True, lag_s=0.0021).sustained
    # vLLM keeps no due times: no lag to hold it to
    assert point("vllm", 1000, ok=True, lag_s=None).sustained
    failed = Point("vllm", 1000, 1000, 100, 99, 1, 990, None, None, None)
    assert not failed.sustained


def test_a_ceiling_is_the_top_of_the_unbroken_run_of_rates_that_hold():
    points = [
        *(point("harness", 1000, ok) for ok in (True, True, False)),  # 2 of 3: holds
        *(point("harness", 2000, ok) for ok in (False, False, True)),  # 1 of 3: does not
        *(point("harness", 3000, ok) for ok in (True, True, True)),  # above a miss: luck
        point("vllm", 1000, ok=False, lag_s=None),
    ]
    assert ceilings(points) == {"harness": 1000, "vllm": None}


def test_vllms_saved_result_gives_its_rate_and_how_late_its_last_request_went():
    doc = {
        "completed": 10,
        "failed": 0,
        "request_throughput": 9.5,
        "start_times": [100.0, 100.2, 101.05],
        "ttfts": [0.01, 0.02, 0.03],
    }
    got = _vllm_summary(doc, rate=10.0, n=10)
    assert got["achieved"] == 9.5
    assert abs(got["last_send_late_s"] - 0.05) < 1e-9  # span 1.05 s, schedule 10/10 = 1 s
    assert got["ttft_p50_s"] == 0.02


def test_the_summary_names_both_ceilings_and_their_ratio():
    points = [point("harness", 1000, True), point("vllm", 1000, True, lag_s=None)]
    doc = {
        "points": [p.to_json() for p in points],
        "ceilings": ceilings(points),
        "ceiling_ratio": 1.0,
        "output_len": 16,
        "duration_s": 5.0,
        "repeats": 1,
        "server_cpu": 0,
        "client_cpu": 1,
    }
    text = summary(doc)
    assert "| harness | 1000 | 1000 | 1000 | 1.000 | 1.00 ms | - | 0 | yes |" in text
    assert "Ceilings: harness 1000 req/s, vllm bench serve 1000 req/s; ratio 1.0" in text
