"""`--model` runs a user's ONNX file through the same workloads (here: a copy of the encoder)."""

import shutil

import pytest

from harness.results.records import Status
from tests.support.runner import run_workloads
from workloads.lib import models

pytestmark = pytest.mark.slow

pytest.importorskip("onnxruntime")


@pytest.fixture
def user_model(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "gen"))
    path = tmp_path / "my-encoder.onnx"
    shutil.copy(models.embedded("tiny-encoder").path, path)
    return path


def test_user_model_runs_both_workloads(tmp_path, user_model):
    run = run_workloads(
        tmp_path,
        f"--model={user_model}",
        "--dim=sequence=64",
        "--window=1.5",
        "--requests=40",
        "-k",
        "rate100 or (test_shapes.py and user-model)",
    )
    assert run.returncode == 0, run.stdout[-3000:]
    statuses = {cid: r.status for cid, r in run.records.items()}
    assert len(statuses) == 6  # 3 batching modes at 100 req/s + 3 shape modes
    assert set(statuses.values()) == {Status.OK}, {c: r.reasons for c, r in run.records.items()}
    for rec in run.records.values():
        assert rec.engine_info["model"]["path"] == str(user_model)
        assert "embedded_model" not in rec.engine_info
    shapes = [r for r in run.records.values() if r.workload == "shapes"]
    assert {r.params["model"] for r in shapes} == {"user-model"}
    assert all(r.metrics["shapes"]["dims"] == {"sequence": 64} for r in shapes)


def test_user_model_without_dims_fails_saying_which_flag(tmp_path, user_model):
    run = run_workloads(tmp_path, f"--model={user_model}", "-k", "rate100-none or user-model-fixed")
    assert run.returncode == 1
    reasons = {r.workload: r.reasons[0] for r in run.records.values()}
    assert all(r.status is Status.FAILED for r in run.records.values())
    assert "pass --dim sequence=SIZE" in reasons["batching"]
    assert "--dim sequence=MAX" in reasons["shapes"]
