"""workloads.lib.traces: reading Mooncake, Azure and BurstGPT traces, replaying them open loop,
and prompts whose shared prefixes follow the trace's hash ids."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from workloads.lib.traces import (
    FORMATS,
    MOONCAKE_BLOCK,
    Trace,
    TraceError,
    TraceRequest,
    detect_format,
    load_trace,
    replay,
    synthesize_prompts,
)

MOONCAKE_ROWS = [  # timestamps (ms) out of order in the file, two equal
    {"timestamp": 3000, "input_length": 700, "output_length": 5, "hash_ids": [0, 3]},
    {"timestamp": 1000, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]},
    {"timestamp": 1000, "input_length": 100, "output_length": 3, "hash_ids": [2]},
    {"timestamp": 1500, "input_length": 1025, "output_length": 2, "hash_ids": [0, 1, 4]},
]

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:46.6805901,879,55
2023-11-16 18:15:47,91,16
"""

BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
12.5,GPT-4,417,505,922,API log
"""


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(text)
    return path


def jsonl(rows: list[dict[str, object]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.fixture
def mooncake(tmp_path: Path) -> Path:
    return write(tmp_path / "mooncake.jsonl", jsonl(MOONCAKE_ROWS))


def trace_of(times: list[float], path: Path = Path("t.jsonl")) -> Trace:
    requests = tuple(TraceRequest(t, 10, 2) for t in times)
    return Trace("mooncake", path, "0" * 64, requests, {}, None)


# -- reading ------------------------------------------------------------------------------


def test_mooncake_is_sorted_stably_rebased_to_zero_and_keeps_hash_ids(mooncake):
    trace = load_trace(mooncake)
    assert trace.format == "mooncake"
    assert trace.block_size == MOONCAKE_BLOCK == 512
    assert trace.sha256 == hashlib.sha256(mooncake.read_bytes()).hexdigest()
    assert trace.rejected == {}
    assert trace.requests == (
        TraceRequest(0.0, 600, 4, (0, 1)),  # the two at 1000 ms keep their file order
        TraceRequest(0.0, 100, 3, (2,)),
        TraceRequest(0.5, 1025, 2, (0, 1, 4)),
        TraceRequest(2.0, 700, 5, (0, 3)),
    )


def test_mooncake_without_hash_ids_has_no_block_size(tmp_path):
    rows = [{"timestamp": 0, "input_length": 5, "output_length": 1}]
    trace = load_trace(write(tmp_path / "plain.jsonl", jsonl(rows)))
    assert trace.requests == (TraceRequest(0.0, 5, 1, ()),)
    assert trace.block_size is None


def test_azure_timestamps_keep_all_seven_digits_and_sort(tmp_path):
    trace = load_trace(write(tmp_path / "azure.csv", AZURE))
    assert trace.format == "azure"
    assert trace.block_size is None
    assert [(r.t_s, r.input_tokens, r.output_tokens) for r in trace.requests] == [
        (0.0, 374, 44),
        (100 / 10**9, 879, 55),  # the 7th fractional digit: 100 ns
        (319_410_000 / 10**9, 91, 16),  # no fraction at all
        (4_314_579_000 / 10**9, 396, 109),
    ]


def test_azure_zones_are_honoured_and_a_time_without_one_is_utc(tmp_path):
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-12 00:00:00+00:00,10,1\n"
        "2024-05-12T02:00:01.5+02:00,10,1\n"  # 00:00:01.5 UTC
        "2024-05-12T00:00:03Z,10,1\n"
        "2024-05-12 00:00:04.000001,10,1\n"
        "2024-05-11 23:00:05-0100,10,1\n"  # 00:00:05 UTC
    )
    trace = load_trace(write(tmp_path / "azure2024.csv", text))
    assert [r.t_s for r in trace.requests] == [0.0, 1.5, 3.0, 4.000001, 5.0]


def test_burstgpt_failed_requests_are_rejected_and_counted(tmp_path):
    trace = load_trace(write(tmp_path / "burst.csv", BURSTGPT))
    assert trace.format == "burstgpt"
    assert trace.requests == (TraceRequest(0.0, 472, 18), TraceRequest(7.5, 417, 505))
    assert trace.rejected == {"zero Response tokens (failed request)": 1}


def test_burstgpt_newer_columns_are_ignored(tmp_path):
    text = (
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
        "Total tokens,Log Type\n"
        "0.25,s1,2.5,ChatGPT,100,20,120,Conversation log\n"
        "1.75,,0.5,GPT-4,30,7,37,API log\n"
    )
    trace = load_trace(write(tmp_path / "burst3.csv", text))
    assert trace.requests == (TraceRequest(0.0, 100, 20), TraceRequest(1.5, 30, 7))


@pytest.mark.parametrize(
    ("name", "text", "fmt"),
    [
        ("a.csv", jsonl(MOONCAKE_ROWS), "mooncake"),  # the suffix does not matter
        ("a.jsonl", AZURE, "azure"),
        ("a.txt", "\ufeff\n" + BURSTGPT, "burstgpt"),  # byte-order mark, blank line
    ],
)
def test_detect_format_reads_the_first_line(tmp_path, name, text, fmt):
    path = write(tmp_path / name, text)
    assert detect_format(path) == fmt
    assert load_trace(path).format == fmt


def test_unknown_header_is_a_usage_error_naming_the_file_and_the_formats(tmp_path):
    path = write(tmp_path / "other.csv", "time,prompt,completion\n1,2,3\n")
    for call in (detect_format, load_trace):
        with pytest.raises(TraceError, match="unknown format") as info:
            call(path)
        assert str(path) in str(info.value)
        assert "ContextTokens" in str(info.value)
        assert "Request tokens" in str(info.value)
    assert issubclass(TraceError, ValueError)


def test_unreadable_or_empty_files_and_unknown_formats_are_usage_errors(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(TraceError, match=r"cannot read trace .*nope\.jsonl"):
        load_trace(missing)
    with pytest.raises(TraceError, match=r"cannot read trace .*nope\.jsonl"):
        detect_format(missing)
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path)  # a directory
    empty = write(tmp_path / "empty.csv", "\n \n")
    with pytest.raises(TraceError, match=r"empty\.csv is empty"):
        detect_format(empty)
    with pytest.raises(TraceError, match=r"empty\.csv is empty"):
        load_trace(empty, "azure")
    with pytest.raises(TraceError, match="unknown trace format 'sharegpt'; known: mooncake"):
        load_trace(empty, "sharegpt")
    assert FORMATS == ("mooncake", "azure", "burstgpt")


def test_a_format_given_explicitly_must_match_the_header(tmp_path):
    path = write(tmp_path / "burst.csv", BURSTGPT)
    with pytest.raises(TraceError, match=r"not a azure trace: its header lacks") as info:
        load_trace(path, "azure")
    assert "ContextTokens" in str(info.value)
    assert str(path) in str(info.value)
    assert load_trace(path, "burstgpt").format == "burstgpt"


def test_malformed_mooncake_lines_are_counted_per_reason(tmp_path):
    good = {"timestamp": 7, "input_length": 3, "output_length": 2, "hash_ids": [5]}
    bad_rows = [
        {"input_length": 3, "output_length": 2},
        {"timestamp": "soon", "input_length": 3, "output_length": 2},
        {"timestamp": 1, "input_length": 0, "output_length": 2},
        {"timestamp": 1, "input_length": -4, "output_length": 2},
        {"timestamp": 1, "input_length": 2.5, "output_length": 2},
        {"timestamp": 1, "input_length": True, "output_length": 2},
        {"timestamp": 1, "input_length": 3, "output_length": 0},
        {"timestamp": 1, "input_length": 3},
        {"timestamp": 1, "input_length": 3, "output_length": 2, "hash_ids": [1, -2]},
        {"timestamp": 1, "input_length": 3, "output_length": 2, "hash_ids": "1,2"},
    ]
    lines = [json.dumps(good).encode(), *(json.dumps(r).encode() for r in bad_rows)]
    lines += [b"{not json", b"[1, 2]", b'{"timestamp": NaN, "input_length": 3}', b"\xff\xfe{}"]
    trace = load_trace(write(tmp_path / "m.jsonl", b"\n".join(lines) + b"\n"))
    assert trace.requests == (TraceRequest(0.0, 3, 2, (5,)),)
    assert trace.rejected == {
        "missing timestamp": 1,
        "non-numeric timestamp": 2,  # "soon", NaN
        "zero input_length": 1,
        "negative input_length": 1,
        "non-integer input_length": 1,
        "non-numeric input_length": 1,  # a boolean is no count
        "zero output_length": 1,
        "missing output_length": 1,
        "bad hash_ids": 2,
        "bad JSON": 2,  # not JSON; JSON but not an object
        "not UTF-8": 1,
    }


def test_malformed_csv_rows_are_counted_per_reason(tmp_path):
    text = (
        b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
        b"2023-11-16 18:15:46.6805900,374,44\r\n"
        b"2023-11-16 18:15:46.6805900,374\r\n"
        b"2023-11-16 18:15:46.6805900,374,44,9\r\n"
        b"2023-11-16 18:15:46.6805900,many,44\r\n"
        b"2023-11-16 18:15:46.6805900,12.0,44\r\n"
        b"yesterday,374,44\r\n"
        b"2023-02-30 00:00:00,374,44\r\n"
        b"2023-11-16 18:15:46.1234567890,374,44\r\n"
        b",374,44\r\n"
    )
    text += "2023-11-16 18:15:47,\u00e9,1\r\n".encode("latin-1")
    trace = load_trace(write(tmp_path / "az.csv", text))
    assert [(r.t_s, r.input_tokens) for r in trace.requests] == [(0.0, 374), (0.0, 12)]
    assert trace.rejected == {
        "missing GeneratedTokens": 1,
        "too many columns": 1,
        "non-numeric ContextTokens": 1,
        "bad datetime TIMESTAMP": 3,  # words, 30 February, ten fractional digits
        "missing TIMESTAMP": 1,
        "not UTF-8": 1,
    }


def test_a_file_with_no_usable_request_names_the_file_and_the_reasons(tmp_path):
    text = BURSTGPT.splitlines()[0] + "\n3,ChatGPT,10,0,10,API log\n4,ChatGPT,x,1,1,API log\n"
    path = write(tmp_path / "allbad.csv", text)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    message = str(info.value)
    assert str(path) in message
    assert "no usable request" in message
    assert "zero Response tokens (failed request): 1" in message
    assert "non-numeric Request tokens: 1" in message
    header_only = write(tmp_path / "header.csv", AZURE.splitlines()[0] + "\n")
    with pytest.raises(TraceError, match=r"header\.csv \(azure\) has no usable request \(no rows"):
        load_trace(header_only)


def test_to_json_summarizes_the_trace(mooncake):
    record = load_trace(mooncake).to_json()
    assert record == {
        "format": "mooncake",
        "path": str(mooncake),
        "sha256": hashlib.sha256(mooncake.read_bytes()).hexdigest(),
        "requests": 4,
        "rejected": {},
        "block_size": 512,
        "span_s": 2.0,
        "mean_rate": 1.5,  # 3 gaps in 2 s
        "input_tokens": 2425,
        "output_tokens": 14,
        "distinct_hash_ids": 5,
    }
    assert json.loads(json.dumps(record)) == record


def test_to_json_sorts_the_rejections(tmp_path):
    record = load_trace(write(tmp_path / "b.csv", BURSTGPT + "9,GPT-4,-1,2,1,API log\n"))
    assert list(record.to_json()["rejected"].items()) == [
        ("negative Request tokens", 1),
        ("zero Response tokens (failed request)", 1),
    ]


# -- replay -------------------------------------------------------------------------------


def test_replay_without_options_is_the_trace_itself(mooncake):
    trace = load_trace(mooncake)
    rep = replay(trace)
    assert rep.offsets.dtype == np.float64
    assert rep.offsets.tolist() == [0.0, 0.0, 0.5, 2.0]
    assert rep.requests == trace.requests
    assert rep.scaling == {
        "slice": {"start_s": None, "end_s": None, "limit": None, "first_s": 0.0},
        "speed": None,
        "rate": None,
        "factor": 1.0,
        "count": 4,
        "span_s": 2.0,
        "mean_rate": 1.5,
        "trace_span_s": 2.0,
        "trace_mean_rate": 1.5,
    }
    with pytest.raises(ValueError, match="read-only"):
        rep.offsets[0] = 1.0


def test_replay_speed_divides_the_gaps():
    trace = trace_of([0.0, 1.0, 3.0, 7.0])
    rep = replay(trace, speed=2.0)
    assert rep.offsets.tolist() == [0.0, 0.5, 1.5, 3.5]
    assert rep.scaling["factor"] == 2.0
    assert rep.scaling["span_s"] == 3.5
    assert rep.scaling["mean_rate"] == 3 / 3.5
    assert rep.scaling["trace_mean_rate"] == 3 / 7.0


def test_replay_window_slices_by_trace_time_and_rebases_then_limit_keeps_the_first():
    trace = trace_of([0.0, 1.0, 2.5, 4.0, 6.0, 9.0])
    rep = replay(trace, window=(1.0, 6.0))  # [1, 6): 6.0 is out
    assert rep.offsets.tolist() == [0.0, 1.5, 3.0]
    assert [r.t_s for r in rep.requests] == [1.0, 2.5, 4.0]
    limited = replay(trace, window=(2.0, math.inf), limit=2, speed=0.5)
    assert limited.offsets.tolist() == [0.0, 3.0]
    assert [r.t_s for r in limited.requests] == [2.5, 4.0]
    assert limited.scaling["slice"] == {"start_s": 2.0, "end_s": None, "limit": 2, "first_s": 2.5}
    assert limited.scaling["count"] == 2
    assert replay(trace, limit=10).scaling["count"] == 6


def test_replay_rate_sets_the_mean_rate_of_the_slice():
    trace = trace_of([0.0, 1.0, 2.0, 8.0, 20.0])
    rep = replay(trace, rate=2.0, window=(0.0, 10.0))  # 4 requests, 3 gaps over 8 s
    factor = 2.0 / (3 / 8.0)
    assert rep.scaling["factor"] == factor
    assert rep.offsets.tolist() == [t / factor for t in (0.0, 1.0, 2.0, 8.0)]
    assert rep.offsets[-1] == pytest.approx(1.5)
    assert rep.scaling["mean_rate"] == pytest.approx(2.0, rel=1e-12)
    assert rep.scaling["rate"] == 2.0
    assert rep.scaling["speed"] is None
    limited = replay(trace, rate=1.0, limit=3)  # the limit comes first: 2 gaps over 2 s
    assert limited.offsets.tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"speed": 2.0, "rate": 3.0}, "mutually exclusive"),
        ({"speed": 0.0}, "speed must be a finite number > 0"),
        ({"speed": math.inf}, "speed must be a finite number > 0"),
        ({"rate": -1.0}, "rate must be a finite number > 0"),
        ({"rate": math.nan}, "rate must be a finite number > 0"),
        ({"window": (5.0, 5.0)}, r"window must be \(start_s, end_s\)"),
        ({"window": (-1.0, 5.0)}, r"window must be \(start_s, end_s\)"),
        ({"limit": 0}, "limit must be a whole number >= 1"),
        ({"limit": 2.5}, "limit must be a whole number >= 1"),
    ],
)
def test_replay_options_are_checked(options, match):
    with pytest.raises(TraceError, match=match):
        replay(trace_of([0.0, 1.0]), **options)


def test_replay_of_an_empty_window_or_a_rate_without_gaps_is_a_usage_error():
    trace = trace_of([0.0, 1.0, 1.0], Path("small.jsonl"))
    with pytest.raises(TraceError, match=r"holds no request of trace small\.jsonl .*0 to 1\.0 s"):
        replay(trace, window=(2.0, 3.0))
    with pytest.raises(TraceError, match="at least two requests at different times"):
        replay(trace, window=(1.0, 2.0), rate=5.0)
    single = replay(trace, limit=1)
    assert single.offsets.tolist() == [0.0]
    assert single.scaling["mean_rate"] is None


# -- prompts ------------------------------------------------------------------------------


def req(n: int, hash_ids: tuple[int, ...] = ()) -> TraceRequest:
    return TraceRequest(0.0, n, 1, hash_ids)


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def test_shared_hash_ids_share_exactly_their_blocks():
    block = 16
    a, b = synthesize_prompts(
        [req(3 * block, (1, 2, 3)), req(3 * block, (1, 2, 9))], vocab=1000, seed=7, block_size=block
    )
    assert len(a) == len(b) == 3 * block
    assert common_prefix(a, b) == 2 * block
    assert a[2 * block :] != b[2 * block :]


def test_a_hash_id_is_the_same_block_wherever_it_appears():
    block = 8
    a, b = synthesize_prompts(
        [req(2 * block, (4, 5)), req(3 * block, (6, 5, 4))], vocab=500, seed=1, block_size=block
    )
    assert a[:block] == b[2 * block :]
    assert a[block:] == b[block : 2 * block]


def test_prompts_are_deterministic_and_depend_on_the_seed():
    requests = [req(40, (1, 2)), req(30), req(30)]
    first = synthesize_prompts(requests, vocab=300, seed=3, block_size=16)
    assert synthesize_prompts(requests, vocab=300, seed=3, block_size=16) == first
    other = synthesize_prompts(requests, vocab=300, seed=4, block_size=16)
    assert all(x != y for x, y in zip(first, other, strict=True))
    assert first[1] != first[2]  # no hash ids: unique per request


def test_prompts_are_cut_to_the_input_length_and_padded_when_blocks_are_few():
    block = 10
    short, partial, padded, twin = synthesize_prompts(
        [req(5, (1, 2)), req(15, (1, 2)), req(25, (1, 2)), req(25, (1, 2))],
        vocab=100,
        seed=0,
        block_size=block,
    )
    assert [len(p) for p in (short, partial, padded, twin)] == [5, 15, 25, 25]
    assert partial[:5] == short  # the last block is partial
    assert padded[:15] == partial
    assert padded[:20] == twin[:20]  # both blocks shared
    assert padded[20:] != twin[20:]  # padding is seeded by the request: unique


def test_ids_stay_within_first_id_and_vocab():
    prompts = synthesize_prompts(
        [req(500, (1,)), req(500)], vocab=12, seed=5, block_size=64, first_id=4
    )
    ids = {t for p in prompts for t in p}
    assert ids == set(range(4, 12))  # every id is drawn, none outside [4, 12)
    assert all(type(t) is int for t in prompts[0])


def test_hash_ids_without_a_block_size_give_unique_prompts():
    a, b = synthesize_prompts(
        [req(20, (1, 2)), req(20, (1, 2))], vocab=1000, seed=2, block_size=None
    )
    assert common_prefix(a, b) < 3
    with_blocks = synthesize_prompts(
        [req(20, (1, 2)), req(20, (1, 2))], vocab=1000, seed=2, block_size=10
    )
    assert with_blocks[0] == with_blocks[1]  # the same blocks: the same prompt, as traced


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"vocab": 4}, "first_id < vocab"),
        ({"first_id": -1}, "first_id < vocab"),
        ({"seed": -1}, "seed must be >= 0"),
        ({"block_size": 0}, "block_size must be >= 1"),
    ],
)
def test_prompt_options_are_checked(options, match):
    kwargs = {"vocab": 100, "seed": 0, "block_size": 8, **options}
    with pytest.raises(TraceError, match=match):
        synthesize_prompts([req(4, (1,))], **kwargs)


def test_prompts_for_a_loaded_mooncake_trace_follow_its_hash_ids(mooncake):
    trace = load_trace(mooncake)
    prompts = synthesize_prompts(trace.requests, vocab=5000, seed=11, block_size=trace.block_size)
    by_ids = {r.hash_ids: p for r, p in zip(trace.requests, prompts, strict=True)}
    assert [len(p) for p in prompts] == [r.input_tokens for r in trace.requests]
    assert common_prefix(by_ids[(0, 1)], by_ids[(0, 1, 4)]) == 600  # all of the shorter one
    assert common_prefix(by_ids[(0, 3)], by_ids[(0, 1, 4)]) == 512
    assert common_prefix(by_ids[(2,)], by_ids[(0, 1)]) < 3
