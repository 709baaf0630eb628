"""The dataset and trace-replay workloads end to end on the null-gen engine (the harness's
own streaming engine: known service times, no model to load), and their options.

Real engines run the same workloads in tox -e vllm (tests/test_vllm_traffic.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.exceptions import UsageError
from harness.results.records import Status
from harness.session.outcome import RunExit
from harness.session.traffic import parse_traffic
from tests.support.runner import by_prefix_cache, pytest_workloads, run_workloads
from workloads.lib import traces
from workloads.lib.tracegen import default_trace

NULL_GEN = ("--engine=null-gen", "--profile=quick")
SLOW_TOKENS = "--engine-opt=null-gen.token_time_s=0.005"  # short natural replies still fill 1 s
FAST_TOKENS = "--engine-opt=null-gen.token_time_s=0.0002"


def fake_model(tmp_path: Path) -> Path:
    """What null-gen needs of a model: a vocabulary size and a context length."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(
        json.dumps({"vocab_size": 512, "max_position_embeddings": 2048})
    )
    return model


def chat_jsonl(path: Path) -> Path:
    rows = [
        {"messages": [{"role": "user", "content": f"tell me about item {i} " * (3 + i % 5)}]}
        for i in range(40)
    ]
    rows[3] = {"messages": [{"role": "user", "content": "   "}]}  # an empty turn
    lines = [json.dumps(r) for r in rows] + ["{not json"]
    path.write_text("\n".join(lines) + "\n")
    return path


def defaults(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "dataset": None,
        "dataset_format": "auto",
        "output_mode": "reference",
        "output_cap": 128,
        "trace": None,
        "trace_format": "auto",
        "trace_speed": None,
        "trace_rate": None,
        "trace_slice": None,
        "trace_limit": None,
        "session_spec": None,
    }
    return base | over


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"trace_speed": 2.0}, "need --trace-file"),
        (
            {"dataset": "/nonexistent/file.jsonl"},
            "--dataset '/nonexistent/file.jsonl' does not exist",
        ),
        ({"output_mode": "long"}, "--output-mode 'long': choose fixed"),
        ({"trace": __file__, "trace_slice": "5:1"}, "--trace-slice '5:1': expected START:END"),
        ({"trace_format": "csv"}, "--trace-format 'csv': choose one of"),
        ({"output_cap": 0}, "--output-cap must be >= 1"),
        ({"session_spec": "turns=2,size=3"}, "'size=3' is not KEY=VALUE with KEY one of turns"),
        ({"session_spec": "turns"}, "'turns' is not KEY=VALUE"),
        ({"session_spec": "user=lots"}, "user must be a number"),
        ({"session_spec": "turns=2.5"}, "turns, user and reply are whole numbers"),
        ({"session_spec": "turns=0"}, "turns, user and reply must be >= 1"),
        ({"session_spec": "rate=0"}, "rate must be > 0 sessions/s"),
        ({"session_spec": "think=-1"}, "think must be >= 0 seconds"),
        ({"session_spec": "think=inf"}, "think must be finite"),
    ],
)
def test_bad_traffic_options_are_usage_errors(over: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=None) as info:
        parse_traffic(**defaults(**over))  # type: ignore[arg-type]
    assert message in str(info.value)


def test_a_session_spec_names_what_it_changes_and_defaults_the_rest() -> None:
    traffic = parse_traffic(**defaults(session_spec="turns=4, reply=48,rate=2.5"))  # type: ignore[arg-type]
    spec = traffic.session_spec
    assert spec is not None
    assert (spec.turns, spec.user, spec.reply, spec.think, spec.rate) == (4, 32, 48, 0.2, 2.5)
    assert spec.label == "spec-t4-u32-r48-think0.2-rate2.5"
    assert traffic.to_json()["session_spec"] == {
        "turns": 4,
        "user": 32,
        "reply": 48,
        "think": 0.2,
        "rate": 2.5,
    }
    # without one the settings are what runs made before the option recorded
    assert "session_spec" not in parse_traffic(**defaults()).to_json()  # type: ignore[arg-type]


