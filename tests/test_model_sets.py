"""``--model-set``: validated once, ``auto`` resolved by the device, recorded; every
workload's embedded model and the dimensions it is sized by go through one mapping; a
model built on first use says so on the user's terminal, also from a worker. Nothing
here builds a reference model (tests/test_refmodels.py does)."""

from __future__ import annotations

import pytest

from harness.engine import registry
from harness.exceptions import UsageError
from harness.results import store
from harness.results.records import Manifest
from harness.session import announce
from harness.session.config import ModelSet
from harness.session.pytestoptions import parse_settings
from harness.session.state import check_resumable
from tests.support.fakes import FakeTensorEngine
from tests.support.isolated import only_run_dir, write_project
from workloads import test_precision, test_shapes
from workloads.lib import generative, llm, modelset

pytest_plugins = ["pytester"]


def settings(**kw):
    base = dict(engine=["null"], device="cpu", profile="quick", results_dir="r", seed=0)
    return parse_settings(**(base | kw))


@pytest.mark.parametrize(
    ("device", "given", "resolved"),
    [
        ("cpu", "auto", ModelSet.TINY),
        ("cuda", "auto", ModelSet.REFERENCE),
        ("cuda:1", "auto", ModelSet.REFERENCE),
        ("cuda", "tiny", ModelSet.TINY),
        ("cpu", "reference", ModelSet.REFERENCE),
    ],
)
def test_auto_is_the_reference_set_on_cuda_and_the_tiny_one_elsewhere(device, given, resolved):
    chosen = settings(device=device, model_set=given)
    assert chosen.model_set is resolved
    assert chosen.to_json()["model_set"] == resolved.value


def test_a_bad_model_set_is_a_usage_error_naming_the_choices():
    with pytest.raises(UsageError) as bad:
        settings(model_set="huge")
    assert str(bad.value) == "--model-set 'huge': choose one of auto, tiny, reference"


def test_model_set_bogus_stops_the_run_with_one_line(pytester):
    result = pytester.runpytest("--model-set=bogus")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.strip()]
    assert errors == ["ERROR: --model-set 'bogus': choose one of auto, tiny, reference"]


def test_a_run_from_before_model_sets_resumes_as_the_tiny_set():
    now = settings()
    old = now.to_json()
    del old["model_set"]  # written before --model-set existed: the tiny models ran
    manifest = Manifest(run_id="r1", state="incomplete", created_at="t", settings=old)
    check_resumable(manifest, now)  # no usage error
    with pytest.raises(UsageError, match="model_set: was 'tiny', now 'reference'"):
        check_resumable(manifest, settings(model_set="reference"))


@pytest.mark.parametrize(
    ("name", "reference"),
    [
        ("tiny-cnn", "resnet50"),
        ("tiny-cnn-dynhw", "resnet50-dynhw"),
        ("tiny-encoder", "bert-base"),
        ("tiny-llama", "llama-1b"),
    ],
)
def test_one_mapping_names_each_sets_model(name, reference):
    assert modelset.chosen(name, ModelSet.TINY) == name
    assert modelset.chosen(name, ModelSet.REFERENCE) == reference
    # every tensor model of either set is known to the workloads' size table
    if name != "tiny-llama":
        assert {name, reference} <= set(modelset.SIZES)


def test_an_unknown_embedded_model_is_refused_by_name():
    with pytest.raises(KeyError, match="no embedded model 'tiny-rnn'"):
        modelset.chosen("tiny-rnn", ModelSet.REFERENCE)


def test_workload_dimensions_follow_the_model_set():
    tiny, ref = settings(), settings(model_set="reference")
    # the shapes workload: the encoder's whole position table, twice the CNN's side
    assert test_shapes.embedded_dims("tiny-encoder", tiny) == {"sequence": 256}
    assert test_shapes.embedded_dims("tiny-encoder", ref) == {"sequence": 512}
    assert test_shapes.embedded_dims("tiny-cnn-dynhw", tiny) == {"height": 128, "width": 128}
    assert test_shapes.embedded_dims("tiny-cnn-dynhw", ref) == {"height": 448, "width": 448}
    assert test_shapes.embedded_dims("user-model", ref) == {}
    # token ids span the encoder's vocabulary; a user's model gets the tiny one's 1000
    assert test_shapes.int_high("tiny-encoder", tiny) == 1000
    assert test_shapes.int_high("tiny-encoder", ref) == 30522
    assert test_shapes.int_high("user-model", ref) == 1000
    # the precision workload: the encoder at a quarter of its positions
    assert test_precision.embedded_dims("tiny-encoder", tiny) == {"sequence": 64}
    assert test_precision.embedded_dims("tiny-encoder", ref) == {"sequence": 128}
    assert test_precision.embedded_dims("tiny-cnn", ref) == {}


