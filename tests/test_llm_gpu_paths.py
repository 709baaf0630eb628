"""The GPU code paths of the LLM adapters (LMDeploy, vLLM on CUDA, TensorRT-LLM) on a CPU.

These test adapter logic only: what the adapters ask of their engines and how they read
the answers. The engines are recording fakes put in ``sys.modules`` (LMDeploy,
TensorRT-LLM) or in place of a loaded engine (vLLM); nothing here measures or runs a real
engine, and a passing test says nothing about the engines' own behaviour on a GPU.
"""

from __future__ import annotations

import asyncio
import enum
import importlib.util
import logging
import sys
import types
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engines import lmdeploy as lmd
from engines import tensorrt_llm as trtllm
from engines.llmstream import NoChatTemplate
from engines.vllm import OPTIONS as VLLM_OPTIONS
from engines.vllm import VllmEngine
from harness.engine import (
    Chunk,
    EngineConfig,
    EngineError,
    GenerationRequest,
    Message,
    RequestError,
    is_fatal,
)
from harness.load.clock import MonotonicClock
from harness.load.streamdriver import Driver

# -- LMDeploy: a recording AsyncEngine in place of lmdeploy ----------------------------------


class FakeErrorCode(enum.Enum):
    """The few ``lmdeploy.serve.core.ErrorCode`` members these tests raise."""

    INVALID_REQUEST = "invalid_request"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    INTERNAL_ERROR = "internal_error"


class FakeLMDeployRequestError(RuntimeError):
    """Shaped like ``lmdeploy.serve.core.RequestError`` (0.16+): a code and a message."""

    def __init__(self, code: FakeErrorCode, message: str | None = None):
        self.code = code
        self.message = message or f"{code.value} (fake)"
        super().__init__(self.message)


class FakeConfig:
    """A backend or generation config: keeps its keyword arguments as attributes."""

    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs
        self.__dict__.update(kwargs)


class TurbomindEngineConfig(FakeConfig):
    pass


class PytorchEngineConfig(FakeConfig):
    pass


class GenerationConfig(FakeConfig):
    pass


def out(ids: list[int], total: int, finish: str | None = None, text: str = "") -> Any:
    """One ``GenOut`` as ``AsyncEngine.generate`` yields it: delta ids, running count."""
    return SimpleNamespace(
        response=text,
        token_ids=ids,
        generate_token_len=total,
        input_token_len=3,
        finish_reason=finish,
    )


