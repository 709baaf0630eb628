"""A third-party engine package runs the conformance suite by importing it, and the suite
fails an engine that breaks the contract, naming what broke."""

from __future__ import annotations

ENGINE = '''
from typing import ClassVar
import numpy as np
from harness.engine import Availability, Capabilities, Family, TensorSpec, reject_unknown_options


class Doubler:
    name: ClassVar[str] = "doubler"
    capabilities: ClassVar[Capabilities] = Capabilities(Family.TENSOR, frozenset({"cpu"}))
    out_dtype = np.float32

    def __init__(self, config):
        self.config = config
        self.loaded = False

    @classmethod
    def probe(cls, device):
        return Availability(True) if device == "cpu" else Availability(False, "cpu only")

    @classmethod
    def validate_options(cls, options):
        reject_unknown_options(options, {"scale": "multiplier"})

    def load(self):
        self.loaded = True

    def describe(self):
        return {"engine": self.name, "version": "1.0", "device": self.config.device,
                "effective": {"scale": 2}}

    def close(self):
        self.loaded = False

    def input_specs(self):
        return (TensorSpec("x", np.dtype(np.float32), ("batch", 4)),)

    def output_specs(self):
        return (TensorSpec("y", np.dtype(self.out_dtype), ("batch", 4)),)

    def warmup(self, inputs, iterations):
        for _ in range(iterations):
            self.infer(inputs)

    def infer(self, inputs):
        x = inputs["x"]
        if set(inputs) != {"x"} or x.dtype != np.float32 or x.ndim != 2:
            raise ValueError("doubler takes x: float32 [batch, 4]")
        return {"y": (2 * x).astype(self.out_dtype)}


class Sloppy(Doubler):
    """Declares float32 but returns float64, and drops a row of the batch."""

    def infer(self, inputs):
        out = super().infer(inputs)["y"].astype(np.float64)
        return {"y": out[:-1] if len(out) > 1 else out}
'''

TESTS = """
from pathlib import Path
import pytest
from harness.engine.conformance import Subject, TensorConformance
from doubler import Doubler, Sloppy


class TestDoubler(TensorConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls):
        return Subject(Doubler, model=Path("unused"))


class TestSloppy(TensorConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls):
        return Subject(Sloppy, model=Path("unused"))
"""


def test_a_plugin_engine_passes_and_a_broken_one_fails_by_name(pytester):
    pytester.makepyfile(doubler=ENGINE, test_my_engine=TESTS)
    pytester.syspathinsert()
    result = pytester.runpytest("-p", "no:cacheprovider", "-q", "-rf")
    outcomes = result.parseoutcomes()
    failed = {
        line.split("::")[2].split(" ")[0]
        for line in result.outlines
        if line.startswith("FAILED") and "TestSloppy" in line
    }
    assert failed == {
        "test_outputs_match_the_declared_specs[1]",
        "test_outputs_match_the_declared_specs[3]",
    }
    assert not any(line.startswith("FAILED") and "TestDoubler" in line for line in result.outlines)
    assert outcomes["failed"] == 2
    assert outcomes["passed"] >= 2 * 9
