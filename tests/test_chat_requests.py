"""Requests as users send them (text prompts, chat conversations, natural end of sequence)
on the engines that need no engine installed: the harness's own ``null-gen``, and the chat
rendering that the vLLM and TensorRT-LLM adapters share (with a fake tokenizer).

The real engines' runs of the same requests are in ``tests/test_vllm_live.py`` (vLLM in
process and behind its OpenAI server) and ``tests/test_openai_http.py`` (the HTTP adapter
on a loopback server); TensorRT-LLM's and LMDeploy's mapping in
``tests/test_llm_gpu_paths.py``, on recording fakes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engines.llmstream import NoChatTemplate, chat_prompt_ids, has_chat_template
from engines.null import NullGenerativeEngine, input_tokens, reply_length
from harness.engine import Chunk, EngineConfig, GenerationRequest, Message
from harness.load.clock import MonotonicClock
from harness.load.streamdriver import Driver
from tests.test_llm_gpu_paths import CHAT, CHAT_IDS, CHAT_TEXT, FakeChatTokenizer


def null_gen() -> NullGenerativeEngine:
    engine = NullGenerativeEngine(EngineConfig(Path("none")))
    engine.load()
    return engine


async def collect(engine: NullGenerativeEngine, request: GenerationRequest) -> list[Chunk]:
    return [chunk async for chunk in engine.generate(request)]


# -- null-gen -------------------------------------------------------------------------------


def test_null_gen_counts_text_and_chat_prompts_as_words():
    text = GenerationRequest("  Bada kefi\tlomo\nzuri ", 3)
    chat = GenerationRequest(
        "", 3, messages=(Message("system", "Be brief."), Message("user", "Bada kefi lomo?"))
    )
    tokens = GenerationRequest((5, 6, 7, 8, 9), 3)
    assert [input_tokens(r) for r in (text, chat, tokens)] == [4, 5, 5]
    engine = null_gen()
    for request, n_in in ((text, 4), (chat, 5), (tokens, 5)):
        chunks = asyncio.run(collect(engine, request))
        assert [c.n_tokens for c in chunks] == [1, 1, 1]  # ignore_eos: what was asked
        assert [c.prompt_tokens for c in chunks] == [n_in] * 3
        assert [c.completion_tokens for c in chunks] == [1, 2, 3]
        assert [c.finish_reason for c in chunks] == [None, None, "length"]


def test_null_gen_natural_end_is_a_seeded_length_per_request_id():
    asked = 50
    requests = [
        GenerationRequest(f"prompt {i}", asked, ignore_eos=False, request_id=f"r0-{i}")
        for i in range(40)
    ]
    lengths = [reply_length(r) for r in requests]
    assert all(1 <= n <= asked for n in lengths)
    assert len(set(lengths)) > 10  # varying lengths, not one
    assert sum(lengths) / len(lengths) < asked * 0.8  # a natural run ends short of the cap
    # reproducible: the same ids give the same lengths (in any process: no hash())
    again = [
        reply_length(GenerationRequest("x", asked, ignore_eos=False, request_id=f"r0-{i}"))
        for i in range(40)
    ]
    assert again == lengths
    assert lengths[:5] == [reply_length(r) for r in requests[:5]]
    engine = null_gen()
    short = next(r for r, n in zip(requests, lengths, strict=True) if n < asked)
    chunks = asyncio.run(collect(engine, short))
    assert len(chunks) == reply_length(short)
    assert chunks[-1].finish_reason == "stop"  # the "model" ended it, not the cap
    assert chunks[-1].completion_tokens == reply_length(short)
    # ignore_eos: exactly max_tokens, whatever the id
    assert reply_length(GenerationRequest("x", asked, request_id="r0-1")) == asked


def test_null_gen_natural_lengths_are_pinned():
    """random.Random seeded with a string is the same in every process and Python 3.x
    (no hash(), so PYTHONHASHSEED does not enter): these lengths are fixed. A change of
    how they are drawn changes every natural-EOS run on null-gen, and must show here."""
    lengths = [
        reply_length(GenerationRequest(p, 16, ignore_eos=False, request_id=f"q{i}"))
        for i, p in enumerate(("x", "y", "z", "x y", "a", (4, 5)))
    ]
    assert lengths == [10, 10, 13, 15, 14, 1]  # the request id alone decides


def test_the_driver_records_null_gens_input_count_and_natural_lengths():
    driver = Driver(null_gen(), MonotonicClock(), 5.0)
    chat = GenerationRequest(
        "", 32, ignore_eos=False, request_id="c1", messages=(Message("user", "a b c"),)
    )
    record = asyncio.run(driver.one(chat, 0.0))
    assert record.error is None
    assert (record.n_in, record.n_in_source) == (3, "engine")
    assert record.n_asked == 32
    assert record.n_out_reported == reply_length(chat) == sum(record.chunk_tokens)


# -- chat rendering for prompt-taking engines (vLLM, TensorRT-LLM) ---------------------------


def test_chat_is_rendered_with_the_template_and_one_bos():
    tokenizer = FakeChatTokenizer()
    assert has_chat_template(tokenizer)
    ids = chat_prompt_ids(tokenizer, CHAT, "/models/m")
    assert tokenizer.rendered == [CHAT_TEXT]  # the generation prompt asked for
    assert ids == CHAT_IDS
    assert ids.count(FakeChatTokenizer.BOS) == 1  # not the template's and the tokenizer's


def test_a_model_without_a_chat_template_is_refused_not_sent_raw_text():
    tokenizer = FakeChatTokenizer(chat_template=None)
    assert not has_chat_template(tokenizer)
    assert not has_chat_template(object())  # no chat template API at all
    with pytest.raises(NoChatTemplate, match="/models/base has no chat template"):
        chat_prompt_ids(tokenizer, CHAT, "/models/base")
    assert tokenizer.rendered == []