class RecordingAsyncEngine:
    """Stands in for ``lmdeploy.serve.core.AsyncEngine`` to test the adapter's logic only.

    Records its construction, every ``start_loop`` (with the loop running at the call),
    ``preprocess`` and ``generate`` call and ``close``; ``preprocess`` raises ``refuse``
    and ``generate`` streams ``script`` then raises ``fail``, if set. Like the real one,
    ``generate`` refuses anything ``preprocess`` did not return and ``preprocess`` wants
    exactly one of messages and input_ids.
    """

    last: RecordingAsyncEngine | None = None

    def __init__(
        self,
        model_path: str,
        backend: str = "turbomind",
        backend_config: FakeConfig | None = None,
        **kwargs: Any,
    ):
        self.built = {"model_path": model_path, "backend": backend, **kwargs}
        self.backend = backend
        self.backend_config = backend_config
        self.started: list[tuple[asyncio.AbstractEventLoop, bool, asyncio.AbstractEventLoop]] = []
        self.preprocessed: list[dict[str, Any]] = []
        self.generated: list[bool] = []
        self.streams_closed = 0
        self.closed = 0
        self.script = [out([7, 8], 2), out([9], 3), out([], 3, "length")]
        self.fail: BaseException | None = None
        self.refuse: BaseException | None = None
        RecordingAsyncEngine.last = self

    def start_loop(self, loop: asyncio.AbstractEventLoop, use_async_api: bool = False) -> bool:
        self.started.append((loop, use_async_api, asyncio.get_running_loop()))
        return True

    async def preprocess(
        self,
        messages: Any,
        session_id: int,
        gen_config: GenerationConfig | None = None,
        do_preprocess: bool = True,
        input_ids: list[int] | None = None,
        **kwargs: Any,
    ) -> Any:
        if (messages is None) == (input_ids is None):
            raise FakeLMDeployRequestError(FakeErrorCode.INVALID_REQUEST, "one of the two")
        if self.refuse is not None:
            raise self.refuse
        call = {"messages": messages, "input_ids": input_ids, "session_id": session_id}
        call |= {"gen_config": gen_config, "do_preprocess": do_preprocess, **kwargs}
        self.preprocessed.append(call)
        return ("prepared", session_id)

    async def generate(self, request: Any, stream_response: bool = True) -> AsyncIterator[Any]:
        if not (isinstance(request, tuple) and request[0] == "prepared"):
            raise TypeError("generate requires a PreprocessedRequest returned by preprocess")
        self.generated.append(stream_response)
        try:
            for item in self.script:
                await asyncio.sleep(0)
                yield item
            if self.fail is not None:
                raise self.fail
        finally:
            self.streams_closed += 1

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def fake_lmdeploy(monkeypatch: pytest.MonkeyPatch) -> type[RecordingAsyncEngine]:
    """``lmdeploy``, ``lmdeploy.messages`` and ``lmdeploy.serve.core`` as fakes."""
    root = types.ModuleType("lmdeploy")
    messages = types.ModuleType("lmdeploy.messages")
    serve = types.ModuleType("lmdeploy.serve")
    core = types.ModuleType("lmdeploy.serve.core")
    for cls in (TurbomindEngineConfig, PytorchEngineConfig, GenerationConfig):
        setattr(messages, cls.__name__, cls)
    core.AsyncEngine = RecordingAsyncEngine  # type: ignore[attr-defined]
    core.RequestError = FakeLMDeployRequestError  # type: ignore[attr-defined]
    core.ErrorCode = FakeErrorCode  # type: ignore[attr-defined]
    root.messages, root.serve, serve.core = messages, serve, core  # type: ignore[attr-defined]
    for module in (root, messages, serve, core):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    RecordingAsyncEngine.last = None
    return RecordingAsyncEngine


def loaded(options: dict[str, str] | None = None) -> tuple[lmd.LMDeployEngine, Any]:
    engine = lmd.LMDeployEngine(EngineConfig(Path("/models/m"), "cuda", options or {}))
    engine.load()
    assert RecordingAsyncEngine.last is not None
    return engine, RecordingAsyncEngine.last


async def collect(engine: Any, request: GenerationRequest) -> list[Chunk]:
    return [chunk async for chunk in engine.generate(request)]


def test_lmdeploy_builds_an_async_engine_not_a_pipeline(fake_lmdeploy, monkeypatch):
    monkeypatch.setattr(logging.getLogger("lmdeploy"), "level", logging.INFO)
    engine, fake = loaded({"backend": "pytorch", "max_batch_size": "8", "session_len": "512"})
    assert fake.built == {"model_path": "/models/m", "backend": "pytorch"}
    assert type(fake.backend_config) is PytorchEngineConfig
    assert fake.backend_config.kwargs == {
        "max_batch_size": 8,
        "cache_max_entry_count": 0.8,
        "enable_prefix_caching": False,
        "tp": 1,
        "session_len": 512,
    }
    # lmdeploy logs each request at INFO to stdout; the adapter keeps that off the clock
    assert logging.getLogger("lmdeploy").level == logging.WARNING
    assert fake.started == []  # no loop runs during load(): the engine starts on first use
    info = engine.describe()
    assert info["effective"]["backend"] == "pytorch"
    assert info["effective"]["config"] == "PytorchEngineConfig"
    assert info["effective"]["session_len"] == 512
    engine.close()
    engine.close()
    assert fake.closed == 1


