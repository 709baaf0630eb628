"""The engine contract: what every adapter in ``engines/`` provides.

Two families share one lifecycle (``load`` -> ``warmup`` -> work -> ``close``):

* tensor engines run ``infer(inputs) -> outputs`` on a batch of named arrays;
* generative engines stream output chunks from an async ``generate(request)``.

The harness talks to adapters only through these protocols, so a third-party engine
is one class registered under the ``harness.engines`` entry-point group.
"""

from __future__ import annotations

import enum
import re
from collections.abc import AsyncIterator, Collection, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from harness.engine.media import ImageInput
from harness.exceptions import EngineError, RequestError

JSONValue = Any
"""A value that ``json.dumps`` accepts (kept loose: describe() output is engine-defined)."""

Arrays = Mapping[str, npt.NDArray[Any]]


class Family(enum.StrEnum):
    TENSOR = "tensor"
    GENERATIVE = "generative"


class BatchingMode(enum.StrEnum):
    NONE = "none"
    STATIC = "static"
    DYNAMIC = "dynamic"
    CONTINUOUS = "continuous"


_FATAL = re.compile(
    r"CUDA error|CUDA_ERROR|cudaError|out of memory|device-side assert|illegal memory access",
    re.IGNORECASE,
)


def is_fatal(exc: BaseException) -> bool:
    """Errors after which the engine's process cannot be trusted (device faults, memory
    exhaustion): load generators re-raise them instead of counting a failed request, and
    the cell is recorded as crashed, its worker replaced."""
    if isinstance(exc, RequestError):
        return False
    return (
        isinstance(exc, MemoryError)
        or "OutOfMemory" in type(exc).__name__
        or bool(_FATAL.search(str(exc)))
    )


def installed_version(*distributions: str) -> str | None:
    """The version of the first of ``distributions`` that is installed (None: none is),
    read from package metadata without importing the engine."""
    for name in distributions:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def reject_unknown_options(options: Mapping[str, str], known: Mapping[str, str]) -> None:
    """For ``validate_options``: a ``ValueError`` naming unknown keys and every known one."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        listing = "; ".join(f"{k}: {v}" for k, v in known.items())
        raise ValueError(f"unknown option(s) {', '.join(unknown)}; known: {listing}")


@dataclass(frozen=True)
class Availability:
    """Whether an engine can run here for a device, and if not, why."""

    available: bool
    reason: str = ""
    note: str = ""
    """An available engine's caveat, shown beside "yes" in ``python -m harness engines``:
    what its cells need beyond the engine (a library their default model is built
    with, say), where every cell would otherwise skip for a reason the listing hid."""

    def __post_init__(self) -> None:
        if not self.available and not self.reason:
            raise ValueError("an unavailable engine must say why")


POOLING_KINDS = frozenset({"embed", "score", "rerank"})


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do, declared by the adapter class."""

    family: Family
    devices: frozenset[str]
    native_batching: frozenset[BatchingMode] = frozenset()
    streaming: bool = False
    dynamic_shapes: bool = False
    prefix_cache_option: str | None = None
    """The flag option (``"0"``/``"1"``) that turns the engine's prefix cache (KV-block
    reuse across requests) on, e.g. vLLM's ``enable_prefix_caching``; a workload that
    studies prefix caching sets it both ways. None: none the harness can turn on."""
    modalities: frozenset[str] = frozenset()
    """Media a generative request may carry besides text (``image``), as the engine takes
    them: the OpenAI chat API's ``image_url`` parts, or its in-process multimodal input."""
    lora: bool = False
    """Whether a request may name a LoRA adapter (``GenerationRequest.lora``) that the
    engine applies to it; the adapters are configured when the engine starts."""
    pooling: frozenset[str] = frozenset()
    """Pooling request kinds the engine serves (``embed``, ``score``, ``rerank``:
    ``harness.engine.pooling``)."""

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError("an engine must support at least one device kind")
        if self.streaming and self.family is not Family.GENERATIVE:
            raise ValueError("only generative engines stream")
        if self.prefix_cache_option is not None and self.family is not Family.GENERATIVE:
            raise ValueError("only generative engines have a prefix cache")
        if self.prefix_cache_option == "":
            raise ValueError("prefix_cache_option names an option, or is None")
        generative_only = {"modalities": self.modalities, "lora": self.lora}
        for key, value in generative_only.items():
            if value and self.family is not Family.GENERATIVE:
                raise ValueError(f"only generative engines declare {key}")
        if unknown := self.pooling - POOLING_KINDS:
            raise ValueError(f"pooling kinds {sorted(unknown)} are not in {sorted(POOLING_KINDS)}")

    def supports_device(self, device: str) -> bool:
        """``device`` is ``cpu``, ``cuda`` or ``cuda:N``; capability is per device kind."""
        return device.split(":", 1)[0] in self.devices

    def missing(self, required: Mapping[str, object]) -> list[str]:
        """Names of required capabilities this engine lacks (empty: it has them all)."""
        lacking: list[str] = []
        for key, wanted in required.items():
            have = getattr(self, key, None)
            ok = wanted in have if isinstance(have, frozenset) else have == wanted
            if not ok:
                lacking.append(f"{key}={wanted}")
        return lacking


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output: its name, dtype and shape (str or None: a dynamic dim)."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int | str | None, ...]

    @property
    def dynamic_dims(self) -> tuple[int, ...]:
        return tuple(i for i, d in enumerate(self.shape) if not isinstance(d, int) or d < 0)