@pytest.mark.slow
def test_sessions_from_a_spec_hit_the_prefix_cache_only_when_on(tmp_path: Path) -> None:
    run = run_workloads(
        tmp_path,
        *NULL_GEN,
        FAST_TOKENS,
        "--engine-opt=null-gen.prefill_token_s=0.0002",
        f"--model={fake_model(tmp_path)}",
        "--requests=100",
        "--session-spec=turns=4,user=40,reply=8,think=0.05,rate=8",
        "-k",
        "test_sessions",
    )
    assert run.returncode == 0, run.stdout[-3000:]
    by_cache = by_prefix_cache(run, "sessions")
    for record in by_cache.values():
        assert record.status is Status.OK, record.reasons
        assert record.params["dataset"] == "spec-t4-u40-r8-think0.05-rate8"
        sessions = record.metrics["sessions"]
        assert sessions["source"] == "spec"
        assert sessions["count"] == 25  # 100 turns of 4
        assert sessions["turns"] == 100
        assert record.metrics["ttft_later_turns"]["count"] == 75
        assert set(record.samples["asked_tokens"]) == {8.0}
    on, off = by_cache["on"].metrics["prefix_cache"], by_cache["off"].metrics["prefix_cache"]
    assert off["hits"] == 0
    assert on["hits"] > 0  # each later turn's history: the earlier turns' whole blocks
    later = {k: r.metrics["ttft_later_turns"]["p50"] for k, r in by_cache.items()}
    assert later["on"] < later["off"], later


def test_speed_and_rate_exclude_each_other(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n')
    with pytest.raises(UsageError, match="give one"):
        parse_traffic(**defaults(trace=str(trace), trace_speed=2.0, trace_rate=3.0))  # type: ignore[arg-type]
    ok = parse_traffic(**defaults(trace=str(trace), trace_speed=2.0, trace_slice="10:"))  # type: ignore[arg-type]
    assert (ok.trace_speed, ok.trace_slice) == (2.0, (10.0, None))


@pytest.mark.slow
def test_dataset_workload_on_a_chat_file_with_natural_replies(tmp_path: Path) -> None:
    data = chat_jsonl(tmp_path / "chat.jsonl")
    run = run_workloads(
        tmp_path,
        *NULL_GEN,
        SLOW_TOKENS,
        f"--model={fake_model(tmp_path)}",
        f"--dataset={data}",
        "--output-mode=natural",
        "--output-cap=24",
        "--requests=100",
        "-k",
        "test_dataset and closed-4",
    )
    assert run.returncode == 0, run.stdout[-3000:]
    (record,) = run.records.values()
    assert record.status is Status.OK
    assert record.params["output"] == "natural"
    assert "output-natural" in record.cell_id or "output=natural" in record.cell_id
    used = record.metrics["dataset"]
    assert used["rejected"] == {"empty turn": 1, "not valid JSON": 1}
    assert used["output_mode"] == "natural"
    out = np.asarray(record.samples["output_tokens"])
    asked = np.asarray(record.samples["asked_tokens"])
    assert set(asked) == {24.0}  # the cap
    assert out.min() >= 1
    assert out.max() <= 24
    assert len(set(out)) > 3  # replies ended where the engine ended them
    assert record.metrics["tokens"]["input_source"] == {"engine": len(out)}
    assert "natural" in (run.run_dir / "matrix.md").read_text()


@pytest.mark.slow
def test_trace_replay_schedules_the_scaled_trace(tmp_path: Path) -> None:
    run = run_workloads(
        tmp_path,
        *NULL_GEN,
        FAST_TOKENS,
        f"--model={fake_model(tmp_path)}",
        "--trace-speed=2",
        f"--trace-file={default_trace(0)}",
        "--trace-limit=100",  # the fewest with a p99
        "-k",
        "test_trace",
    )
    assert run.returncode == 0, run.stdout[-3000:]
    (record,) = run.records.values()
    assert record.status is Status.OK
    expected = traces.replay(traces.load_trace(default_trace(0)), speed=2.0, limit=100).offsets
    got = np.asarray(record.samples["scheduled"])
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-6)  # the clock's and rounding's resolution
    info = record.metrics["trace"]
    assert info["format"] == "mooncake"
    assert info["scaling"]["speed"] == 2.0
    assert len(info["sha256"]) == 64
    assert np.allclose(np.diff(expected), record.samples["interarrival"], atol=1e-6)