def test_lmdeploy_starts_on_the_callers_loop_and_preprocesses_each_request(fake_lmdeploy):
    engine, fake = loaded()
    tokens = GenerationRequest((1, 2, 3), 3)
    text = GenerationRequest("hello", 3, ignore_eos=False, temperature=0.5)

    async def both() -> tuple[asyncio.AbstractEventLoop, list[list[Chunk]]]:
        got = await asyncio.gather(collect(engine, tokens), collect(engine, text))
        return asyncio.get_running_loop(), list(got)

    loop, (by_ids, by_text) = asyncio.run(both())
    # started once, with the loop the requests ran on, from inside that running loop
    assert fake.started == [(loop, True, loop)]
    first, second = fake.preprocessed
    assert (first["input_ids"], first["messages"]) == ([1, 2, 3], None)
    assert (second["input_ids"], second["messages"]) == (None, "hello")
    assert first["do_preprocess"] is second["do_preprocess"] is False
    assert first["session_id"] != second["session_id"]
    assert set(first) == {"messages", "input_ids", "session_id", "gen_config", "do_preprocess"}
    assert first["gen_config"].kwargs == {
        "max_new_tokens": 3,
        "ignore_eos": True,
        "do_sample": False,
    }
    assert second["gen_config"].kwargs == {
        "max_new_tokens": 3,
        "ignore_eos": False,
        "do_sample": True,
        "temperature": 0.5,
    }
    assert fake.generated == [True, True]  # stream_response=True
    for chunks in (by_ids, by_text):
        assert [c.token_ids for c in chunks] == [(7, 8), (9,), ()]
        assert [c.completion_tokens for c in chunks] == [2, 3, 3]
        assert chunks[-1].finish_reason == "length"
    assert fake.streams_closed == 2


def test_lmdeploy_refuses_a_second_event_loop(fake_lmdeploy):
    engine, fake = loaded()
    asyncio.run(collect(engine, GenerationRequest((1,), 3)))
    with pytest.raises(EngineError, match="bound to another event loop"):
        asyncio.run(collect(engine, GenerationRequest((1,), 3)))
    assert len(fake.started) == 1


def test_lmdeploy_request_error_mid_stream_is_a_failed_request(fake_lmdeploy):
    engine, fake = loaded()
    fake.script = [out([7, 8], 2)]
    fake.fail = FakeLMDeployRequestError(FakeErrorCode.ENGINE_UNAVAILABLE)
    seen = []

    async def run() -> None:
        async for chunk in engine.generate(GenerationRequest((1, 2), 4)):
            seen.append(chunk)

    with pytest.raises(RequestError, match=r"\(engine_unavailable\)") as caught:
        asyncio.run(run())
    assert [c.token_ids for c in seen] == [(7, 8)]  # the output before the error came through
    assert isinstance(caught.value.__cause__, FakeLMDeployRequestError)
    assert not is_fatal(caught.value)
    # and the load driver records it on the request, as a failure, and goes on
    engine2, fake2 = loaded()
    fake2.script = [out([7], 1)]
    fake2.fail = FakeLMDeployRequestError(FakeErrorCode.ENGINE_UNAVAILABLE)
    driver = Driver(engine2, MonotonicClock(), 5.0)
    record = asyncio.run(driver.one(GenerationRequest((1, 2), 4), 0.0))
    assert not record.ok
    assert record.error is not None
    assert record.error.startswith("RequestError: lmdeploy failed the request (engine_unavailable)")
    assert record.chunk_tokens == (1,)


def test_lmdeploy_refusal_before_any_output_is_a_failed_request(fake_lmdeploy):
    engine, fake = loaded()
    fake.refuse = FakeLMDeployRequestError(FakeErrorCode.CONTEXT_LENGTH_EXCEEDED)
    with pytest.raises(RequestError, match=r"\(context_length_exceeded\)"):
        asyncio.run(collect(engine, GenerationRequest((1,) * 9, 2)))
    assert fake.generated == []


def test_lmdeploy_engine_fault_under_a_request_error_stays_fatal(fake_lmdeploy):
    engine, fake = loaded()
    fault = FakeLMDeployRequestError(FakeErrorCode.INTERNAL_ERROR)
    fault.__cause__ = RuntimeError("CUDA error: an illegal memory access was encountered")
    fake.fail = fault
    with pytest.raises(EngineError, match="illegal memory access") as caught:
        asyncio.run(collect(engine, GenerationRequest((1,), 3)))
    assert not isinstance(caught.value, RequestError)
    assert is_fatal(caught.value)


