"""TTFT, ITL, TPOT and E2E under each peer tool's definition, against values computed by
hand from a small hand-made stream (harness.metrics.peers)."""

import json

import pytest

from harness.metrics import peers
from harness.metrics.streamtiming import RequestRecord
from harness.results.redact import redact_text


def rec(chunks, *, t_sched, t_send, t_end, reported=None, retokenized=None, error=None):
    return RequestRecord(
        t_sched=t_sched,
        t_send=t_send,
        t_end=t_end,
        chunk_times=tuple(t for t, _ in chunks),
        chunk_tokens=tuple(k for _, k in chunks),
        n_in=8,
        n_asked=4,
        n_out_reported=reported,
        n_out_retokenized=retokenized,
        error=error,
    )


# A: open loop, 10 ms of client queueing; a 2-token chunk; a trailing 0-token usage chunk;
#    the server reports 4 tokens, the client's tokenizer finds 5.
A = rec(
    [(0.050, 1), (0.070, 2), (0.100, 1), (0.102, 0)],
    t_sched=0.0,
    t_send=0.010,
    t_end=0.105,
    reported=4,
    retokenized=5,
)
# B: a 0-token role chunk first, then 1, 1 and 2 tokens; no usage, no re-tokenization
#    (counted 4 tokens, but 3 content chunks).
B = rec(
    [(1.060, 0), (1.080, 1), (1.110, 1), (1.120, 2)],
    t_sched=1.0,
    t_send=1.015,
    t_end=1.125,
)
# C: a one-token reply, closed loop (sent when due).
C = rec([(2.030, 1)], t_sched=2.0, t_send=2.0, t_end=2.031, reported=1)
# D: failed; in no tool's figures.
D = rec([(3.050, 1)], t_sched=3.0, t_send=3.0, t_end=3.06, error="HTTP 500")

RECORDS = [A, B, C, D]


def row(table, tool, metric):
    return table["tools"][tool][metric]


def check(cell, *, p50, p99, mean, count):
    assert cell["p50"] == pytest.approx(p50)
    assert cell["p99"] == pytest.approx(p99)
    assert cell["mean"] == pytest.approx(mean)
    assert cell["count"] == count


@pytest.fixture(scope="module")
def table():
    return peers.reconcile(RECORDS)


def test_only_successful_requests_count(table):
    assert table["requests"] == {"total": 4, "ok": 3}
    assert table["unit"] == "s"
    for tool in peers.TOOLS:
        assert row(table, tool, "ttft")["count"] == 3
        assert row(table, tool, "e2e")["count"] == 3


def test_harness_counts_from_the_scheduled_time(table):
    # TTFT: A 0.050-0, B 1.080-1.0 (role chunk skipped), C 2.030-2.0
    check(row(table, "harness", "ttft"), p50=0.050, p99=0.080, mean=0.16 / 3, count=3)
    # E2E to the last token: A 0.100, B 0.120, C 0.030
    check(row(table, "harness", "e2e"), p50=0.100, p99=0.120, mean=0.25 / 3, count=3)


def test_harness_itl_is_per_token_and_tpot_excludes_the_first(table):
    # A: 0.020 over 2 tokens -> 0.010, 0.010; 0.030 -> 0.030.
    # B: 0.030 -> 0.030; 0.010 over 2 tokens -> 0.005, 0.005. C: none.
    check(row(table, "harness", "itl"), p50=0.010, p99=0.030, mean=0.09 / 6, count=6)
    # A (0.100-0.050)/3, B (1.120-1.080)/3 (4 tokens counted); C has none
    check(row(table, "harness", "tpot"), p50=0.04 / 3, p99=0.05 / 3, mean=0.015, count=2)


