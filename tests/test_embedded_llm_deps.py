"""A generative cell that needs the embedded tiny LLM where torch, transformers or
tokenizers is missing is skipped, saying what to install (never a traceback)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from harness.session.pytestoptions import parse_settings
from workloads.lib import generative


def settings(**kw):
    base = dict(device="cpu", profile="quick", results_dir="results/runs", seed=0)
    return parse_settings(**(base | kw))


def test_missing_llm_libraries_skip_the_cell_saying_what_to_install(monkeypatch):
    found = importlib.util.find_spec("json")  # any spec: torch stands as installed

    def without_transformers(name, *args):
        return None if name in ("transformers", "tokenizers") else found

    monkeypatch.setattr(importlib.util, "find_spec", without_transformers)
    with pytest.raises(pytest.skip.Exception) as skipped:
        generative.model_dir(settings(engine=["null-gen"]))
    assert str(skipped.value) == (
        "the embedded tiny LLM needs transformers and tokenizers, which are not installed:"
        " pip install -e '.[llm]', or give --model DIR"
    )


@pytest.mark.parametrize(
    ("missing", "said"),
    [
        (["torch"], "needs torch, which is not installed"),
        (
            ["torch", "transformers", "tokenizers"],
            "needs torch, transformers and tokenizers, which are",
        ),
    ],
)
def test_the_skip_names_only_what_is_missing(monkeypatch, missing, said):
    found = importlib.util.find_spec("json")
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in missing else found)
    with pytest.raises(pytest.skip.Exception) as skipped:
        generative.model_dir(settings(engine=["null-gen"]))
    assert str(skipped.value).startswith(f"the embedded tiny LLM {said}")
    assert "built with" not in str(skipped.value)


def test_a_given_model_needs_none_of_them(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    given = settings(engine=["null-gen"], model=str(tmp_path))
    assert generative.model_dir(given) == given.model