@pytest.mark.parametrize("reason", ["error", "abort"])
def test_lmdeploy_an_error_or_abort_finish_is_a_failed_request(fake_lmdeploy, reason):
    engine, fake = loaded()
    fake.script = [out([7], 1), out([], 1, reason, text="engine said no")]
    with pytest.raises(RequestError, match=f"ended the request with {reason}: engine said no"):
        asyncio.run(collect(engine, GenerationRequest((1,), 3)))


def test_lmdeploy_a_consumer_that_stops_early_closes_the_engine_stream(fake_lmdeploy):
    engine, fake = loaded()

    async def first_only() -> tuple[Chunk, int]:
        stream = engine.generate(GenerationRequest((1,), 3))
        chunk = await anext(stream)
        await stream.aclose()
        return chunk, fake.streams_closed  # before asyncio.run finalizes what is left

    chunk, closed = asyncio.run(first_only())
    assert chunk.token_ids == (7, 8)
    assert closed == 1  # the engine got its session back at once


def test_lmdeploy_probe_names_the_version_it_needs(monkeypatch):
    real = importlib.util.find_spec
    present = SimpleNamespace(name="lmdeploy")
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: present if n == "lmdeploy" else real(n, *a)
    )
    monkeypatch.setattr(lmd, "installed_version", lambda *names: "0.15.0")
    avail = lmd.LMDeployEngine.probe("cuda")
    assert not avail.available
    assert avail.reason == (
        "lmdeploy 0.15.0 predates the AsyncEngine.preprocess/generate API this adapter"
        " drives (pip install 'lmdeploy>=0.16')"
    )


# -- vLLM: enforce_eager per device -----------------------------------------------------------


def vllm_args(device: str, **options: str) -> dict[str, Any]:
    return VllmEngine(EngineConfig(Path("/m"), device, options)).engine_args()


def test_vllm_is_eager_on_cpu_and_leaves_cuda_to_vllms_default():
    assert vllm_args("cpu")["enforce_eager"] is True
    assert "enforce_eager" not in vllm_args("cuda")
    assert "enforce_eager" not in vllm_args("cuda:1")
    assert vllm_args("cuda", enforce_eager="1")["enforce_eager"] is True
    assert vllm_args("cuda", enforce_eager="0")["enforce_eager"] is False
    assert vllm_args("cpu", enforce_eager="0")["enforce_eager"] is False
    assert "on CUDA vLLM's own default, 0" in VLLM_OPTIONS["enforce_eager"]


def test_the_harness_started_vllm_server_is_eager_on_the_cpu_build_only():
    from engines import vllm_server  # noqa: PLC0415

    cpu = vllm_server.command(Path("/m"), 8000, cpu_build=True)
    gpu = vllm_server.command(Path("/m"), 8000, cpu_build=False)
    assert "--enforce-eager" in cpu
    assert "--enforce-eager" not in gpu
    assert [a for a in cpu if a != "--enforce-eager"] == gpu
    assert gpu[gpu.index("--host") + 1] == "127.0.0.1"


class FakeCudaGraphMode(enum.Enum):
    FULL_AND_PIECEWISE = 3