def test_vllm_ttft_starts_at_send_and_stops_at_the_role_chunk(table):
    # A 0.050-0.010, B 1.060-1.015 (the role chunk has choices), C 2.030-2.0
    check(row(table, "vllm-bench-serve", "ttft"), p50=0.040, p99=0.045, mean=0.115 / 3, count=3)
    # latency to the last chunk with choices (the usage chunk at 0.102 not counted):
    # A 0.100-0.010, B 1.120-1.015, C 0.030
    check(row(table, "vllm-bench-serve", "e2e"), p50=0.090, p99=0.105, mean=0.075, count=3)


def test_vllm_itl_is_one_sample_per_chunk_gap(table):
    # A: 0.020, 0.030; B: 0.020 (role -> first token), 0.030, 0.010; C: none
    check(row(table, "vllm-bench-serve", "itl"), p50=0.020, p99=0.030, mean=0.022, count=5)
    # per chunk vs per token: vLLM pools 5 gaps, the harness 6 per-token samples
    assert row(table, "vllm-bench-serve", "itl")["mean"] > row(table, "harness", "itl")["mean"]


def test_vllm_tpot_uses_usage_and_excludes_one_token_replies(table):
    # A (0.090-0.040)/(4-1) with usage 4 (not the tokenizer's 5);
    # B (0.105-0.045)/(4-1), no usage: tokenizer count, here the 4 counted; C: output_len 1
    check(row(table, "vllm-bench-serve", "tpot"), p50=0.05 / 3, p99=0.020, mean=0.11 / 6, count=2)


def test_aiperf_itl_is_one_average_per_request_over_its_tokenizer_count(table):
    # TTFT to the first content: A 0.040, B 1.080-1.015, C 0.030
    check(row(table, "aiperf", "ttft"), p50=0.040, p99=0.065, mean=0.045, count=3)
    # A (0.090-0.040)/(5-1) with the tokenizer's 5; B (0.105-0.065)/(4-1); C: OSL 1, none
    check(
        row(table, "aiperf", "itl"), p50=0.0125, p99=0.04 / 3, mean=(0.0125 + 0.04 / 3) / 2, count=2
    )
    check(row(table, "aiperf", "e2e"), p50=0.090, p99=0.105, mean=0.075, count=3)


def test_aiperf_has_no_tpot(table):
    cell = row(table, "aiperf", "tpot")
    assert cell["defined"] is False
    assert (cell["p50"], cell["p99"], cell["mean"], cell["count"]) == (None, None, None, 0)
    assert "no TPOT" in cell["how"]


def test_guidellm_weights_itl_by_tokens_and_counts_iterations_without_usage(table):
    check(row(table, "guidellm", "ttft"), p50=0.040, p99=0.065, mean=0.045, count=3)
    # A (0.100-0.050)/(4-1), weight 3; B: no usage, so 3 content iterations = 3 tokens:
    # (1.120-1.080)/(3-1) = 0.020, weight 2; C weight 0, dropped
    check(row(table, "guidellm", "itl"), p50=0.05 / 3, p99=0.020, mean=0.09 / 5, count=5)


def test_guidellm_tpot_includes_the_first_token_and_one_token_replies(table):
    # A (0.100-0.010)/4 w4, B (1.120-1.015)/3 w3, C (2.030-2.0)/1 w1 (C's TTFT)
    check(row(table, "guidellm", "tpot"), p50=0.0225, p99=0.035, mean=0.225 / 8, count=8)
    # request_latency runs to the end of the stream: t_end - t_send
    check(row(table, "guidellm", "e2e"), p50=0.095, p99=0.110, mean=0.236 / 3, count=3)


def test_one_token_replies_are_excluded_where_each_tool_excludes_them():
    only_c = peers.samples([C])
    assert only_c["harness"]["itl"] == []
    assert only_c["harness"]["tpot"] == []
    assert only_c["vllm-bench-serve"]["itl"] == []
    assert only_c["vllm-bench-serve"]["tpot"] == []
    assert only_c["aiperf"]["itl"] == []
    assert only_c["guidellm"]["itl"] == []
    assert only_c["guidellm"]["tpot"] == pytest.approx([0.030])  # kept, weight 1
    for tool in peers.TOOLS:
        assert only_c[tool]["ttft"] == pytest.approx([0.030])
        assert peers.SINGLE_TOKEN[tool]


