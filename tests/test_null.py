"""The null engines: options are checked, outputs follow the batch, the stall fires once."""

from pathlib import Path

import numpy as np
import pytest

from engines.null import NullEngine
from harness.engine import EngineConfig, registry


def test_null_engines_are_registered_like_any_other():
    assert registry.load("null") is NullEngine
    assert registry.status("null-gen", "cpu").availability.available


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"service_time_s": "-1"}, "service_time_s must be >= 0"),
        ({"stall_at": "0"}, "stall_at must be an integer >= 1"),
        ({"speed": "1"}, "unknown option"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        NullEngine.validate_options(options)


def test_outputs_follow_the_batch_and_the_stall_counts_measured_calls_only():
    engine = NullEngine(EngineConfig(model=Path("-"), options={"stall_at": "2", "stall_s": "0"}))
    engine.load()
    engine.warmup({"x": np.zeros((1, 4), np.float32)}, 5)
    assert engine.calls == 0
    out = engine.infer({"x": np.zeros((3, 4), np.float32)})
    assert out["y"].shape == (3, 1)
    assert engine.describe()["stall"] == {"at": 2, "seconds": 0.0}
