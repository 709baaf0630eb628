"""LMDeploy: ``lmdeploy.pipeline`` with the TurboMind (default) or PyTorch engine,
streamed through its async ``generate`` with raw prompts (``do_preprocess=False``: no
chat template) or token ids.

Explicit settings: ``max_batch_size`` (LMDeploy picks one otherwise),
``cache_max_entry_count`` (share of free GPU memory for the KV cache) and prefix caching
off unless a workload studies it. Each streamed output carries only the new tokens
(``token_ids`` and ``response`` are deltas) while ``generate_token_len`` is the running
count, which the chunks pass on as the engine's own count. LMDeploy runs on NVIDIA GPUs
(and some other accelerators) only; there is no CPU engine.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

from harness.engine import (
    Availability,
    BatchingMode,
    Capabilities,
    Chunk,
    EngineConfig,
    EngineError,
    Family,
    GenerationRequest,
    RequestError,
    installed_version,
    reject_unknown_options,
)

BACKENDS = ("turbomind", "pytorch")
DEFAULTS = {
    "backend": "turbomind",
    "max_batch_size": "64",
    "cache_max_entry_count": "0.8",
    "enable_prefix_caching": "0",
    "tp": "1",
}
OPTIONS = {
    "backend": "turbomind (default) or pytorch",
    "max_batch_size": "most sequences served at once (default 64)",
    "cache_max_entry_count": "share of free GPU memory for the KV cache (default 0.8)",
    "enable_prefix_caching": "0/1 (default 0: off unless studied)",
    "session_len": "context length (default: the model's)",
    "tp": "GPUs for tensor parallelism (default 1)",
}


def engine_config(options: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    """Pure: (config class name, its keyword arguments)."""
    o = DEFAULTS | dict(options)
    kwargs: dict[str, Any] = {
        "max_batch_size": int(o["max_batch_size"]),
        "cache_max_entry_count": float(o["cache_max_entry_count"]),
        "enable_prefix_caching": o["enable_prefix_caching"] == "1",
        "tp": int(o["tp"]),
    }
    if "session_len" in o:
        kwargs["session_len"] = int(o["session_len"])
    cls = "TurbomindEngineConfig" if o["backend"] == "turbomind" else "PytorchEngineConfig"
    return cls, kwargs


def generation_kwargs(request: GenerationRequest) -> dict[str, Any]:
    """Pure: ``GenerationConfig`` for a request; temperature 0 is greedy (no sampling)."""
    sample = request.temperature > 0
    params: dict[str, Any] = {
        "max_new_tokens": request.max_tokens,
        "ignore_eos": request.ignore_eos,
        "do_sample": sample,
    }
    if sample:
        params["temperature"] = request.temperature
    return params


def prompt_arguments(prompt: str | tuple[int, ...]) -> dict[str, Any]:
    """Token ids go in as ``input_ids`` (with no messages); text as the raw prompt."""
    if isinstance(prompt, tuple):
        return {"messages": None, "input_ids": list(prompt)}
    return {"messages": prompt, "input_ids": None}


def to_chunk(out: Any) -> Chunk:
    """One streamed output: its delta ids, and LMDeploy's running count and finish."""
    ids = tuple(int(t) for t in (getattr(out, "token_ids", None) or ()))
    return Chunk(
        n_tokens=len(ids),
        token_ids=ids,
        text=getattr(out, "response", "") or "",
        completion_tokens=getattr(out, "generate_token_len", None),
        prompt_tokens=getattr(out, "input_token_len", None),
        finish_reason=getattr(out, "finish_reason", None),
    )


class LMDeployEngine:
    name: ClassVar[str] = "lmdeploy"
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.GENERATIVE,
        devices=frozenset({"cuda"}),
        native_batching=frozenset({BatchingMode.CONTINUOUS}),
        streaming=True,
    )

    def __init__(self, config: EngineConfig) -> None:
        self.validate_options(config.options)
        self.config = config
        self._pipe: Any = None
        self._sessions = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def probe(cls, device: str) -> Availability:
        if importlib.util.find_spec("lmdeploy") is None:
            return Availability(
                False,
                "lmdeploy is not installed (pip install lmdeploy, on a machine with an NVIDIA GPU)",
            )
        import torch  # noqa: PLC0415  (lmdeploy depends on it)

        if not torch.cuda.is_available():
            return Availability(
                False, "lmdeploy needs an NVIDIA GPU (it has no CPU engine); none found"
            )
        return Availability(True)

    @classmethod
    def validate_options(cls, options: Mapping[str, str]) -> None:
        reject_unknown_options(options, OPTIONS)
        if options.get("backend", "turbomind") not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}")
        for key in ("max_batch_size", "session_len", "tp"):
            if key in options and not (options[key].isdigit() and int(options[key]) >= 1):
                raise ValueError(f"{key} must be a positive integer, got {options[key]!r}")
        try:
            share = float(options.get("cache_max_entry_count", "0.8"))
        except ValueError:
            share = -1.0
        if not 0.0 < share < 1.0:
            raise ValueError("cache_max_entry_count must be a share in (0, 1)")
        if options.get("enable_prefix_caching", "0") not in ("0", "1"):
            raise ValueError("enable_prefix_caching must be 0 or 1")

    def load(self) -> None:
        import lmdeploy  # noqa: PLC0415

        cls_name, kwargs = engine_config(self.config.options)
        backend_config = getattr(lmdeploy, cls_name)(**kwargs)
        try:
            self._pipe = lmdeploy.pipeline(str(self.config.model), backend_config=backend_config)
        except Exception as exc:
            raise EngineError(f"LMDeploy could not load {self.config.model}: {exc}") from exc

    def describe(self) -> dict[str, Any]:
        installed = installed_version("lmdeploy") or "not installed"
        cls_name, kwargs = engine_config(self.config.options)
        info: dict[str, Any] = {
            "engine": self.name,
            "version": installed,
            "device": self.config.device,
            "requested": {"config": cls_name} | kwargs,
        }
        if self._pipe is not None:
            cfg = getattr(self._pipe, "backend_config", None)
            info["effective"] = {"config": type(cfg).__name__} | {
                key: getattr(cfg, key, None) for key in (*kwargs, "session_len")
            }
        return info

    def _bind_loop(self) -> None:
        """LMDeploy's engine serves one event loop; bind it to the caller's on first use."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None:
            raise EngineError("lmdeploy is bound to another event loop; use one loop per engine")
        start = getattr(self._pipe, "start_loop", None)
        if start is not None:
            try:
                start(loop, use_async_api=True)
            except TypeError:  # releases before the Pipeline refactor take no loop
                start(use_async_api=True)
        self._loop = loop

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        if self._pipe is None:
            raise EngineError("engine not loaded: call load() first")
        from lmdeploy import GenerationConfig  # noqa: PLC0415

        self._bind_loop()
        stream = self._pipe.generate(
            **prompt_arguments(request.prompt),
            session_id=next(self._sessions),
            gen_config=GenerationConfig(**generation_kwargs(request)),
            stream_response=True,
            sequence_start=True,
            sequence_end=True,
            do_preprocess=False,
        )
        async for out in stream:
            if getattr(out, "finish_reason", None) == "error":
                raise RequestError(f"lmdeploy failed the request: {getattr(out, 'response', '')}")
            yield to_chunk(out)

    def close(self) -> None:
        if self._pipe is not None:
            closer = getattr(self._pipe, "close", None)
            if closer is not None:
                closer()
            self._pipe = None
        self._loop = None
