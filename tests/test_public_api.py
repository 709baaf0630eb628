"""``harness.api`` is the public API and docs/api.md documents it, both ways: every name
in ``__all__`` has an entry, every entry names an exported name, and nothing reaches a
workload from ``harness.api`` that ``__all__`` leaves out (an import there is export)."""

from __future__ import annotations

import inspect
import re
import types
from pathlib import Path

import numpy as np
import pytest

from harness import api
from harness.load.livecounters import LIVE

DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"
# an entry: a list item that starts with the name in backquotes, "- `Cell`: ..."
ENTRY = re.compile(r"^- `([A-Za-z_][A-Za-z0-9_]*)`", re.M)
# module-level names an import brings for the module itself, not for its users
NOT_EXPORTS = {"annotations"}


def documented() -> list[str]:
    return ENTRY.findall(DOC.read_text())


def importable() -> set[str]:
    """What ``from harness.api import X`` finds at module level, less dunders and the
    modules and future-features imported for typing (exported modules are in ``__all__``)."""
    names = set()
    for name, value in vars(api).items():
        if name.startswith("__") or name in NOT_EXPORTS:
            continue
        if isinstance(value, types.ModuleType) and name not in api.__all__:
            continue
        names.add(name)
    return names


def test_every_exported_name_is_documented():
    assert sorted(set(api.__all__) - set(documented())) == []


def test_every_documented_name_is_exported():
    assert sorted(set(documented()) - set(api.__all__)) == []


def test_each_name_is_documented_once_and_exported_once():
    entries = documented()
    assert sorted({n for n in entries if entries.count(n) > 1}) == []
    assert sorted({n for n in api.__all__ if api.__all__.count(n) > 1}) == []


def test_nothing_is_importable_from_the_api_that_all_leaves_out():
    assert sorted(importable() - set(api.__all__)) == []


def test_every_exported_name_exists():
    assert [n for n in api.__all__ if not hasattr(api, n)] == []


def test_the_checks_see_a_stray_name(monkeypatch):
    monkeypatch.setattr(api, "gc_paused", lambda: None, raising=False)
    assert "gc_paused" in importable() - set(api.__all__)
    monkeypatch.setattr(api, "stats_module", inspect, raising=False)  # a module: typing use
    assert "stats_module" not in importable()


def test_the_api_stays_about_a_page():
    """The door a workload author reads, not the harness's inventory (it held ~120 names)."""
    assert len(api.__all__) <= 60


def test_a_workloads_own_loop_counts_on_the_live_progress_line():
    """``counting``: what the built-in load generators do, for a loop of the workload's
    own, whose progress line would otherwise say "no requests counted"."""
    try:
        with api.counting(planned_s=2.0) as progress:
            progress.sent += 2
            progress.completed += 1
            progress.failed += 1
            during = LIVE.snapshot()
        after = LIVE.snapshot()
    finally:
        LIVE.reset()
    assert (during.sent, during.completed, during.failed) == (2, 1, 1)
    assert (during.planned_s, during.ended) == (2.0, False)
    assert after.ended


def test_synthetic_inputs_follow_the_specs_and_name_a_missing_dim():
    specs = (
        api.TensorSpec("ids", np.dtype(np.int64), (None, "sequence")),
        api.TensorSpec("attention_mask", np.dtype(np.int64), (None, "sequence")),
        api.TensorSpec("x", np.dtype(np.float32), (None, 3)),
    )
    made = api.synthetic_inputs(specs, {"sequence": 5}, np.random.default_rng(1), batch=2)
    assert {k: (v.shape, v.dtype) for k, v in made.items()} == {
        "ids": ((2, 5), np.int64),
        "attention_mask": ((2, 5), np.int64),
        "x": ((2, 3), np.float32),
    }
    assert (made["attention_mask"] == 1).all()
    again = api.synthetic_inputs(specs, {"sequence": 5}, np.random.default_rng(1), batch=2)
    assert all((made[k] == again[k]).all() for k in made)  # seeded
    with pytest.raises(ValueError, match="pass --dim sequence=SIZE"):
        api.synthetic_inputs(specs, {}, np.random.default_rng(1))