def test_the_reference_set_runs_the_1b_decoder(monkeypatch, tmp_path):
    built = []
    monkeypatch.setattr(llm, "missing_libraries", list)
    monkeypatch.setattr(llm, "embedded_llm", lambda seed, spec: built.append(spec) or tmp_path)
    assert generative.model_dir(settings(model_set="reference", seed=2)) == tmp_path
    assert generative.model_dir(settings()) == tmp_path
    assert [s.name for s in built] == ["llama-1b", "tiny-llama"]


def test_a_missing_library_names_the_1b_decoder(monkeypatch):
    monkeypatch.setattr(llm, "missing_libraries", lambda: ["torch"])
    with pytest.raises(pytest.skip.Exception) as skipped:
        generative.model_dir(settings(model_set="reference"))
    assert str(skipped.value).startswith("the embedded LLM llama-1b needs torch, which is not")


def test_the_1b_decoder_is_about_a_billion_parameters_of_llama_3_2_1b_layers():
    shape = llm.LLAMA_1B.shape
    assert (shape.hidden_size, shape.num_hidden_layers) == (2048, 16)
    assert (shape.num_attention_heads, shape.num_key_value_heads) == (32, 8)
    assert shape.intermediate_size == 8192
    assert shape.vocab_size == llm.TOKENIZER_VOCAB  # every row a token of the tokenizer
    assert llm.parameter_count(shape) == 977_340_416
    assert llm.LLAMA_1B.dtype == "bfloat16"
    # the tiny model is what it was: its cache key leaves out the fields added since
    assert llm.parameter_count(llm.TINY.shape) == 590_464
    assert llm.TINY.shape == llm.LlamaShape()


def test_an_announcement_outside_a_session_goes_to_stderr(capsys, monkeypatch):
    monkeypatch.setattr(announce, "_SAY", [])  # this test session installed its own
    announce.announce("built it")
    assert capsys.readouterr().err == "built it\n"


ANNOUNCING = """
import pytest
from harness.api import announce
from harness.metrics.validity import Evidence
from harness.results.records import Headline

@pytest.mark.requires(family="tensor")
def test_build(cell, open_engine, tmp_path):
    announce("embedded model demo built in 1.5 s: 2 MB")
    open_engine(tmp_path / "model")
    print("captured, not shown")
    cell.finish(
        metrics={"x": {"p50": 0.001}},
        evidence=Evidence(samples=100, failed=0, window_s=2.0),
        headline=[Headline(label="p50", metric="x.p50", unit="ms", scale=1e3)],
    )
"""


def _announced(result) -> list[str]:
    return [line for line in result.outlines if "embedded model demo" in line]


def test_a_cell_in_process_announces_on_the_terminal_through_capture(pytester):
    pytester.makepyfile(test_wl=ANNOUNCING)
    results = pytester.path / "r"
    with registry.registered("fake-tensor", FakeTensorEngine):
        result = pytester.runpytest(
            "--engine=fake-tensor",
            f"--results-dir={results}",
            "--isolation=none",
            "--model-set=reference",
        )
    result.assert_outcomes(passed=1)
    assert _announced(result) == ["embedded model demo built in 1.5 s: 2 MB"]
    assert "captured, not shown" not in result.stdout.str()
    assert store.read_manifest(only_run_dir(results)).settings["model_set"] == "reference"


@pytest.mark.slow  # a pytest subprocess and its worker
def test_a_cell_in_a_worker_announces_on_the_controllers_terminal(pytester):
    write_project(pytester.path, [])
    pytester.makepyfile(test_faults="", test_wl=ANNOUNCING)
    results = pytester.path / "r"
    result = pytester.runpytest_subprocess(
        "--engine=fake-tensor", f"--results-dir={results}", "--progress=plain"
    )
    result.assert_outcomes(passed=1)
    assert _announced(result) == ["embedded model demo built in 1.5 s: 2 MB"]
    (log,) = (only_run_dir(results) / "logs").glob("*.log")
    assert "embedded model demo" not in log.read_text()  # it went to the terminal instead
    assert store.read_manifest(only_run_dir(results)).settings["model_set"] == "tiny"