def test_vllm_describe_reports_the_resolved_eager_mode():
    """A stand-in for a loaded AsyncLLM (adapter logic only): describe() reads vllm_config."""
    engine = VllmEngine(EngineConfig(Path("/m"), "cuda", {}))
    engine._llm = SimpleNamespace(
        vllm_config=SimpleNamespace(
            scheduler_config=SimpleNamespace(max_num_seqs=16, max_num_batched_tokens=2048),
            model_config=SimpleNamespace(
                max_model_len=1024, dtype="torch.bfloat16", enforce_eager=False
            ),
            cache_config=SimpleNamespace(enable_prefix_caching=False, block_size=16),
            compilation_config=SimpleNamespace(
                cudagraph_mode=FakeCudaGraphMode.FULL_AND_PIECEWISE, mode=None
            ),
        )
    )
    info = engine.describe()
    assert "enforce_eager" not in info["requested"]
    assert info["effective"]["enforce_eager"] is False
    assert info["effective"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert info["effective"]["compilation_mode"] is None
    assert info["effective"]["dtype"] == "bfloat16"


# -- TensorRT-LLM: what installing it takes --------------------------------------------------


def test_tensorrt_llm_missing_reason_names_the_index_python_and_driver():
    reason = trtllm.missing_reason((3, 11))
    assert reason.startswith("tensorrt_llm is not installed (pip install tensorrt-llm ")
    assert "--extra-index-url https://pypi.nvidia.com" in reason
    assert "--extra-index-url https://download.pytorch.org/whl/cu130" in reason
    assert "Python 3.10 or 3.12 (this is Python 3.11)" in reason
    assert "an NVIDIA GPU and a CUDA 13 driver >= 580" in reason
    assert "(this is Python" not in trtllm.missing_reason((3, 12))


def test_tensorrt_llm_probe_gives_that_reason_when_missing():
    if importlib.util.find_spec("tensorrt_llm") is not None:
        pytest.skip("tensorrt_llm is installed here")
    avail = trtllm.TensorRTLLMEngine.probe("cuda")
    assert (avail.available, avail.reason) == (False, trtllm.missing_reason(sys.version_info[:2]))


# -- chat, text and natural end: what the in-process engines are asked -------------------------


class FakeChatTokenizer:
    """Stands in for a Hugging Face tokenizer (or TensorRT-LLM's wrapper of one), to test
    how adapters render chat requests: its template writes ``<s>`` (id 1) once and
    ``role: content`` turns; ``encode`` gives one id per word and adds a BOS of its own
    only when asked for special tokens, so a double BOS shows. ``chat_template=None``
    makes it a tokenizer without a template, refusing as transformers does."""

    BOS = 1

    def __init__(self, chat_template: str | None = "fake template") -> None:
        self.chat_template = chat_template
        self.rendered: list[str] = []

    def get_chat_template(self, chat_template: str | None = None, tools: Any = None) -> str:
        if self.chat_template is None:
            raise ValueError(
                "Cannot use chat template functions because tokenizer.chat_template is not set"
            )
        return self.chat_template

    def apply_chat_template(
        self,
        conversation: list[dict[str, str]],
        add_generation_prompt: bool = False,
        tokenize: bool = True,
    ) -> str:
        assert not tokenize, "the adapters render text, then tokenize it themselves"
        text = "<s>" + "".join(f"{m['role']}: {m['content']}\n" for m in conversation)
        text += "assistant:" if add_generation_prompt else ""
        self.rendered.append(text)
        return text

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        words = text.replace("<s>", " <s> ").split()
        ids = [self.BOS if w == "<s>" else 10 + len(w) for w in words]
        return [self.BOS, *ids] if add_special_tokens else ids


CHAT = (Message("system", "Be brief."), Message("user", "Bada kefi?"))
CHAT_TEXT = "<s>system: Be brief.\nuser: Bada kefi?\nassistant:"
CHAT_IDS = [1, 17, 12, 16, 15, 14, 15, 20]  # <s> system: Be brief. user: Bada kefi? assistant:


def test_lmdeploy_sends_chat_as_openai_messages_for_its_template(fake_lmdeploy):
    engine, fake = loaded()
    chat = GenerationRequest("", 5, ignore_eos=False, messages=CHAT)
    chunks = asyncio.run(collect(engine, chat))
    [call] = fake.preprocessed
    assert call["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Bada kefi?"},
    ]
    assert call["input_ids"] is None
    assert call["do_preprocess"] is True  # LMDeploy applies the model's chat template
    assert call["gen_config"].kwargs["ignore_eos"] is False
    assert {c.prompt_tokens for c in chunks} == {3}  # LMDeploy's input_token_len
    assert lmd.request_arguments(GenerationRequest("hi", 2)) == {
        "messages": "hi",
        "input_ids": None,
        "do_preprocess": False,
    }
    assert lmd.request_arguments(GenerationRequest((4, 5), 2))["input_ids"] == [4, 5]


