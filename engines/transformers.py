"""Hugging Face transformers in process, on its own continuous batching.

``model.init_continuous_batching()`` (transformers 5.x) runs a paged KV cache and a
scheduler on a background thread; each request is added with ``streaming=True`` and a
result handler that the manager calls on the harness's event loop
(``register_result_handler``: ``call_soon_threadsafe``) every time the request has new
tokens. Each call carries the request's tokens so far, so the chunk is the difference:
a step that produced several tokens is one chunk of several, never one per call.

This is the baseline users ask about ("is vLLM worth it over plain transformers on my
GPU?"): the same model files, the library's own scheduler, no server. The batching
knobs are explicit (``max_num_seqs`` is the manager's ``max_requests_per_batch``, the
name the other adapters use) and prefix sharing (``allow_block_sharing``) is off unless
asked for. ``describe()`` reports what the manager resolved: attention kernel, page
size, blocks, token budget, CUDA graphs.

Requests go in as the user sent them (one whose prompt and tokens to generate exceed
the model's ``max_position_embeddings`` is refused): token ids as they are; a text prompt tokenized
with the model's tokenizer, special tokens included (as vLLM's completions API does); a
chat conversation rendered with the model's chat template (engines/llmstream.py).
``ignore_eos`` passes ``eos_token_id=-1`` (no token ends the request), else the model's
EOS ends it. Sampling is greedy: the manager shares one generation config, so a request
asking for a temperature fails saying so rather than being measured as something else.

The configuration field for the page size was ``block_size`` until 5.17 and is
``page_size`` since: the ``block_size`` option sets whichever this version has.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

from engines.llmstream import chat_prompt_ids, delta_chunk, torch_dtype_precision
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
)
from harness.engine.optionschema import OptionSchema, choice, flag, integer

DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION = ("auto", "sdpa", "eager", "flash_attention_2", "flash_attention_3")
OPTIONS = OptionSchema(
    integer(
        "max_num_seqs",
        "most requests in one batch (the manager's max_requests_per_batch)",
        default="16",
    ),
    integer(
        "max_batch_tokens",
        "token budget of one batch (default: the manager sizes it from memory)",
        default=None,
    ),
    integer(
        "num_blocks",
        "KV-cache blocks (default: sized from free memory: 0.1 of it on a CPU)",
        default=None,
    ),
    integer("block_size", "tokens per KV-cache page (page_size; block_size before 5.17)"),
    choice("dtype", "weights and compute dtype", DTYPES, default="auto"),
    choice(
        "attn_implementation",
        "attention kernel; auto: the model's default, switched to flash attention in half"
        " precision where it is installed (eager runs as paged|eager)",
        ATTENTION,
        default="auto",
    ),
    flag(
        "cuda_graphs",
        "CUDA graphs for prefill and decode (default: the manager decides)",
        default=None,
    ),
    integer(
        "compile_level",
        "torch.compile level of the manager's default compile configs (0: eager)",
        default="0",
        low=0,
        high=3,
    ),
    flag("enable_prefix_caching", "share KV blocks across requests (allow_block_sharing)"),
    integer("seed", "the manager's sampling seed", default="0", low=0),
)
DEFAULTS = OPTIONS.defaults()
START_TIMEOUT_S = 120.0
CPU_KV_MEMORY = 0.1
"""On a CPU, the share of free memory the KV cache takes unless ``num_blocks`` is given:
the manager's own default, 0.6, grew workers to 14-19 GB on a 24 GB machine and the
kernel killed them (and their neighbours). On a GPU, the manager's default."""
HANDLER_MISSING = (
    "transformers {version} has no streaming result handlers for continuous batching"
    " (ContinuousBatchingManager.register_result_handler); the engine needs transformers"
    " 5.17 or newer: pip install -U transformers"
)


def install_hint() -> str:
    return "pip install -e '.[transformers]' (torch, transformers, tokenizers)"