def check_inputs(specs: tuple[TensorSpec, ...], inputs: Arrays) -> list[npt.NDArray[Any]]:
    """The inputs in spec order, or a ValueError naming what does not match."""
    names = [s.name for s in specs]
    if set(inputs) != set(names):
        raise ValueError(f"expected inputs {names}, got {sorted(inputs)}")
    out = []
    for spec in specs:
        array = inputs[spec.name]
        if array.dtype != spec.dtype or array.ndim != len(spec.shape):
            raise ValueError(
                f"input {spec.name}: expected {spec.dtype} of rank {len(spec.shape)},"
                f" got {array.dtype} {list(array.shape)}"
            )
        for got, want in zip(array.shape, spec.shape, strict=True):
            if isinstance(want, int) and want > 0 and got != want:
                raise ValueError(
                    f"input {spec.name}: shape {list(array.shape)} vs {list(spec.shape)}"
                )
        out.append(array)
    return out


@dataclass(frozen=True)
class EngineConfig:
    """What the user asked for; ``describe()`` reports what the engine actually used."""

    model: Path
    device: str = "cpu"
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.device:
            raise ValueError("device must not be empty")


@runtime_checkable
class Engine(Protocol):
    """Lifecycle shared by both families."""

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities]

    @classmethod
    def probe(cls, device: str) -> Availability:
        """Can this engine run here on ``device``? Must not load a model."""
        ...

    @classmethod
    def validate_options(cls, options: Mapping[str, str]) -> None:
        """Raise ``ValueError`` naming any option this adapter does not understand."""
        ...

    def load(self) -> None:
        """Load the model; raise ``EngineError`` if the engine cannot honour the config."""
        ...

    def describe(self) -> dict[str, JSONValue]:
        """Engine version and the effective settings actually in use."""
        ...

    def close(self) -> None:
        """Release everything ``load`` acquired; safe to call twice."""
        ...


@runtime_checkable
class TensorEngine(Engine, Protocol):
    """``infer`` on a batch of named arrays (first dim of each input is the batch)."""

    def input_specs(self) -> tuple[TensorSpec, ...]: ...

    def output_specs(self) -> tuple[TensorSpec, ...]: ...

    def warmup(self, inputs: Arrays, iterations: int) -> None: ...

    def infer(self, inputs: Arrays) -> dict[str, npt.NDArray[Any]]: ...


CHAT_ROLES = frozenset({"system", "user", "assistant"})


