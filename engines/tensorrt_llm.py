"""TensorRT-LLM through its LLM API (``tensorrt_llm.LLM``, PyTorch backend, the default
since 1.0), streamed with ``generate_async(..., streaming=True)``.

Settings that shape a benchmark are explicit: ``max_batch_size`` and ``max_num_tokens``
(TensorRT-LLM's defaults are 2048 and 8192), and KV-cache block reuse is off
(TensorRT-LLM turns it on by default) unless a workload studies prefix caching.

A streamed ``RequestOutput`` is one object mutated in place; ``outputs[0].token_ids`` is
cumulative. Each step's new tokens are its ``token_ids_diff`` (or, on versions without
it, the tail past the previous length), read before the next ``await``. Per-request
timings come from ``request_perf_metrics`` (``return_perf_metrics=True``), on the
engine's steady clock.

Requests go in as the LLM API takes them: token ids as a list, a text prompt as the string
(TensorRT-LLM tokenizes it), a chat conversation rendered with the model's chat template
through ``LLM.tokenizer`` as trtllm-serve renders one (text, then ids without added
special tokens: one BOS, the template's); a model without a chat template fails each chat
request saying so. ``ignore_eos`` is passed through (without it the reply ends at the
EOS), and ``prompt_token_ids`` gives each chunk the prompt's length.

Installing it: PyPI's ``tensorrt-llm`` (1.2.1) is a 10 kB sdist whose build backend,
``wheel-stub``, fetches the real wheel from NVIDIA's index (https://pypi.nvidia.com); its
metadata lists Python 3.10 and 3.12 only, ``tensorrt~=10.14``, ``cuda-python>=13`` and
``torch>=2.9.1,<=2.10.0a0``, which must be the CUDA 13.0 build (PyPI's torch 2.9.1 is
CUDA 12.8; NVIDIA's install guide takes it from https://download.pytorch.org/whl/cu130).
CUDA 13 needs an NVIDIA driver >= 580.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

from engines.llmstream import chat_prompt_ids, delta_chunk
from harness.engine import (
    Availability,
    BatchingMode,
    Capabilities,
    Chunk,
    EngineConfig,
    EngineError,
    Family,
    GenerationRequest,
    installed_version,
)
from harness.engine.optionschema import OptionSchema, choice, flag, integer, number

OPTIONS = OptionSchema(
    integer(
        "max_batch_size",
        "most requests in one iteration (TensorRT-LLM's own default: 2048)",
        default="64",
    ),
    integer("max_num_tokens", "token budget of one iteration", default="8192"),
    integer("max_seq_len", "context length (default: the model's)"),
    integer("tensor_parallel_size", "GPUs for tensor parallelism", default="1"),
    number(
        "kv_cache_free_gpu_memory_fraction",
        "share of free GPU memory for the KV cache",
        default="0.9",
        low=0,
        high=1,
        exclusive=True,
    ),
    flag("enable_block_reuse", "KV-cache block (prefix) reuse (off unless studied)"),
    choice("dtype", "model dtype", ("auto", "float16", "bfloat16"), default="auto"),
)
DEFAULTS = OPTIONS.defaults()
INSTALL = (
    "pip install tensorrt-llm --extra-index-url https://pypi.nvidia.com"
    " --extra-index-url https://download.pytorch.org/whl/cu130"
)
PYTHONS = ((3, 10), (3, 12))
"""The Pythons NVIDIA publishes tensorrt-llm wheels for (1.2.1's classifiers)."""


def missing_reason(python: tuple[int, int]) -> str:
    """Why tensorrt_llm is absent and what installs it, naming this Python if no wheel
    exists for it (pip then fails inside wheel-stub, far from the cause)."""
    wanted = " or ".join(f"{major}.{minor}" for major, minor in PYTHONS)
    here = "" if python in PYTHONS else f" (this is Python {python[0]}.{python[1]})"
    return (
        f"tensorrt_llm is not installed ({INSTALL}; needs Linux, Python {wanted}{here},"
        " an NVIDIA GPU and a CUDA 13 driver >= 580)"
    )


def llm_kwargs(model: str, options: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pure: (``LLM`` keyword arguments, ``KvCacheConfig`` keyword arguments)."""
    o = DEFAULTS | dict(options)
    llm: dict[str, Any] = {
        "model": model,
        "max_batch_size": int(o["max_batch_size"]),
        "max_num_tokens": int(o["max_num_tokens"]),
        "tensor_parallel_size": int(o["tensor_parallel_size"]),
        "dtype": o["dtype"],
        "return_perf_metrics": True,
    }
    if "max_seq_len" in o:
        llm["max_seq_len"] = int(o["max_seq_len"])
    kv = {
        "enable_block_reuse": o["enable_block_reuse"] == "1",
        "free_gpu_memory_fraction": float(o["kv_cache_free_gpu_memory_fraction"]),
    }
    return llm, kv


def sampling_kwargs(request: GenerationRequest) -> dict[str, Any]:
    """Pure: ``SamplingParams`` for a request; temperature 0 is greedy (top_k=1)."""
    params: dict[str, Any] = {
        "max_tokens": request.max_tokens,
        "ignore_eos": request.ignore_eos,
        "return_perf_metrics": True,
    }
    if request.temperature > 0:
        params["temperature"] = request.temperature
    else:
        params["top_k"] = 1
    return params


def prompt_input(request: GenerationRequest, tokenizer: Any, model: object = "") -> str | list[int]:
    """What ``generate_async`` is given for ``request``: token ids, the text, or a chat
    conversation's ids rendered with ``tokenizer``'s chat template."""
    if request.kind == "chat":
        return chat_prompt_ids(tokenizer, request.messages, model)
    return list(request.prompt) if isinstance(request.prompt, tuple) else request.prompt


class Deltas:
    """New token ids of each streamed step of one request."""

    def __init__(self) -> None:
        self.seen = 0

    def new_ids(self, completion: Any) -> tuple[int, ...]:
        ids = list(completion.token_ids)
        diff = getattr(completion, "token_ids_diff", None)
        new = list(diff) if diff is not None else ids[self.seen :]
        if self.seen + len(new) != len(ids):
            raise EngineError(
                f"stream accounting: {self.seen} seen + {len(new)} new != {len(ids)} total"
            )
        self.seen = len(ids)
        return tuple(int(t) for t in new)


def perf_stats(metrics: Any) -> dict[str, float] | None:
    """Engine-side timings of a finished request (steady-clock timedeltas), in seconds."""
    timing = getattr(metrics, "timing_metrics", None)
    if timing is None:
        return None

    def seconds(name: str) -> float:
        value = getattr(timing, name, None)
        return float(value.total_seconds()) if value is not None else 0.0

    arrival, first = seconds("arrival_time"), seconds("first_token_time")
    if not first:
        return None
    return {
        "queue_s": seconds("first_scheduled_time") - arrival,
        "ttft_s": first - arrival,
        "decode_s": seconds("last_token_time") - first,
    }


class TensorRTLLMEngine:
    name: ClassVar[str] = "tensorrt-llm"
    option_schema: ClassVar[OptionSchema] = OPTIONS
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.GENERATIVE,
        devices=frozenset({"cuda"}),
        native_batching=frozenset({BatchingMode.CONTINUOUS}),
        streaming=True,
        prefix_cache_option="enable_block_reuse",
    )

    def __init__(self, config: EngineConfig) -> None:
        self.validate_options(config.options)
        self.config = config
        self._llm: Any = None

    @classmethod
    def probe(cls, device: str) -> Availability:
        if importlib.util.find_spec("tensorrt_llm") is None:
            return Availability(False, missing_reason(sys.version_info[:2]))
        import torch  # noqa: PLC0415  (tensorrt_llm depends on it)

        if not torch.cuda.is_available():
            return Availability(False, "tensorrt-llm needs an NVIDIA GPU; none found")
        return Availability(True)

    @classmethod
    def validate_options(cls, options: Mapping[str, str]) -> None:
        OPTIONS.validate(options)

    @classmethod
    def precision_options(cls, name: str, device: str) -> dict[str, str]:
        dtypes = {"fp16": "float16", "bf16": "bfloat16"}
        if name not in dtypes:
            raise ValueError(f"tensorrt-llm here runs fp16 or bf16 models, not {name}")
        return {"dtype": dtypes[name]}

    def load(self) -> None:
        from tensorrt_llm import LLM  # noqa: PLC0415
        from tensorrt_llm.llmapi import KvCacheConfig  # noqa: PLC0415

        llm, kv = llm_kwargs(str(self.config.model), self.config.options)
        try:
            self._llm = LLM(**llm, kv_cache_config=KvCacheConfig(**kv))
        except Exception as exc:
            raise EngineError(f"TensorRT-LLM could not load {self.config.model}: {exc}") from exc

    def describe(self) -> dict[str, Any]:
        installed = installed_version("tensorrt_llm") or "not installed"
        llm, kv = llm_kwargs(str(self.config.model), self.config.options)
        info: dict[str, Any] = {
            "engine": self.name,
            "version": installed,
            "device": self.config.device,
            "requested": llm | {"kv_cache_config": kv},
        }
        if self._llm is not None:
            args = getattr(self._llm, "args", None)
            kv_args = getattr(args, "kv_cache_config", None)
            info["effective"] = {
                "backend": getattr(args, "backend", None) or "pytorch",
                "max_batch_size": getattr(args, "max_batch_size", None),
                "max_num_tokens": getattr(args, "max_num_tokens", None),
                "max_seq_len": getattr(args, "max_seq_len", None),
                "enable_block_reuse": getattr(kv_args, "enable_block_reuse", None),
                "free_gpu_memory_fraction": getattr(kv_args, "free_gpu_memory_fraction", None),
            }
        return info

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        if self._llm is None:
            raise EngineError("engine not loaded: call load() first")
        from tensorrt_llm import SamplingParams  # noqa: PLC0415

        params = SamplingParams(**sampling_kwargs(request))
        tokenizer = self._llm.tokenizer if request.kind == "chat" else None
        prompt = prompt_input(request, tokenizer, self.config.model)
        deltas = Deltas()
        async for out in self._llm.generate_async(prompt, params, streaming=True):
            completion = out.outputs[0]
            ids = deltas.new_ids(completion)  # before the next await mutates `out`
            yield delta_chunk(
                ids,
                getattr(completion, "text_diff", ""),
                completion_tokens=deltas.seen,
                prompt_tokens=len(out.prompt_token_ids or ()),
                finish_reason=completion.finish_reason if out.finished else None,
                engine_stats=perf_stats(getattr(completion, "request_perf_metrics", None))
                if out.finished
                else None,
            )

    def close(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
