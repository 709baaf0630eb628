"""LMDeploy: an ``AsyncEngine`` with the TurboMind (default) or PyTorch backend, driven on
the harness's own event loop. Requests go in as LMDeploy's own api_server sends them:
token ids as ``input_ids``, a text prompt raw (``do_preprocess=False``: no chat template,
as its completions API), a chat conversation as OpenAI-format ``messages`` with
``do_preprocess=True`` (LMDeploy applies the model's chat template, as its chat API).
``ignore_eos`` is passed through; each chunk carries LMDeploy's ``input_token_len`` as
the prompt's tokens.

Why not ``lmdeploy.pipeline``: since 0.16 its ``Pipeline`` starts the engine on a private
event-loop thread and its async ``generate`` is deprecated; awaited from another loop,
the PyTorch engine finds its main task bound to a foreign loop and answers
ENGINE_STOP_ERROR. Here ``AsyncEngine.start_loop`` runs on the caller's running loop (as
lmdeploy's own api_server does) and each request is ``preprocess`` then
``generate(request, stream_response=True)``: the API that 0.16 introduced, hence the
extra's ``lmdeploy>=0.16``.

Explicit settings: ``max_batch_size`` (LMDeploy picks one otherwise),
``cache_max_entry_count`` (share of free GPU memory for the KV cache) and prefix caching
off unless a workload studies it. Each streamed output carries only the new tokens
(``token_ids`` and ``response`` are deltas) while ``generate_token_len`` is the running
count, which the chunks pass on as the engine's own count. A failed request raises
lmdeploy's ``RequestError`` (since 0.16; before, it yielded ``finish_reason="error"``),
which becomes the harness's. LMDeploy runs on NVIDIA GPUs (and some other accelerators)
only; there is no CPU engine.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any, ClassVar

from packaging.version import Version

from engines.llmstream import delta_chunk
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
    is_fatal,
)
from harness.engine.optionschema import OptionSchema, choice, flag, integer, number

MIN_VERSION = "0.16"
"""The first release with ``AsyncEngine.preprocess`` and a raised ``RequestError``."""
BACKENDS = ("turbomind", "pytorch")
OPTIONS = OptionSchema(
    choice("backend", "LMDeploy's inference backend", BACKENDS, default="turbomind"),
    integer("max_batch_size", "most sequences served at once", default="64"),
    number(
        "cache_max_entry_count",
        "share of free GPU memory for the KV cache",
        default="0.8",
        low=0,
        high=1,
        exclusive=True,
        must="a share in (0, 1)",
    ),
    flag("enable_prefix_caching", "prefix caching (off unless studied)"),
    integer("session_len", "context length (default: the model's)"),
    integer("tp", "GPUs for tensor parallelism", default="1"),
)
DEFAULTS = OPTIONS.defaults()
_FAILED = ("error", "abort")
"""Finish reasons of a request the engine did not complete: ``error`` is how releases
before 0.16 reported a failure; ``abort`` is an engine-side cancel or a dropped session."""


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


def request_arguments(request: GenerationRequest) -> dict[str, Any]:
    """``preprocess`` arguments for a request, as LMDeploy's api_server passes them: token
    ids and text unrendered (``do_preprocess=False``), a chat conversation as
    OpenAI-format messages rendered with the model's chat template (``do_preprocess``)."""
    if request.kind == "chat":
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        return {"messages": messages, "input_ids": None, "do_preprocess": True}
    return prompt_arguments(request.prompt) | {"do_preprocess": False}


def to_chunk(out: Any) -> Chunk:
    """One streamed output: its delta ids, and LMDeploy's running count and finish."""
    return delta_chunk(
        getattr(out, "token_ids", None) or (),
        getattr(out, "response", ""),
        completion_tokens=getattr(out, "generate_token_len", None),
        prompt_tokens=getattr(out, "input_token_len", None),
        finish_reason=getattr(out, "finish_reason", None),
    )


def checked_chunk(out: Any) -> Chunk:
    """``to_chunk``, or the harness's ``RequestError`` for an output that ends a failed
    request."""
    reason = getattr(out, "finish_reason", None)
    if reason in _FAILED:
        raise RequestError(
            f"lmdeploy ended the request with {reason}: {getattr(out, 'response', '')}"
        )
    return to_chunk(out)


