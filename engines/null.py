"""Engines that do (almost) nothing, to measure the harness itself.

``null`` is a tensor engine: with ``service_time_s=0`` (the default) it returns at once,
so what a cell measures is the harness; with a fixed service time it is a server whose
true latency is known. ``null-gen`` streams one-token chunks, a fixed ``token_time_s``
apart: ``max_tokens`` of them, or with ``ignore_eos=False`` a seeded length (see
``reply_length``). Both can stall once (``stall_at=N``, ``stall_s=S``): call or
request N takes S seconds longer, blocking the caller the way an in-process engine
holding the interpreter does; that is how coordinated omission is shown to be avoided.

``null-gen`` can also model prefill and a prefix cache, for the harness's own tests of
prefix-caching workloads: ``prefill_token_s`` is the time per prompt token before the
first token, and with ``prefix_cache=1`` the leading whole ``PREFIX_BLOCK``-token blocks
of a prompt seen before cost nothing; it counts the prompt tokens it looked up and found
as ``null_gen:prefix_cache_queries_total`` and ``..._hits_total`` (``counters()``), as
vLLM counts its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import random
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

import numpy as np

from harness.engine import (
    Arrays,
    Availability,
    BatchingMode,
    Capabilities,
    Chunk,
    EngineConfig,
    EngineError,
    Family,
    GenerationRequest,
    TensorSpec,
    check_inputs,
)
from harness.engine.optionschema import OptionSchema, flag, integer, number

SECONDS = ">= 0 seconds"
OPTIONS = OptionSchema(
    number(
        "service_time_s",
        "seconds each call (tensor) takes (0: return at once)",
        default="0",
        low=0,
        must=SECONDS,
    ),
    number(
        "token_time_s",
        "seconds between streamed tokens (generative)",
        default="0",
        low=0,
        must=SECONDS,
    ),
    integer(
        "stall_at",
        "1-based call/request number that stalls (default: none)",
        must="an integer >= 1",
    ),
    number("stall_s", "how long the stall lasts, in seconds", default="1", low=0, must=SECONDS),
    integer(
        "features",
        "input width of the tensor engine's one input x",
        default="4",
        must="an integer >= 1",
    ),
    flag(
        "fail_load",
        "1: loading fails, as an engine configuration that cannot start does (fault injection)",
    ),
)
TOKEN_TIME_S = "0.002"  # noqa: S105 - a time, not a secret
"""null-gen's default time per token (500 tokens/s per sequence, a small model's decode
on a GPU): long enough that its closed-loop cells fill the quick profile's 1 s window
with the profile's request count (120 requests of about 32 tokens, 4 in flight: 1.9 s);
``token_time_s=0`` measures the harness alone."""
GEN_OPTIONS = OptionSchema(
    *(o for o in OPTIONS.options if o.name != "token_time_s"),
    number(
        "token_time_s",
        "seconds between streamed tokens",
        default=TOKEN_TIME_S,
        low=0,
        must=SECONDS,
    ),
    integer(
        "max_num_seqs",
        "requests generated at once; more wait for a free slot, as behind a full batch"
        " (default: no limit)",
        must="an integer >= 1",
    ),
    number(
        "prefill_token_s",
        "seconds per prompt token not found in the prefix cache, before the first token",
        default="0",
        low=0,
        must=SECONDS,
    ),
    flag("prefix_cache", "reuse whole blocks of a prompt's prefix seen before"),
)
LLM_EXTRA = ("torch", "transformers", "tokenizers")
"""What the generative workloads' default model, the embedded tiny LLM
(``workloads/lib/llm.py``, extra ``[llm]``), is built with. null-gen needs none of them; its
cells do, unless ``--model DIR`` names a model."""
PREFIX_BLOCK = 16
"""Tokens per cached block (vLLM's default block size): only whole blocks are reused."""


async def _until(due: float) -> None:
    """Sleep until ``due`` on a schedule, not for a duration: the event loop's timers have
    millisecond steps (asyncio's round a 0.3 ms sleep up to 1.1 ms, uvloop's to 0), so
    per-token sleeps would stream at the loop's pace; sleeping to each token's due time
    keeps the stream's rate what ``token_time_s`` says on either loop."""
    await asyncio.sleep(max(due - time.perf_counter(), 0.0))


def _wait(seconds: float) -> None:
    """Blocking wait: sleep the bulk, spin the last stretch (sleep overshoots ~0.1 ms)."""
    if seconds <= 0:
        return
    end = time.perf_counter() + seconds
    if seconds > 0.002:
        time.sleep(seconds - 0.001)
    while time.perf_counter() < end:
        pass


class NullEngine:
    name: ClassVar[str] = "null"
    option_schema: ClassVar[OptionSchema] = OPTIONS
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.TENSOR, devices=frozenset({"cpu", "cuda"}), dynamic_shapes=True
    )

    def __init__(self, config: EngineConfig) -> None:
        self.validate_options(config.options)
        self.config = config
        o = self.resolved = self.option_schema.resolve(config.options)
        self.service_time = float(o["service_time_s"])
        self.token_time = float(o["token_time_s"])
        self.stall_s = float(o["stall_s"])
        self.stall_at = int(o["stall_at"]) if "stall_at" in o else None
        self.features = int(o["features"])
        self.calls = 0

    @classmethod
    def probe(cls, device: str) -> Availability:
        return Availability(True)

    @classmethod
    def validate_options(cls, options: Mapping[str, str]) -> None:
        cls.option_schema.validate(options)

    def load(self) -> None:
        if self.resolved["fail_load"] == "1":
            raise EngineError("null: this configuration cannot start (fail_load=1)")
        self.calls = 0

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        settings = {
            "service_time_s": self.service_time,
            "token_time_s": self.token_time,
            "stall": {"at": self.stall_at, "seconds": self.stall_s} if self.stall_at else None,
            "features": self.features,
        }
        head = {"engine": self.name, "version": "0", "device": self.config.device}
        return head | settings | {"effective": settings}

    def _next_call(self) -> float:
        """Counts the call; returns the extra seconds it stalls (0 but once)."""
        self.calls += 1
        return self.stall_s if self.calls == self.stall_at else 0.0

    def input_specs(self) -> tuple[TensorSpec, ...]:
        return (TensorSpec("x", np.dtype(np.float32), (None, self.features)),)

    def output_specs(self) -> tuple[TensorSpec, ...]:
        return (TensorSpec("y", np.dtype(np.float32), (None, 1)),)

    def warmup(self, inputs: Arrays, iterations: int) -> None:
        for _ in range(iterations):
            self.infer(inputs)
        self.calls = 0  # stall_at counts measured calls only

    def infer(self, inputs: Arrays) -> dict[str, Any]:
        (x,) = check_inputs(self.input_specs(), inputs)
        _wait(self.service_time + self._next_call())
        return {"y": np.zeros((x.shape[0], 1), dtype=np.float32)}


