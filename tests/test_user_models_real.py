"""Real models nobody here wrote (issue 16, item 18): ONNX's own ImageNet test models,
shipped in the onnx wheel (opset 9, input fixed at [1, 3, 224, 224], weights listed as
graph inputs and computed by ConstantOfShape nodes). A cell the model cannot serve is
skipped saying why; ``--dynamic-batch`` serves a rewritten copy and says so in every
record; int8 quantization prepares such a model instead of failing on it."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from harness.results.records import Status
from tests.support.imagefiles import write_small_corpus
from tests.support.runner import run_workloads

pytestmark = pytest.mark.slow

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
FIXED = "the model's batch dimension is fixed at 1 (data_0 [1, 3, 224, 224])"
MEASURED = (Status.OK, Status.INVALID)  # invalid: a busy shared machine, still measured


@pytest.fixture
def squeezenet(tmp_path):
    path = tmp_path / "user" / "squeezenet.onnx"
    path.parent.mkdir()
    shutil.copy(LIGHT / "light_squeezenet.onnx", path)
    return path


def test_cells_a_fixed_batch_model_cannot_serve_are_skipped_saying_why(tmp_path, squeezenet):
    run = run_workloads(
        tmp_path,
        f"--model={squeezenet}",
        f"--images={write_small_corpus(tmp_path / 'images', count=4)}",
        "--window=2",
        "-k",
        "rate100 or (test_shapes and user-model) or user-model-int8 or (e2e and pil-b8-serial)"
        " or dynamic-b8-2ms",
    )
    records = run.records
    assert len(records) == 9, sorted(records)
    assert not [r for r in records.values() if r.status is Status.FAILED], {
        c: r.reasons for c, r in records.items()
    }
    batching = [r for r in records.values() if r.workload in ("batching", "capacity")]
    for rec in batching:
        if rec.params.get("mode") == "none":
            assert rec.status in MEASURED, rec.reasons
            continue
        assert rec.status is Status.SKIPPED, (rec.cell_id, rec.reasons)
        assert rec.reasons[0] == (
            f"{FIXED}; this cell sends batches of 1 to 8; --dynamic-batch serves a copy of it"
            " whose batch dimension is dynamic"
        )
    [e2e] = [r for r in records.values() if r.workload == "preprocessing_e2e"]
    assert e2e.status is Status.SKIPPED
    assert e2e.reasons[0].startswith(f"{FIXED}; this cell sends batches of 4 and 8;")
    for rec in (r for r in records.values() if r.workload == "shapes"):
        assert rec.status is Status.SKIPPED
        assert rec.reasons[0] == (
            "the model has no dynamic non-batch dims (data_0 [1, 3, 224, 224]): there are no"
            " shapes to vary"
        )
    [int8] = [r for r in records.values() if r.workload == "precision"]
    assert int8.status in MEASURED, int8.reasons
    assert int8.metrics["batch"] == 1  # the model's own batch
    assert int8.engine_info["effective"]["int8_prepared_for"] == [
        "52 initializers listed as graph inputs",
        "26 weights computed by nodes, e.g. conv1_w_0 (from ConstantOfShape)",
    ]
    assert int8.engine_info["user_model"]["path"] == str(squeezenet)


def test_dynamic_batch_serves_a_rewritten_copy_and_records_it(tmp_path, squeezenet):
    before = hashlib.sha256(squeezenet.read_bytes()).hexdigest()
    run = run_workloads(
        tmp_path,
        f"--model={squeezenet}",
        "--dynamic-batch",
        f"--images={write_small_corpus(tmp_path / 'images', count=4)}",
        "--window=2",
        "-k",
        "rate100-static or (e2e and pil-b8-serial)",
    )
    assert hashlib.sha256(squeezenet.read_bytes()).hexdigest() == before  # untouched
    assert len(run.records) == 2
    assert run.run_dir.joinpath("manifest.json").read_text().count('"dynamic_batch": true') == 1
    for rec in run.records.values():
        assert rec.status in MEASURED, (rec.cell_id, rec.reasons)
        user = rec.engine_info["user_model"]
        assert user["path"] == str(squeezenet)
        assert user["dynamic_batch"] == {
            "rewritten": ["data_0 dim 0: 1 -> batch", "softmaxout_1 dim 0: 1 -> batch"]
        }
        loaded = Path(user["loaded"])
        cache = Path(os.environ.get("HARNESS_CACHE_DIR") or tmp_path / "cache")  # run_workloads'
        assert loaded.parent == cache / "models" / "derived"
        assert rec.engine_info["model"]["path"] == str(loaded)
    [static] = [r for r in run.records.values() if r.workload == "batching"]
    assert static.metrics["batches"]["mean_size"] > 1


def test_a_model_that_hard_codes_its_batch_skips_batching_cells_saying_where(tmp_path):
    run = run_workloads(
        tmp_path,
        f"--model={LIGHT / 'light_resnet50.onnx'}",
        "--dynamic-batch",
        "--window=2",
        "-k",
        "rate100-static or rate100-dynamic",
    )
    assert len(run.records) == 2
    for rec in run.records.values():
        assert rec.status is Status.SKIPPED, rec.reasons
        reason = rec.reasons[0]
        assert "fixed at 1 (gpu_0/data_0 [1, 3, 224, 224])" in reason
        assert (
            "--dynamic-batch could not help: light_resnet50.onnx cannot take a batch other"
            " than 1: the graph hard-codes it (Reshape n173 to [1, 2048])"
        ) in reason
        assert "Traceback" not in reason
        assert rec.engine_info["user_model"]["dynamic_batch"]["refused"] in reason