def test_a_role_chunk_before_a_single_token_gives_vllm_one_itl_gap():
    r = rec([(0.02, 0), (0.05, 1)], t_sched=0.0, t_send=0.0, t_end=0.06, reported=1)
    got = peers.samples([r])
    assert got["vllm-bench-serve"]["itl"] == pytest.approx([0.03])
    assert got["vllm-bench-serve"]["ttft"] == pytest.approx([0.02])
    assert got["vllm-bench-serve"]["tpot"] == []
    assert got["harness"]["itl"] == []


def test_the_table_is_json_and_documents_every_cell(table):
    back = json.loads(json.dumps(table))
    assert back == table
    assert set(back["tools"]) == set(peers.TOOLS)
    for tool in peers.TOOLS:
        assert set(back["tools"][tool]) == set(peers.METRICS)
        for metric in peers.METRICS:
            cell = back["tools"][tool][metric]
            assert cell["how"] == peers.definition(tool, metric).how
            assert cell["source"]
            assert cell["p99_is_max"] is True  # a handful of samples: p99 is the max
    assert any("scheduled time" in d for d in back["differences"])
    assert any("per chunk gap" in d for d in back["differences"])


def test_every_peer_source_is_cited_with_a_commit():
    for d in peers.DEFINITIONS:
        if d.tool != "harness":
            assert "@" in d.source
            commit = d.source.split("@", 1)[1].split()[0]
            assert len(commit) == 40
            assert int(commit, 16) >= 0
    with pytest.raises(KeyError):
        peers.definition("aiperf", "nope")


def test_no_successful_request_gives_empty_cells():
    got = peers.reconcile([D])
    assert got["requests"] == {"total": 1, "ok": 0}
    cell = got["tools"]["vllm-bench-serve"]["ttft"]
    assert (cell["p50"], cell["mean"], cell["count"]) == (None, None, 0)
    assert cell["defined"] is True


# --- in the report ---------------------------------------------------------------------


def test_the_report_shows_the_table_for_a_cell_that_has_one(table, tmp_path):
    from harness.report import htmlpage, peersplot, plots, runset  # noqa: PLC0415
    from tests.test_traffic_plots import SPEC, _record, _write_run  # noqa: PLC0415

    labels, rows = peersplot.table(table)
    assert labels == ["harness", "vllm-bench-serve", "aiperf", "guidellm"]
    ttft = {tool: row[0] for tool, row in zip(labels, rows, strict=True)}
    expect = row(table, "harness", "ttft")["p50"] * 1e3
    assert ttft["harness"] == f"{expect:.3g}"
    assert rows[labels.index("aiperf")][3] == "-"  # AIPerf defines no TPOT
    cell = plots.Cell("onnxruntime", _record("onnxruntime", "r", {}, SPEC), SPEC)
    with_table = cell.record.model_copy(update={"metrics": {**cell.record.metrics, "peers": table}})
    (figure,) = peersplot.peer_tables([plots.Cell("onnxruntime", with_table, SPEC)])
    assert figure.section == peersplot.SECTION
    svg = figure.svg.decode() if isinstance(figure.svg, bytes) else figure.svg
    assert "vllm-bench-serve" in svg
    assert "TTFT p50 (ms)" in svg
    assert figure.caption.startswith("Where they differ: ")
    assert peersplot.peer_tables([cell]) == []  # a record without the table: no figure
    page, _ = htmlpage.render(runset.load([_write_run(tmp_path, [({}, SPEC)])]))
    assert peersplot.SECTION not in page  # nothing to show, no section


def test_the_differences_survive_the_results_files_secret_masking():
    for line in peers.DIFFERENCES:
        assert redact_text(line, secrets=()) == line