def prompt_tokens(request: GenerationRequest) -> tuple[int | str, ...]:
    """The prompt's tokens as null-gen sees them: its ids, or the whitespace-separated
    words of a text prompt or of a conversation's message contents."""
    if request.kind == "chat":
        return tuple(w for m in request.messages for w in m.content.split())
    if isinstance(request.prompt, tuple):
        return request.prompt
    return tuple(request.prompt.split())


def input_tokens(request: GenerationRequest) -> int:
    return len(prompt_tokens(request))


def reply_length(request: GenerationRequest) -> int:
    """``max_tokens`` with ``ignore_eos``; without it, where the "model" ends the reply: a
    length drawn uniformly from [1, max_tokens], seeded by the request id, so a natural-EOS
    run gives varying lengths that the same request ids reproduce (in any process)."""
    if request.ignore_eos:
        return request.max_tokens
    return random.Random(f"null-gen:{request.request_id}").randint(1, request.max_tokens)


class NullGenerativeEngine(NullEngine):
    """Streams a reply to any request, token ids, text or chat, doing no work.

    Each chunk reports the prompt's tokens (``input_tokens``) as ``prompt_tokens``. With
    ``ignore_eos`` (the default) the reply is exactly ``max_tokens`` long; with
    ``ignore_eos=False`` it ends at a seeded length in [1, max_tokens], drawn from the
    request id (``reply_length``): varying, reproducible lengths for natural-EOS runs.
    """

    name: ClassVar[str] = "null-gen"
    option_schema: ClassVar[OptionSchema] = GEN_OPTIONS
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.GENERATIVE,
        devices=frozenset({"cpu", "cuda"}),
        native_batching=frozenset({BatchingMode.CONTINUOUS}),
        streaming=True,
        prefix_cache_option="prefix_cache",
        lora=True,  # any adapter a request names: it does no work either way
    )

    @classmethod
    def probe(cls, device: str) -> Availability:
        missing = [lib for lib in LLM_EXTRA if importlib.util.find_spec(lib) is None]
        if not missing:
            return Availability(True)
        return Availability(
            True,
            note=f"needs [llm] or --model: its workloads' default model, the embedded tiny"
            f" LLM, is built with {', '.join(missing)} (not installed: pip install -e"
            " '.[llm]')",
        )

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        o = self.resolved  # resolved by NullEngine against GEN_OPTIONS
        self.prefill_token_s = float(o["prefill_token_s"])
        self.prefix_cache = o["prefix_cache"] == "1"
        self.max_num_seqs = int(o["max_num_seqs"]) if "max_num_seqs" in o else None
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._blocks: set[int] = set()
        self._queried = self._hit = 0

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        mine = {
            "prefill_token_s": self.prefill_token_s,
            "prefix_cache": self.prefix_cache,
            "max_num_seqs": self.max_num_seqs,
        }
        return info | mine | {"effective": info["effective"] | mine}

    def counters(self) -> dict[str, float]:
        return {
            "null_gen:prefix_cache_queries_total": float(self._queried),
            "null_gen:prefix_cache_hits_total": float(self._hit),
        }

    def _cached(self, request: GenerationRequest) -> int:
        """Prompt tokens found in the prefix cache: its leading whole blocks seen before.
        Remembers its blocks."""
        if not self.prefix_cache:
            return 0
        ids = prompt_tokens(request)
        self._queried += len(ids)
        keys = [hash(ids[:end]) for end in range(PREFIX_BLOCK, len(ids) + 1, PREFIX_BLOCK)]
        found = next((i for i, k in enumerate(keys) if k not in self._blocks), len(keys))
        self._blocks.update(keys)
        self._hit += found * PREFIX_BLOCK
        return found * PREFIX_BLOCK

    def _slot(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """A place among the ``max_num_seqs`` sequences generated at once (none to wait
        for without a limit). The semaphore belongs to the event loop it was made on: each
        cell runs its own."""
        if self.max_num_seqs is None:
            return contextlib.nullcontext()
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.max_num_seqs))
        return self._slots[1]

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        async with self._slot():
            async for chunk in self._stream(request):
                yield chunk

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        _wait(self._next_call())  # a stall blocks the event loop: the generator with it
        n_in, n_out = input_tokens(request), reply_length(request)
        prefill = (n_in - self._cached(request)) * self.prefill_token_s
        due = time.perf_counter() + prefill
        if prefill > 0:
            await _until(due)
        finish = "length" if n_out == request.max_tokens else "stop"
        for i in range(n_out):
            if self.token_time > 0:
                due += self.token_time
                await _until(due)
            yield Chunk(
                n_tokens=1,
                token_ids=(i % 100 + 4,),
                completion_tokens=i + 1,
                prompt_tokens=n_in,
                finish_reason=finish if i == n_out - 1 else None,
            )