@dataclass(frozen=True)
class Message:
    """One turn of a chat conversation, as the OpenAI chat API takes it."""

    role: str
    content: str

    def __post_init__(self) -> None:
        if self.role not in CHAT_ROLES:
            raise ValueError(f"role {self.role!r} is not one of {sorted(CHAT_ROLES)}")


RequestKind = Literal["tokens", "text", "chat"]


@dataclass(frozen=True)
class GenerationRequest:
    """One generative request, as the user sends it: token ids, a text prompt, or a chat
    conversation (``messages``, with ``prompt`` left empty), which the engine renders
    with the model's chat template (in process) or sends to the chat API (over HTTP).

    ``max_tokens`` is what was asked: with ``ignore_eos`` (the default) exactly that many
    tokens, without it a cap on a reply that ends where the model ends it.
    """

    prompt: str | tuple[int, ...]
    max_tokens: int
    ignore_eos: bool = True
    request_id: str = ""
    temperature: float = 0.0
    messages: tuple[Message, ...] = ()
    images: tuple[ImageInput, ...] = ()
    """Images the request carries (a chat request's last user turn, as ``image_url``
    parts over HTTP; the model's multimodal input in process)."""
    lora: str = ""
    """The LoRA adapter this request runs on, by the name it was configured under; empty:
    the base model."""

    def __post_init__(self) -> None:
        if self.images and not self.messages:
            raise ValueError("a request with images is a chat request: give it messages")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.messages and self.prompt:
            raise ValueError("a chat request has messages and no prompt")
        if not self.messages and not self.prompt:
            raise ValueError("a request needs a prompt (token ids or text) or messages")

    @property
    def kind(self) -> RequestKind:
        if self.messages:
            return "chat"
        return "tokens" if isinstance(self.prompt, tuple) else "text"


@dataclass(frozen=True)
class Chunk:
    """One streamed piece of output as the engine delivered it.

    ``n_tokens`` is how many output tokens this chunk carries (``len(token_ids)`` when the
    engine gives ids; a role-only or empty chunk carries 0). ``completion_tokens`` and
    ``prompt_tokens`` are the engine's own running counts where it reports them. The
    harness stamps the arrival time itself, when the stream yields the chunk.
    """

    n_tokens: int
    token_ids: tuple[int, ...] = ()
    text: str = ""
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    engine_stats: Mapping[str, float] | None = None
    retokenized: int | None = None
    """Client-side count of the whole output, re-tokenized (final chunk, where available)."""
    client_stats: Mapping[str, float] | None = None
    """The adapter's own timings of the request in seconds (an HTTP engine:
    ``http_headers_s``, sent to response headers), feeding the stage breakdown."""
    reasoning_tokens: int = 0
    """Of the ``n_tokens``, how many are a reasoning model's reasoning (its thinking, where
    the stream separates it from the answer, e.g. ``delta.reasoning``); the rest are
    answer. ``text`` is the answer's text only."""
    received_at: float | None = None
    """When the bytes that carried this chunk were read (``time.perf_counter``), where
    the adapter knows it (an HTTP client stamps each read once, for all the events in
    it); None: the harness stamps the chunk when the stream yields it."""

    def __post_init__(self) -> None:
        if self.n_tokens < 0:
            raise ValueError("n_tokens must be >= 0")
        if self.token_ids and len(self.token_ids) != self.n_tokens:
            raise ValueError("n_tokens must equal len(token_ids) when ids are given")
        if not 0 <= self.reasoning_tokens <= self.n_tokens:
            raise ValueError("reasoning_tokens must be between 0 and n_tokens")


@runtime_checkable
class GenerativeEngine(Engine, Protocol):
    """Streams chunks as they are produced so TTFT and ITL are measured token by token."""

    def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]: ...


PRECISIONS = ("fp32", "fp16", "bf16", "int8")


