"""Fakes for testing the harness itself (never used by workloads): a clock and engines."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from harness.engine import (
    Arrays,
    Availability,
    Capabilities,
    EngineConfig,
    EngineError,
    Family,
    TensorSpec,
)


@dataclass
class FakeClock:
    """Time moves only when told: by ``sleep_until`` or ``advance``."""

    t: float = 0.0
    sleeps: list[float] = field(default_factory=list)

    def now(self) -> float:
        return self.t

    def sleep_until(self, deadline: float) -> None:
        self.sleeps.append(deadline)
        self.t = max(self.t, deadline)

    def advance(self, dt: float) -> None:
        self.t += dt


class FakeTensorEngine:
    """A tensor engine that echoes a [batch, 1] output; configurable to fail."""

    name: ClassVar[str] = "fake-tensor"
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.TENSOR, devices=frozenset({"cpu"}), dynamic_shapes=False
    )
    available: ClassVar[Availability] = Availability(True)

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.loaded = False
        self.closed = False

    @classmethod
    def probe(cls, device: str) -> Availability:
        return cls.available

    @classmethod
    def validate_options(cls, options: Mapping[str, str]) -> None:
        if set(options) - {"fail"}:
            raise ValueError(f"unknown option(s) {sorted(set(options) - {'fail'})}")

    def load(self) -> None:
        if self.config.options.get("fail") == "load":
            raise EngineError("fake engine: this configuration cannot start")
        self.loaded = True

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "version": "0-fake", "options": dict(self.config.options)}

    def close(self) -> None:
        self.closed = True

    def input_specs(self) -> tuple[TensorSpec, ...]:
        return (TensorSpec("x", np.dtype(np.float32), (None, 4)),)

    def output_specs(self) -> tuple[TensorSpec, ...]:
        return (TensorSpec("y", np.dtype(np.float32), (None, 1)),)

    def warmup(self, inputs: Arrays, iterations: int) -> None:
        for _ in range(iterations):
            self.infer(inputs)

    def infer(self, inputs: Arrays) -> dict[str, Any]:
        if self.config.options.get("fail") == "infer":
            raise RuntimeError("fake engine told to fail")
        x = inputs["x"]
        return {"y": x.sum(axis=1, keepdims=True)}


class FakeUnavailableEngine(FakeTensorEngine):
    name: ClassVar[str] = "fake-unavailable"
    available: ClassVar[Availability] = Availability(
        False, "fake-unavailable needs hardware this test lacks"
    )


class FakeGenerativeEngine(FakeTensorEngine):
    name: ClassVar[str] = "fake-generative"
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.GENERATIVE, devices=frozenset({"cpu"}), streaming=True
    )