class RecordingTrtLLM:
    """Stands in for ``tensorrt_llm.LLM`` (adapter logic only): records each
    ``generate_async`` call and streams one mutated ``RequestOutput``-like object whose
    ``token_ids`` are cumulative, with ``prompt_token_ids`` the ids of the prompt given
    (a string counts one id per word, as the fake tokenizer would)."""

    last: RecordingTrtLLM | None = None

    def __init__(self, **kwargs: Any) -> None:
        self.built = kwargs
        self.tokenizer = FakeChatTokenizer()
        self.calls: list[tuple[Any, Any, bool]] = []
        RecordingTrtLLM.last = self

    async def generate_async(self, prompt: Any, params: Any, streaming: bool = False) -> Any:
        self.calls.append((prompt, params, streaming))
        ids = prompt if isinstance(prompt, list) else self.tokenizer.encode(prompt)
        completion = SimpleNamespace(token_ids=[], text_diff="", finish_reason=None)
        out = SimpleNamespace(outputs=[completion], prompt_token_ids=ids, finished=False)
        for step, new in enumerate(([7], [8, 9])):
            await asyncio.sleep(0)
            completion.token_ids = completion.token_ids + new
            completion.token_ids_diff = new
            completion.text_diff = f"t{step}"
            out.finished = step == 1
            completion.finish_reason = "stop" if out.finished else None
            yield out

    def shutdown(self) -> None:
        pass


@pytest.fixture
def fake_trtllm(monkeypatch: pytest.MonkeyPatch) -> type[RecordingTrtLLM]:
    """``tensorrt_llm`` and ``tensorrt_llm.llmapi`` as fakes."""
    root = types.ModuleType("tensorrt_llm")
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    root.LLM = RecordingTrtLLM  # type: ignore[attr-defined]
    root.SamplingParams = FakeConfig  # type: ignore[attr-defined]
    llmapi.KvCacheConfig = FakeConfig  # type: ignore[attr-defined]
    root.llmapi = llmapi  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt_llm", root)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", llmapi)
    return RecordingTrtLLM


def test_tensorrt_llm_takes_text_ids_and_chat_rendered_with_its_template(fake_trtllm):
    engine = trtllm.TensorRTLLMEngine(EngineConfig(Path("/models/m"), "cuda", {}))
    engine.load()
    fake = RecordingTrtLLM.last
    assert fake is not None
    requests = [
        GenerationRequest((5, 6, 7), 3),
        GenerationRequest("Bada kefi lomo", 3),
        GenerationRequest("", 3, ignore_eos=False, messages=CHAT),
    ]
    got = [asyncio.run(collect(engine, r)) for r in requests]
    prompts = [call[0] for call in fake.calls]
    assert prompts[0] == [5, 6, 7]
    assert prompts[1] == "Bada kefi lomo"  # TensorRT-LLM tokenizes a text prompt itself
    assert fake.tokenizer.rendered == [CHAT_TEXT]
    assert prompts[2] == CHAT_IDS  # the template's one BOS, none added on top
    assert all(streaming for _, _, streaming in fake.calls)
    assert fake.calls[2][1].kwargs["ignore_eos"] is False
    assert fake.calls[0][1].kwargs["ignore_eos"] is True
    prompt_tokens = [{c.prompt_tokens for c in chunks} for chunks in got]
    assert prompt_tokens == [{3}, {4}, {len(CHAT_IDS)}]
    for chunks in got:
        assert [c.token_ids for c in chunks] == [(7,), (8, 9)]
        assert chunks[-1].finish_reason == "stop"


def test_tensorrt_llm_refuses_chat_on_a_model_without_a_template(fake_trtllm):
    engine = trtllm.TensorRTLLMEngine(EngineConfig(Path("/models/base"), "cuda", {}))
    engine.load()
    fake = RecordingTrtLLM.last
    assert fake is not None
    fake.tokenizer = FakeChatTokenizer(chat_template=None)
    with pytest.raises(NoChatTemplate, match="/models/base has no chat template"):
        asyncio.run(collect(engine, GenerationRequest("", 3, messages=CHAT)))
    assert fake.calls == []  # no raw text was sent in its place
