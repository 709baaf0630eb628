import subprocess
import sys

import pytest

from harness import cli
from harness.results import store
from tests.support.records_factory import manifest, record


def test_engines_lists_registered_engines_with_availability(capsys):
    assert cli.main(["engines"]) == 0
    out = capsys.readouterr().out
    assert "onnxruntime" in out
    assert "engines.onnxruntime:OnnxRuntimeEngine" in out
    assert "yes" in out


def test_engines_gives_the_reason_when_unavailable(capsys):
    cli.main(["engines", "--device", "cuda"])
    out = " ".join(capsys.readouterr().out.split())
    assert "no CUDAExecutionProvider" in out or "yes" in out


def test_report_writes_matrix_and_is_deterministic(tmp_path, capsys):
    run = store.new_run_dir(tmp_path)
    store.write_manifest(run, manifest([("c.e.x=1", "e", {"x": 1})], run_id=run.name))
    store.write_record(run, record("c.e.x=1", run_id=run.name, engine="e", params={"x": 1}))
    assert cli.main(["report", str(run), "--print"]) == 0
    first = (run / "matrix.md").read_bytes()
    assert b"| 1 | p50 2 ms |" in first
    assert cli.main(["report", str(run)]) == 0
    assert (run / "matrix.md").read_bytes() == first


def test_report_on_a_corrupt_run_fails_naming_the_file(tmp_path, capsys):
    run = store.new_run_dir(tmp_path)
    store.write_manifest(run, manifest([], run_id=run.name))
    (run / "cells" / "bad.json").write_text("{")
    assert cli.main(["report", str(run)]) == 2
    assert "bad.json: corrupt" in capsys.readouterr().out
    assert cli.main(["report", str(tmp_path / "nope")]) == 2


@pytest.mark.slow
def test_module_entry_point_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "engines"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0
    assert "onnxruntime" in proc.stdout


def test_engines_lists_every_builtin_with_a_reason_per_device(capsys):
    assert cli.main(["engines"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for name in ("onnxruntime", "torch", "vllm", "openai", "tensorrt", "tensorrt-llm", "lmdeploy"):
        assert f"│ {name} " in out
    # GPU-only engines say why on either device; pip extras survive rich's markup
    assert "no: tensorrt does not support device 'cpu'" in out
    assert "no: lmdeploy does not support device 'cpu'" in out
    if "inference-harness[torch]" not in out:
        assert "torch" in out  # torch installed here: it is available


def test_a_bare_source_tree_finds_the_builtin_engines(monkeypatch):
    from harness.engine import registry  # noqa: PLC0415

    monkeypatch.setattr(registry, "entry_points", lambda group: [])
    names = registry.names()
    assert {"onnxruntime", "torch", "tensorrt", "lmdeploy", "null"} <= set(names)
    assert registry.load("null").name == "null"


def test_an_engine_whose_cells_need_more_says_so_beside_yes(monkeypatch, capsys):
    """null-gen runs on a base install, but every cell of its workloads would skip for the
    embedded tiny LLM's libraries: the listing says so instead of a bare "yes"."""
    import importlib.util  # noqa: PLC0415

    from harness.engine import registry  # noqa: PLC0415

    real = importlib.util.find_spec
    # torch missing, transformers and tokenizers installed
    fake = {"torch": None, "transformers": real("json"), "tokenizers": real("json")}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: fake[name] if name in fake else real(name, *a)
    )
    shown = cli._availability(registry.status("null-gen", "cpu").availability)
    assert shown == (
        "yes, but needs \\[llm] or --model: its workloads' default model, the embedded tiny"
        " LLM, is built with torch (not installed: pip install -e '.\\[llm]')"
    )  # escaped for rich, which prints it as [llm]
    assert cli.main(["engines", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "yes, but needs [llm] or --model" in out
