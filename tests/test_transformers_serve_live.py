"""Hugging Face ``transformers serve`` behind the openai engine, for real (the CPU build of
torch, the embedded tiny Llama): requests as users send them, a server that cannot start,
and the generative workloads through a harness-started server
(``--engine-opt openai.server=transformers``), checked record by record. Needs
``tox -e transformers``; skipped with the reason elsewhere."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from engines import transformers_server
from harness.engine import EngineConfig, GenerationRequest, Message
from harness.load.clock import MonotonicClock
from harness.load.streamdriver import Driver
from harness.metrics.streamtiming import RequestRecord
from harness.results.records import Status
from tests.support.runner import Run, run_workloads

pytestmark = pytest.mark.slow

for _module in transformers_server.MODULES:
    pytest.importorskip(_module, reason=f"{_module} is not installed (tox -e transformers)")

CONVERSATION = (Message("system", "Answer in one word."), Message("user", "Bada kefi lomo zuri?"))


@pytest.fixture(scope="module")
def model() -> Path:
    from workloads.lib.llm import embedded_llm  # noqa: PLC0415

    return embedded_llm(0)


@pytest.fixture(scope="module")
def server(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with transformers_server.transformers_server(model, log) as started:
        yield started.base_url


def test_takes_text_token_ids_chat_and_natural_end(server: str, model: Path):
    from transformers import AutoTokenizer  # noqa: PLC0415

    from engines.openai_http import OpenAIEngine  # noqa: PLC0415
    from tests.support.llmrequests import chat_template_ids, prompt_ending_at_eos  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    eos_prompt = prompt_ending_at_eos(model, as_text=True)
    ids = tuple(range(10, 26))
    requests = {
        "text": GenerationRequest("Bada kefi lomo zuri.", 4),
        "ids": GenerationRequest(ids, 6),
        "chat": GenerationRequest("", 4, messages=CONVERSATION),
        "natural": GenerationRequest(eos_prompt, 8, ignore_eos=False),
        "fixed": GenerationRequest(eos_prompt, 8),
    }
    options = {"base_url": server, "dialect": "transformers"}
    engine = OpenAIEngine(EngineConfig(model=model, device="cpu", options=options))
    engine.load()

    async def send() -> dict[str, RequestRecord]:
        driver = Driver(engine, MonotonicClock(), 60.0)
        done = {name: await driver.one(req, 0.0) for name, req in requests.items()}
        await engine.aclose()
        return done

    records = asyncio.run(send())
    engine.close()
    for name, rec in records.items():
        assert rec.error is None, (name, rec.error)
        assert rec.n_in_source == "engine", name
    text, by_ids, chat, natural, fixed = (records[k] for k in requests)
    assert text.n_in == len(tokenizer.encode("Bada kefi lomo zuri."))
    assert text.n_out == 4
    # token ids go as their text: the server's count is of that text, tokenized again
    assert by_ids.n_in == len(tokenizer.encode(tokenizer.decode(ids)))
    assert by_ids.n_out == 6
    assert chat.n_in == len(chat_template_ids(model))
    assert chat.n_out == 4
    assert tokenizer.encode(tokenizer.decode(eos_prompt)) == list(eos_prompt)
    assert natural.n_out == 1  # ended where the model ended it
    assert fixed.n_out == 8  # generation_config's eos_token_id -1: what was asked
    assert engine.describe()["dialect"] == "transformers"


def test_a_server_that_cannot_start_says_why_in_its_own_words(tmp_path: Path):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    with (
        pytest.raises(RuntimeError) as failed,
        transformers_server.transformers_server(
            empty, tmp_path / "server.log", ready_timeout_s=120
        ),
    ):
        pytest.fail("a server without a model started")
    message = str(failed.value)
    assert message.startswith("transformers serve exited with")
    assert "not-a-model" in message
    assert (tmp_path / "server.log").read_text()


# one measured cell per workload (each costs CI time); the in-process run
# (tests/test_transformers.py) covers the engine's cells more widely
SERVED = (
    "(test_streaming and closed-4) or (test_dataset and closed-4) or test_sessions"
    " or test_shared_prefix or test_trace or test_continuous_batching"
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    result = run_workloads(
        tmp_path_factory.mktemp("served"),
        "--engine=openai",
        "--engine-opt",
        "openai.server=transformers",
        # half the fewest with a p99: cells come out invalid (too few samples), which is
        # what CI's time allows; the in-process run measures 100 per cell
        "--requests=50",
        "-k",
        SERVED,
    )
    print(result.stdout[-6000:])  # the matrix, for the log
    assert result.returncode in (0, 10), result.stdout[-6000:]
    return result


def test_generative_workloads_run_through_transformers_serve(run: Run):
    ok = [r for r in run.records.values() if r.status in (Status.OK, Status.INVALID)]
    workloads = {r.workload for r in ok}
    assert {"streaming", "dataset", "sessions", "shared_prefix", "trace"} <= workloads
    for rec in ok:
        server = rec.engine_info["server"]
        assert server["server"] == "transformers"
        assert server["started_by"] == "the harness"
        assert server["version"]
        assert rec.engine_info["dialect"] == "transformers"
        m = rec.metrics
        assert m["requests"]["failed"] == 0, rec.cell_id
        assert 0 < m["ttft"]["p50"] <= m["e2e"]["p50"], rec.cell_id
    streaming = [r for r in ok if r.workload == "streaming"]
    assert streaming
    for rec in streaming:
        tokens = rec.metrics["tokens"]
        assert tokens["output"] == tokens["asked"] > 0  # eos ignored: exactly what was asked


def test_what_transformers_serve_cannot_be_set_to_is_skipped_saying_so(run: Run):
    batching = [r for r in run.records.values() if r.workload == "continuous_batching"]
    assert batching
    for rec in batching:
        assert rec.status is Status.SKIPPED
        assert list(rec.reasons) == [transformers_server.CANNOT_SET["max_num_seqs"]]
    prefix = [r for r in run.records.values() if "prefix_cache" in r.params]
    assert {r.params["prefix_cache"] for r in prefix} == {"off", "on"}
    for rec in prefix:
        if rec.params["prefix_cache"] == "off":
            assert rec.status is Status.SKIPPED
            assert list(rec.reasons) == [transformers_server.CANNOT_SET["prefix_caching_off"]]
        else:
            assert rec.status in (Status.OK, Status.INVALID), (rec.cell_id, rec.reasons)