class TransformersEngine:
    name: ClassVar[str] = "transformers"
    option_schema: ClassVar[OptionSchema] = OPTIONS
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.GENERATIVE,
        devices=frozenset({"cpu", "cuda"}),
        native_batching=frozenset({BatchingMode.CONTINUOUS}),
        streaming=True,
        prefix_cache_option="enable_prefix_caching",
    )

    def __init__(self, config: EngineConfig) -> None:
        self.validate_options(config.options)
        self.config = config
        self.options = {**DEFAULTS, **config.options}
        self._model: Any = None
        self._tokenizer: Any = None
        self._manager: Any = None
        self._context: int | None = None
        self._n = 0

    @classmethod
    def probe(cls, device: str) -> Availability:
        missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
        if missing:
            return Availability(False, f"{', '.join(missing)} not installed ({install_hint()})")
        from transformers.generation.continuous_batching import (  # noqa: PLC0415
            ContinuousBatchingManager,
        )

        if not hasattr(ContinuousBatchingManager, "register_result_handler"):
            version = installed_version("transformers")
            return Availability(False, HANDLER_MISSING.format(version=version))
        if device.startswith("cuda"):
            import torch  # noqa: PLC0415

            if not torch.cuda.is_available():
                return Availability(False, "transformers on cuda needs an NVIDIA GPU; none found")
        return Availability(True)

    @classmethod
    def validate_options(cls, options: Mapping[str, str]) -> None:
        OPTIONS.validate(options)

    @classmethod
    def precision_options(cls, name: str, device: str) -> dict[str, str]:
        return torch_dtype_precision(cls.name, name, device)

    def batching_config(self, config_class: type) -> dict[str, Any]:
        """The ContinuousBatchingConfig fields this adapter sets (pure: unit-tested
        without building a model); ``config_class`` says which fields this version has."""
        o = self.options
        fields = {f.name for f in dataclasses.fields(config_class)}
        wanted: dict[str, Any] = {
            "max_requests_per_batch": int(o["max_num_seqs"]),
            "allow_block_sharing": o["enable_prefix_caching"] == "1",
            "default_compile_level": int(o["compile_level"]),
            "seed": int(o["seed"]),
            # the attention the user chose is measured, never swapped for flash behind it
            "auto_switch_to_flash": o["attn_implementation"] == "auto",
        }
        for sized in ("max_batch_tokens", "num_blocks"):
            if o.get(sized) is not None:
                wanted[sized] = int(o[sized])
        if o.get("num_blocks") is None and self.config.device == "cpu":
            wanted["max_memory_percent"] = CPU_KV_MEMORY
        if o.get("block_size") is not None:
            wanted["page_size" if "page_size" in fields else "block_size"] = int(o["block_size"])
        if o.get("cuda_graphs") is not None:
            wanted["use_cuda_graph"] = o["cuda_graphs"] == "1"
        return {k: v for k, v in wanted.items() if k in fields}

    def load(self) -> None:
        import torch  # noqa: PLC0415
        from transformers import (  # noqa: PLC0415
            AutoModelForCausalLM,
            AutoTokenizer,
            ContinuousBatchingConfig,
            GenerationConfig,
        )

        o = self.options
        dtype = "auto" if o["dtype"] == "auto" else getattr(torch, o["dtype"])
        kwargs: dict[str, Any] = {"dtype": dtype}
        if o["attn_implementation"] != "auto":
            kwargs["attn_implementation"] = o["attn_implementation"]
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(self.config.model)
            model = AutoModelForCausalLM.from_pretrained(self.config.model, **kwargs)
            self._model = model.to(self.config.device).eval()
            self._context = getattr(model.config, "max_position_embeddings", None)
            generation = GenerationConfig(
                do_sample=False,
                max_new_tokens=16,
                eos_token_id=self._tokenizer.eos_token_id,
                pad_token_id=self._tokenizer.pad_token_id or self._tokenizer.eos_token_id,
            )
            batching = ContinuousBatchingConfig(**self.batching_config(ContinuousBatchingConfig))
            self._manager = self._model.init_continuous_batching(
                generation_config=generation, continuous_batching_config=batching
            )
            self._manager.start()
            self._wait_until_serving()
        except Exception as exc:
            self.close()
            raise EngineError(
                f"transformers could not start on {self.config.model}: {exc}"
            ) from exc

    def _wait_until_serving(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the manager's thread has built its batch processor (the KV cache is
        allocated there): a cache that does not fit fails ``load``, not the first request,
        and ``describe()`` reports the sizes the manager resolved."""
        deadline = time.monotonic() + timeout_s
        manager = self._manager
        while manager.batch_processor is None:
            error = manager.background_thread_status.fatal_error
            if error is not None:
                raise EngineError(f"its continuous-batching loop failed: {error}")
            if not manager.is_running() or time.monotonic() > deadline:
                raise EngineError(f"its continuous-batching loop did not start in {timeout_s:g} s")
            time.sleep(0.01)

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "engine": self.name,
            "version": installed_version("transformers"),
            "torch": installed_version("torch"),
            "device": self.config.device,
            "requested": {k: v for k, v in self.options.items() if v is not None},
        }
        if self._manager is not None:
            info["effective"] = self._effective()
        return info

    def _effective(self) -> dict[str, Any]:
        model, manager = self._model, self._manager
        cb = manager.continuous_batching_config
        page = getattr(cb, "page_size", None) or getattr(cb, "block_size", None)
        processor = manager.batch_processor
        cache = getattr(processor, "cache", None)
        return {
            "dtype": str(model.dtype).removeprefix("torch."),
            "attn_implementation": model.config._attn_implementation,
            "max_num_seqs": cb.max_requests_per_batch,
            "max_batch_tokens": getattr(cache, "max_batch_tokens", cb.max_batch_tokens),
            "num_blocks": getattr(cache, "num_blocks", cb.num_blocks),
            "block_size": page,
            "cuda_graphs": _plain(cb.use_cuda_graph),
            "compile_level": cb.default_compile_level,
            "enable_prefix_caching": bool(getattr(manager, "_use_prefix_sharing", False)),
            "device": str(model.device),
        }

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        if self._manager is None:
            raise EngineError("engine not loaded: call load() first")
        if request.temperature:
            raise RequestError(
                "the transformers engine decodes greedily (one generation config for the"
                f" batch); temperature {request.temperature} cannot be honoured"
            )
        ids = self._prompt_ids(request)
        context = self._context
        if context is not None and len(ids) + request.max_tokens > context:
            raise RequestError(
                f"prompt of {len(ids)} tokens and {request.max_tokens} to generate exceed the"
                f" model's context of {context} (max_position_embeddings)"
            )
        self._n += 1
        request_id = request.request_id or f"harness-{self._n}"
        outputs: asyncio.Queue[Any] = asyncio.Queue()
        # registered before the request exists, so that no output can reach the shared queue
        self._manager.register_result_handler(request_id, outputs.put_nowait)
        self._manager.add_request(
            ids,
            request_id=request_id,
            max_new_tokens=request.max_tokens,
            streaming=True,
            eos_token_id=-1 if request.ignore_eos else None,
        )
        seen = 0
        while True:
            out = await outputs.get()
            if out.error is not None:
                raise RequestError(f"transformers failed request {request_id}: {out.error}")
            tokens = out.generated_tokens
            finished = out.is_finished()
            if len(tokens) > seen or finished:
                yield delta_chunk(
                    tokens[seen:],
                    prompt_tokens=len(ids),
                    completion_tokens=len(tokens),
                    finish_reason=_finish_reason(tokens, request) if finished else None,
                )
                seen = len(tokens)
            if finished:
                return

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        if request.kind == "chat":
            return chat_prompt_ids(self._tokenizer, request.messages, self.config.model)
        if isinstance(request.prompt, tuple):
            return list(request.prompt)
        return [int(t) for t in self._tokenizer.encode(request.prompt)]

    def close(self) -> None:
        if self._manager is not None:
            self._manager.stop(block=True, timeout=30)
            self._manager = None
        self._model = None
        self._tokenizer = None


def _finish_reason(tokens: list[int], request: GenerationRequest) -> str:
    return "length" if len(tokens) >= request.max_tokens else "stop"


def _plain(value: Any) -> Any:
    """CUDA-graph settings are a bool or a (prefill, decode) pair: JSON-friendly either way."""
    return list(value) if isinstance(value, tuple) else value