@pytest.mark.slow
def test_a_dataset_with_no_usable_entry_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"foo": 1}\n{not json\n')
    proc = pytest_workloads(
        tmp_path,
        *NULL_GEN,
        f"--model={fake_model(tmp_path)}",
        f"--dataset={bad}",
        "-k",
        "test_dataset",
    )
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert str(bad) in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_sessions_workload_reports_first_and_later_turns(tmp_path: Path) -> None:
    run = run_workloads(
        tmp_path,
        *NULL_GEN,
        FAST_TOKENS,
        f"--model={fake_model(tmp_path)}",
        "--requests=100",
        "-k",
        "test_sessions and off",
    )
    assert run.returncode == 0, run.stdout[-3000:]
    (record,) = run.records.values()
    assert record.status is Status.OK
    assert record.params == {"dataset": "synthetic-chat", "prefix_cache": "off"}
    sessions = record.metrics["sessions"]
    first = record.metrics["ttft_first_turn"]["count"]
    later = record.metrics["ttft_later_turns"]["count"]
    assert first == sessions["count"]  # every session's first turn answered
    assert later > 0  # the generated conversations have later turns
    assert first + later == sessions["turns"] == record.metrics["requests"]["ok"]
    assert sessions["open_at_once"]["max"] >= 1
    # null-gen counts its prefix cache as vLLM does: off, nothing looked up
    assert record.metrics["prefix_cache"] == {"hits": 0.0, "queries": 0.0, "hit_rate": None}
    assert [h.label for h in record.headline][:2] == ["TTFT p50 turn 1", "later turns"]


def test_shared_prefix_requests_cover_what_a_cache_can_reuse() -> None:
    from workloads.test_shared_prefix import USER, shared_requests  # noqa: PLC0415

    reqs, reusable = shared_requests(50, 3, 512, prompts=2, length=64)
    assert len({r.prompt for r in reqs}) == 50  # each with a user part of its own
    heads = [r.prompt[:64] for r in reqs]
    assert len(set(heads)) == 2  # two shared system prompts
    seen: set[object] = set()
    found = 0
    for head in heads:
        found += 64 if head in seen else 0
        seen.add(head)
    assert reusable == found / sum(len(r.prompt) for r in reqs)
    assert all(USER[1] <= len(r.prompt) - 64 <= USER[2] for r in reqs)


@pytest.mark.slow
def test_shared_prefix_workload_reports_the_engines_hit_rate(tmp_path: Path) -> None:
    """null-gen with a modelled prefill: the cache on finds every prefix sent before (the
    engine's hit rate is the reusable share exactly: 512 is whole blocks) and buys TTFT."""
    run = run_workloads(
        tmp_path,
        *NULL_GEN,
        FAST_TOKENS,
        "--engine-opt=null-gen.prefill_token_s=0.0001",
        f"--model={fake_model(tmp_path)}",
        "--requests=100",
        "-k",
        "test_shared_prefix",
    )
    assert run.returncode == 0, run.stdout[-3000:]
    by_cache = by_prefix_cache(run, "shared_prefix")
    for record in by_cache.values():
        assert record.status is Status.OK, record.reasons
        assert record.params["prompts"] == 4
        assert record.params["length"] == 512
        assert record.engine_info["effective"]["prefix_cache"] is (record is by_cache["on"])
    on, off = by_cache["on"].metrics["prefix_cache"], by_cache["off"].metrics["prefix_cache"]
    assert off["hits"] == off["queries"] == 0
    assert on["hits"] > 0
    assert on["hit_rate"] == pytest.approx(on["reusable_share"])
    assert on["reusable_share"] == off["reusable_share"] > 0.8  # the same requests
    ttft = {k: r.metrics["ttft"]["p50"] for k, r in by_cache.items()}
    assert ttft["on"] < ttft["off"] / 2, ttft  # 51 ms of modelled prefill saved


@pytest.mark.slow
def test_a_fixed_prefix_cache_option_skips_the_other_setting(tmp_path: Path) -> None:
    run = run_workloads(
        tmp_path,
        *NULL_GEN,
        "--engine-opt=null-gen.prefix_cache=1",
        f"--model={fake_model(tmp_path)}",
        "-k",
        "test_shared_prefix and off",
    )
    # every cell skipped: nothing measured is not a pass (exit 12)
    assert run.returncode == RunExit.NOTHING_MEASURED, run.stdout[-3000:]
    (record,) = run.records.values()
    assert record.status is Status.SKIPPED
    assert record.reasons == (
        "--engine-opt prefix_cache=1 fixes the prefix cache; this cell studies it off",
    )