def request_failure(exc: BaseException) -> Exception:
    """What lmdeploy's ``RequestError`` means to the harness: one failed request, unless an
    engine fault lies beneath it (its ``safe_run`` wraps any exception as INTERNAL_ERROR);
    that one stays fatal, so the cell is recorded as crashed instead of counting on."""
    cause = exc.__cause__
    if cause is not None and is_fatal(cause):
        return EngineError(f"lmdeploy's engine failed: {type(cause).__name__}: {cause}")
    code = getattr(getattr(exc, "code", None), "value", None) or "unknown"
    return RequestError(f"lmdeploy failed the request ({code}): {exc}")


class LMDeployEngine:
    name: ClassVar[str] = "lmdeploy"
    option_schema: ClassVar[OptionSchema] = OPTIONS
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.GENERATIVE,
        devices=frozenset({"cuda"}),
        native_batching=frozenset({BatchingMode.CONTINUOUS}),
        streaming=True,
        prefix_cache_option="enable_prefix_caching",
    )

    def __init__(self, config: EngineConfig) -> None:
        self.validate_options(config.options)
        self.config = config
        self._engine: Any = None
        self._sessions = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def probe(cls, device: str) -> Availability:
        if importlib.util.find_spec("lmdeploy") is None:
            return Availability(
                False,
                f"lmdeploy is not installed (pip install 'lmdeploy>={MIN_VERSION}',"
                " on a machine with an NVIDIA GPU)",
            )
        installed = installed_version("lmdeploy")
        if installed is not None and Version(installed) < Version(MIN_VERSION):
            return Availability(
                False,
                f"lmdeploy {installed} predates the AsyncEngine.preprocess/generate API this"
                f" adapter drives (pip install 'lmdeploy>={MIN_VERSION}')",
            )
        import torch  # noqa: PLC0415  (lmdeploy depends on it)

        if not torch.cuda.is_available():
            return Availability(
                False, "lmdeploy needs an NVIDIA GPU (it has no CPU engine); none found"
            )
        return Availability(True)

    @classmethod
    def validate_options(cls, options: Mapping[str, str]) -> None:
        OPTIONS.validate(options)

    def load(self) -> None:
        from lmdeploy import messages  # noqa: PLC0415
        from lmdeploy.serve.core import AsyncEngine  # noqa: PLC0415

        # lmdeploy's logger starts at INFO and logs every request to stdout; Pipeline set
        # WARNING, and so must we, or the log lines would be measured with the requests
        logging.getLogger("lmdeploy").setLevel(logging.WARNING)
        cls_name, kwargs = engine_config(self.config.options)
        backend_config = getattr(messages, cls_name)(**kwargs)
        backend = self.config.options.get("backend", DEFAULTS["backend"])
        try:
            self._engine = AsyncEngine(
                model_path=str(self.config.model), backend=backend, backend_config=backend_config
            )
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
        if self._engine is not None:
            cfg = getattr(self._engine, "backend_config", None)
            info["effective"] = {
                "backend": getattr(self._engine, "backend", None),
                "config": type(cfg).__name__,
            } | {key: getattr(cfg, key, None) for key in (*kwargs, "session_len")}
        return info

    def _bind_loop(self) -> None:
        """The engine's request queues (and the PyTorch backend's main task) live on one
        event loop: start them on the caller's running loop, on first use."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None:
            raise EngineError("lmdeploy is bound to another event loop; use one loop per engine")
        self._engine.start_loop(loop, use_async_api=True)
        self._loop = loop

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        if self._engine is None:
            raise EngineError("engine not loaded: call load() first")
        from lmdeploy.messages import GenerationConfig  # noqa: PLC0415
        from lmdeploy.serve.core import RequestError as LMDeployRequestError  # noqa: PLC0415

        self._bind_loop()
        try:
            prepared = await self._engine.preprocess(
                **request_arguments(request),
                session_id=next(self._sessions),
                gen_config=GenerationConfig(**generation_kwargs(request)),
            )
            # aclosing: a consumer that stops early must hand the session back at once
            stream = self._engine.generate(prepared, stream_response=True)
            async with aclosing(stream):
                async for out in stream:
                    yield checked_chunk(out)
        except LMDeployRequestError as exc:
            raise request_failure(exc) from exc

    def close(self) -> None:
        engine, self._engine, self._loop = self._engine, None, None
        if engine is not None:
            engine.close()
