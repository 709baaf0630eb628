"""The openai engine's transformers dialect and the ``transformers serve`` command line,
without a server (the live server: tests/test_transformers_serve_live.py)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from engines import transformers_server
from engines.openai_http import OpenAIEngine, RequestFailed, StreamState, server_conflict
from harness.engine import EngineConfig, EngineError, GenerationRequest, Message


class TokenizerDouble:
    """A test double of a Hugging Face tokenizer: decodes ids as ``t<id>`` words."""

    def decode(self, ids: tuple[int, ...]) -> str:
        return " ".join(f"t{i}" for i in ids)


def engine(dialect: str, tokenizer: object | None = None) -> OpenAIEngine:
    config = EngineConfig(
        model=Path("/nonexistent"),
        device="cpu",
        options={"base_url": "http://127.0.0.1:9", "dialect": dialect},
    )
    eng = OpenAIEngine(config)
    eng.served_model = "m"
    eng._tokenizer = tokenizer
    return eng


def test_transformers_dialect_sends_what_transformers_serve_takes():
    eng = engine("transformers", TokenizerDouble())
    body = eng.payload(GenerationRequest((5, 6, 7), 8, request_id="r"))
    assert body["prompt"] == "t5 t6 t7"  # text: its /v1/completions refuses token ids
    assert "ignore_eos" not in body  # an unknown field is HTTP 422 there
    assert json.loads(body["generation_config"]) == {"eos_token_id": -1}
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 8
    natural = eng.payload(GenerationRequest("Hello", 8, ignore_eos=False))
    assert natural["prompt"] == "Hello"
    assert "generation_config" not in natural  # the reply ends at the model's EOS
    chat = eng.payload(GenerationRequest("", 4, messages=(Message("user", "Hi"),)))
    assert chat["messages"] == [{"role": "user", "content": "Hi"}]
    described = eng.describe()
    assert described["dialect"] == "transformers"
    assert described["token_id_prompts"].startswith("decoded to text")


def test_the_dialect_follows_the_server_the_harness_starts_unless_given():
    def dialect(**options: str) -> str:
        config = EngineConfig(model=Path("/nonexistent"), device="cpu", options=options)
        return OpenAIEngine(config).dialect

    assert dialect() == "vllm"
    assert dialect(server="transformers") == "transformers"
    assert dialect(base_url="http://127.0.0.1:9", dialect="transformers") == "transformers"
    assert dialect(server="vllm") == "vllm"


def test_vllm_dialect_is_unchanged():
    body = engine("vllm").payload(GenerationRequest((5, 6, 7), 8))
    assert body["prompt"] == [5, 6, 7]
    assert body["ignore_eos"] is True
    assert "generation_config" not in body
    assert body["stream_options"]["continuous_usage_stats"] is True


def test_token_ids_without_a_tokenizer_is_an_engine_error():
    with pytest.raises(EngineError, match="needs the run's tokenizer"):
        engine("transformers").payload(GenerationRequest((5, 6), 4))


def event(text: str = "", finish: str | None = None) -> str:
    return json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]})


def usage(completion: int) -> str:
    return json.dumps({"choices": [], "usage": {"completion_tokens": completion}})


def test_a_transformers_stream_ends_at_its_finish_without_done():
    state = StreamState("completions", transformers_serve=True)
    assert state.feed(event(" a")) is not None
    last = state.feed(event("", "length"))
    assert last is not None
    assert last.n_tokens == 0
    final = state.feed(usage(1))
    assert final is not None
    assert final.n_tokens == 0
    assert final.completion_tokens == 1
    state.close()  # no [DONE]: its last chunk ends it
    cut = StreamState("completions", transformers_serve=True)
    cut.feed(event(" a"))
    with pytest.raises(RequestFailed, match="without a finish_reason"):
        cut.close()
    strict = StreamState("completions")
    strict.feed(event("", "length"))
    with pytest.raises(RequestFailed, match=r"without \[DONE\]"):
        strict.close()


def test_tokens_without_text_are_counted_by_the_final_usage():
    eos = StreamState("completions", transformers_serve=True)
    eos.feed(event("", "stop"))  # the EOS, first and only: no text
    final = eos.feed(usage(1))
    assert final is not None
    assert final.n_tokens == 1
    held = StreamState("completions", transformers_serve=True)
    held.feed(event(" a"))
    held.feed(event(" b", "length"))
    assert held.feed(usage(3)).n_tokens == 1  # type: ignore[union-attr]  # a byte at the end
    vllm = StreamState("completions")
    vllm.feed(event("", "stop"))
    assert vllm.feed(usage(1)).n_tokens == 0  # type: ignore[union-attr]  # vLLM: running usage


def test_server_settings_conflict_with_a_server_the_user_runs():
    why = server_conflict({"base_url": "http://127.0.0.1:8000", "server": "transformers"})
    assert why is not None
    assert why.startswith("server sets the server the harness starts")
    why = server_conflict({"server": "transformers", "dialect": "vllm"})
    assert why is not None
    assert "leave dialect unset" in why
    assert server_conflict({"base_url": "http://127.0.0.1:8000", "dialect": "transformers"}) is None
    with pytest.raises(ValueError, match="server must be vllm or transformers"):
        OpenAIEngine.validate_options({"server": "sglang"})


def test_transformers_serve_command_line():
    argv = transformers_server.command(
        Path("/m"), 8123, "cuda:1", {"max_num_batched_tokens": "512"}
    )
    assert argv[1:5] == ["-m", "transformers.cli.transformers", "serve", "/m"]
    assert "--continuous-batching" in argv
    pairs = dict(itertools.pairwise(argv))
    assert pairs["--host"] == "127.0.0.1"  # loopback only
    assert pairs["--port"] == "8123"
    assert pairs["--device"] == "cuda:1"
    assert pairs["--cb-max-batch-tokens"] == "512"
    default = transformers_server.command(Path("/m"), 1, "cpu")
    assert default[default.index("--cb-max-batch-tokens") + 1] == "2048"
    with pytest.raises(ValueError, match="max_num_seqs"):
        transformers_server.setting_flags({"max_num_seqs": "4"})