@runtime_checkable
class DeclaresPrecisions(Protocol):
    """An engine that can run a model at other precisions than the model's own.

    ``precision_options(name, device)`` returns the adapter options that select precision
    ``name`` (one of ``PRECISIONS``) on ``device``, or raises ``ValueError`` saying why
    the engine cannot (the precision workload skips with that reason)::

        @classmethod
        def precision_options(cls, name: str, device: str) -> dict[str, str]:
            if name == "bf16":
                return {"dtype": "bfloat16"}
            raise ValueError(f"{cls.name} has no {name} path")
    """

    @classmethod
    def precision_options(cls, name: str, device: str) -> dict[str, str]: ...


@runtime_checkable
class ExposesCounters(Protocol):
    """An engine whose server keeps cumulative counters (e.g. Prometheus ``/metrics``).

    Read before and after a cell; the difference is the engine's own account of the
    cell, stored beside the client-side numbers.
    """

    def counters(self) -> dict[str, float]: ...


@runtime_checkable
class ExposesMetricsText(Protocol):
    """An engine whose server publishes its state as Prometheus text (an HTTP server's
    ``/metrics``; an in-process engine: its process's ``prometheus_client`` registry).

    ``metrics_text(names)`` returns that text as it is now. The harness calls it a few
    times a second from a background thread while a cell runs
    (harness.metrics.servermetrics), so it must be cheap and must not use the engine's
    event loop. ``names``: the sample names the harness reads; an engine may leave the
    others out of the text (None: all)::

        def metrics_text(self, names: Collection[str] | None = None) -> str:
            return httpx.get(f"{self.base_url}/metrics").text
    """

    def metrics_text(self, names: Collection[str] | None = None) -> str: ...


DEVICE_STAGES = ("h2d", "compute", "d2h")


@runtime_checkable
class ReportsDeviceTimes(Protocol):
    """An engine that times its last ``infer`` on the device (e.g. with CUDA events).

    The host clock around ``infer`` sees the whole call; these split it as trtexec does:
    seconds spent copying inputs in (``h2d``), computing (``compute``) and copying
    outputs back (``d2h``). An empty mapping means this call was not timed on a device
    (a CPU run)::

        def device_times(self) -> dict[str, float]:
            return {"h2d": 1.2e-4, "compute": 8.3e-4, "d2h": 0.6e-4}
    """

    def device_times(self) -> Mapping[str, float]: ...


def device_spans(engine: object, within: str = "infer") -> dict[str, float]:
    """The last call's device times as spans nested in ``within`` (``infer.compute``)."""
    if not isinstance(engine, ReportsDeviceTimes):
        return {}
    times = engine.device_times()
    unknown = set(times) - set(DEVICE_STAGES)
    if unknown:
        raise EngineError(f"device_times() returned unknown stages {sorted(unknown)}")
    return {f"{within}.{k}": float(v) for k, v in times.items()}


def counter_totals(text: str) -> dict[str, float]:
    """Prometheus text's counters and histogram sums and counts, each summed over its
    label sets: what an ``ExposesCounters`` engine that serves Prometheus metrics returns
    from ``counters()``. Parsed by ``prometheus_client`` (the engine's dependency)."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_sum", "_count", "_total")):
                totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    return totals


def counter_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """``after - before`` for every counter present in both, plus ``<x>_mean`` for each
    ``<x>_sum``/``<x>_count`` pair (a histogram's mean over the cell)."""
    delta = {k: after[k] - before[k] for k in sorted(after) if k in before}
    for key in list(delta):
        if key.endswith("_sum"):
            base = key.removesuffix("_sum")
            count = delta.get(f"{base}_count", 0.0)
            if count > 0:
                delta[f"{base}_mean"] = delta[key] / count
    return delta


class EngineFactory(Protocol):
    """An adapter class: constructing it must not import or start the engine."""

    @property
    def name(self) -> str: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def __call__(self, config: EngineConfig) -> Engine: ...

    def probe(self, device: str) -> Availability: ...

    def validate_options(self, options: Mapping[str, str]) -> None: ...
