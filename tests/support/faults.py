"""Fault-injecting engines for testing the harness itself (never used by workloads).

``faulty`` is a tensor engine and ``faulty-gen`` a generative one; the option ``fault``
picks what goes wrong and ``at`` the call (tensor) or chunk (generative) where it does:

=================  ==========================================================
crash_load         the process exits (code 13) while the engine loads
hang_load          loading never finishes
segfault           a real segmentation fault at call ``at``
exit               the process exits (code 17) at call ``at``
abort_close        SIGABRT while the engine closes (after its cells finished)
hang               call ``at`` never returns
leak               every call keeps ``leak_mb`` MiB more memory
wrong_shape        every output has one row too many
cuda_error         call ``at`` raises what a CUDA runtime error looks like
oom                call ``at`` raises MemoryError (an allocation the engine could not make)
raise              every call from ``at`` on raises
raise_mid_stream   generative: every ``every``-th stream raises after ``at`` chunks
hang_mid_stream    generative: every ``every``-th stream stops producing after ``at``
leak_secret        at load: prints $OPENAI_API_KEY, then fails with it and HTML in the message
=================  ==========================================================

``once=PATH`` makes the fault fire only while PATH does not exist (it is created when
the fault fires), so a resumed run finds the engine healthy.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
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
)

FAULTS = {
    "none",
    "crash_load",
    "hang_load",
    "segfault",
    "exit",
    "abort_close",
    "hang",
    "leak",
    "wrong_shape",
    "cuda_error",
    "oom",
    "raise",
    "raise_mid_stream",
    "hang_mid_stream",
    "leak_secret",
}
OPTIONS = {"fault", "at", "every", "leak_mb", "once"}


def _hang() -> None:
    while True:
        time.sleep(3600)


class FaultyEngine:
    name: ClassVar[str] = "faulty"
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.TENSOR, devices=frozenset({"cpu"}), dynamic_shapes=True
    )

    def __init__(self, config: EngineConfig) -> None:
        self.validate_options(config.options)
        self.config = config
        o = config.options
        self.fault = o.get("fault", "none")
        self.at = int(o.get("at", "5"))
        self.every = int(o.get("every", "1"))
        self.leak_mb = int(o.get("leak_mb", "64"))
        self.once = Path(o["once"]) if "once" in o else None
        self.calls = 0
        self._leaked: list[np.ndarray] = []

    @classmethod
    def probe(cls, device: str) -> Availability:
        return Availability(True)

    @classmethod
    def validate_options(cls, options: Mapping[str, str]) -> None:
        unknown = set(options) - OPTIONS
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(sorted(unknown))}")
        if options.get("fault", "none") not in FAULTS:
            raise ValueError(f"fault must be one of {', '.join(sorted(FAULTS))}")

    def armed(self, fault: str) -> bool:
        if self.fault != fault:
            return False
        if self.once is None:
            return True
        try:
            self.once.touch(exist_ok=False)
        except FileExistsError:
            return False
        return True

    def load(self) -> None:
        if self.armed("crash_load"):
            print("faulty: exiting during load", file=sys.stderr, flush=True)
            os._exit(13)
        if self.armed("hang_load"):
            _hang()
        if self.armed("leak_secret"):
            secret = os.environ.get("OPENAI_API_KEY", "")
            print(f"faulty: using key {secret}", file=sys.stderr, flush=True)
            raise EngineError(
                f"server refused key {secret}; it says <script>alert(1)</script> | pipe"
            )

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "engine": self.name,
            "version": "0-faults",
            "fault": self.fault,
            "pid": os.getpid(),
        }
        if self.fault == "leak_secret":
            info["auth"] = os.environ.get("OPENAI_API_KEY", "")
            info["banner"] = "<script>alert(1)</script> | pipe"
        return info

    def close(self) -> None:
        if self.armed("abort_close"):
            print("faulty: aborting while closing", file=sys.stderr, flush=True)
            os.abort()

    def input_specs(self) -> tuple[TensorSpec, ...]:
        return (TensorSpec("x", np.dtype(np.float32), (None, 4)),)

    def output_specs(self) -> tuple[TensorSpec, ...]:
        return (TensorSpec("y", np.dtype(np.float32), (None, 1)),)

    def warmup(self, inputs: Arrays, iterations: int) -> None:
        for _ in range(iterations):
            self.infer(inputs, warm=True)

    def infer(self, inputs: Arrays, warm: bool = False) -> dict[str, Any]:
        if not warm:
            self.calls += 1
            self._inject(self.calls)
        x = inputs["x"]
        rows = x.shape[0] + (1 if self.fault == "wrong_shape" else 0)
        return {"y": np.ones((rows, 1), dtype=np.float32)}

    def _inject(self, call: int) -> None:
        if self.fault == "leak":
            self._leaked.append(np.ones(self.leak_mb * 2**20, dtype=np.uint8))
        if call == self.at:
            self._at_call()
        if self.fault == "raise" and call >= self.at:
            raise RuntimeError(f"faulty: injected failure in call {call}")

    def _at_call(self) -> None:
        if self.armed("segfault"):
            print("faulty: about to dereference NULL", file=sys.stderr, flush=True)
            ctypes.string_at(0)
        if self.armed("exit"):
            print("faulty: exiting mid-run", file=sys.stderr, flush=True)
            os._exit(17)
        if self.armed("hang"):
            _hang()
        if self.armed("cuda_error"):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if self.armed("oom"):
            raise MemoryError("faulty: could not allocate 2 GiB")


class FaultyGenerativeEngine(FaultyEngine):
    name: ClassVar[str] = "faulty-gen"
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.GENERATIVE,
        devices=frozenset({"cpu"}),
        native_batching=frozenset({BatchingMode.CONTINUOUS}),
        streaming=True,
    )

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        self.calls += 1
        faulty_stream = self.calls % self.every == 0
        for i in range(request.max_tokens):
            await asyncio.sleep(0.001)
            if faulty_stream and i == self.at:
                if self.fault == "raise_mid_stream":
                    raise ConnectionResetError("faulty: stream reset mid-way")
                if self.fault == "hang_mid_stream":
                    await asyncio.sleep(3600)
            yield Chunk(n_tokens=1, token_ids=(7,), completion_tokens=i + 1)
