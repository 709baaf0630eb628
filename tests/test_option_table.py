"""The option table (harness.session.optiontable) is the one place an option is declared:
pytest registers exactly its entries, ``RunSettings`` is filled from exactly them, and
docs/usage.md's option reference is exactly what it renders. After changing an option,
rewrite that reference with ``python -m harness.session.optiontable``."""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter
from typing import Any

import pytest

from harness.session import optiondecl
from harness.session.config import COMPOSED, RunSettings
from harness.session.optiondecl import INTERNAL, SECTIONS, markdown, rendered_block
from harness.session.optiontable import DERIVED, OPTIONS
from harness.session.pytestoptions import (
    OPTION_NAMES,
    SETTINGS_OPTIONS,
    VALUE_OPTIONS,
    build_settings,
    option_values,
    parse_settings,
)

pytest_plugins = ["pytester"]

FIELDS = {f.name for f in dataclasses.fields(RunSettings)}
FILLED = Counter(o.field for o in OPTIONS if o.field is not None)


def test_flags_and_dests_are_declared_once():
    assert [f for f, n in Counter(o.flag for o in OPTIONS).items() if n > 1] == []
    assert [d for d, n in Counter(o.name for o in OPTIONS).items() if n > 1] == []
    assert {o.flag for o in OPTIONS} == OPTION_NAMES


def test_every_option_is_registered_with_its_default(pytestconfig):
    given = " ".join(pytestconfig.invocation_params.args)
    for option in OPTIONS:
        value = pytestconfig.getoption(option.name)  # ValueError: not registered
        if option.flag not in given:
            assert value == option.default, option.flag


def test_help_lists_every_documented_option_and_hides_the_internal_ones(pytester):
    out = pytester.runpytest_inprocess("--help").stdout.str()
    group = out[out.index("inference benchmark harness:") :]
    for option in OPTIONS:
        shown = f"  {option.flag}" in group
        assert shown is (option.help != argparse.SUPPRESS), option.flag


def test_every_option_fills_a_settings_field_or_steers_the_session():
    assert set(FILLED) <= FIELDS, set(FILLED) - FIELDS
    internal = [o for o in OPTIONS if o.section == INTERNAL]
    assert all(o.field is None and o.help == argparse.SUPPRESS for o in internal)
    assert {o.section for o in OPTIONS} - {INTERNAL} <= set(SECTIONS)


def test_every_settings_field_is_filled_by_options_or_derived():
    assert set(FILLED) | DERIVED == FIELDS
    assert set(FILLED) & DERIVED == set()


def test_a_field_of_several_options_is_built_from_them():
    several = {field for field, n in FILLED.items() if n > 1}
    assert several <= set(COMPOSED), several - set(COMPOSED)
    assert set(COMPOSED) <= set(FILLED)


class Reads(dict[str, Any]):
    """Option values that remember which were read."""

    def __init__(self, values: dict[str, Any]) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)


def test_every_settings_options_value_reaches_the_settings():
    values = Reads(option_values({}))
    build_settings(values)
    assert values.read == {o.name for o in SETTINGS_OPTIONS}


def test_defaults_are_the_embedded_quick_run():
    settings = parse_settings()
    assert (settings.engines, settings.device, settings.seed) == (("onnxruntime",), "cpu", 0)
    assert settings.to_json() == parse_settings(engine=None, device="cpu").to_json()


def test_parse_settings_takes_only_the_options_that_fill_settings():
    with pytest.raises(TypeError, match="engines"):
        parse_settings(engines=["null"])
    with pytest.raises(TypeError, match="harness_progress"):
        parse_settings(harness_progress="off")


def test_value_options_are_those_that_take_a_value():
    assert {"--engine", "--results-dir", "--seed", "--harness-worker"} <= VALUE_OPTIONS
    assert "--dynamic-batch" not in VALUE_OPTIONS


def test_the_docs_option_reference_is_the_table():
    text = optiondecl.USAGE.read_text()
    assert rendered_block(text) == markdown(OPTIONS), (
        "docs/usage.md's option reference is stale: python -m harness.session.optiontable"
    )


def test_the_reference_is_rewritten_between_its_markers(tmp_path, monkeypatch):
    usage = tmp_path / "usage.md"
    usage.write_text("# Usage\n\n<!-- options:begin (note) -->\nold\n<!-- options:end -->\n\nend\n")
    monkeypatch.setattr(optiondecl, "USAGE", usage)
    assert "rewrote" in optiondecl.rewrite_usage(OPTIONS)
    text = usage.read_text()
    assert text.startswith("# Usage\n\n<!-- options:begin (note) -->\n### Engines and models\n")
    assert text.endswith("\n<!-- options:end -->\n\nend\n")
    assert rendered_block(text) == markdown(OPTIONS)
    assert "current" in optiondecl.rewrite_usage(OPTIONS)
    usage.write_text("no markers\n")
    with pytest.raises(ValueError, match="no <!-- options:begin"):
        optiondecl.rewrite_usage(OPTIONS)


def test_a_row_escapes_the_bars_of_its_metavar_and_text():
    early_stop = next(o for o in OPTIONS if o.flag == "--early-stop")
    assert early_stop.doc_row().startswith("| `--early-stop on\\|off` | ")
    dynamic = next(o for o in OPTIONS if o.flag == "--dynamic-batch")
    assert dynamic.doc_row().startswith("| `--dynamic-batch` | ")
    memory = next(o for o in OPTIONS if o.flag == "--worker-memory")
    assert "%%" not in memory.doc_row()
    assert all(o.doc_row().count("\n") == 1 for o in OPTIONS)
