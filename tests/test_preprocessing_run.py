"""The preprocessing workload for real (quick profile, a small ``--images`` folder) on
ONNX Runtime, checked by content: stage times, images/s, CPU use, end-to-end figures and
parity per backend, flags where parity breaks, DALI cells ok where DALI is installed and
skipped with the reason where it is not or where there is no GPU."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from harness.results.records import CellRecord, Status
from harness.session.outcome import RunExit
from tests.support.imagefiles import write_small_corpus
from tests.support.once import once
from tests.support.runner import run_workloads
from workloads.lib import models

pytestmark = pytest.mark.slow

pytest.importorskip("onnxruntime")
pytest.importorskip("PIL")
pytest.importorskip("cv2")


def _installed(module: str) -> bool:
    try:  # find_spec of a dotted name raises when the parent package is absent
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


HAVE_DALI = _installed("nvidia.dali")
CPU_BACKENDS = ("pil", "opencv", *(("dali-cpu",) if HAVE_DALI else ()))


@pytest.fixture(scope="module")
def run(request: pytest.FixtureRequest) -> tuple[Path, dict[str, CellRecord], str]:
    return once(request, _run)


def _run(tmp: Path) -> tuple[Path, dict[str, CellRecord], str]:
    folder = write_small_corpus(tmp / "images")
    result = run_workloads(
        tmp,
        "--engine=onnxruntime",
        "--profile=quick",
        "--window=1.2",
        f"--images={folder}",
        "-k",
        "test_preprocessing.py",
    )
    assert result.returncode == 0, result.stdout[-4000:]
    return result.run_dir, result.records, result.stdout


def cells(records: dict[str, CellRecord], workload: str, backend: str) -> list[CellRecord]:
    return [
        r for r in records.values() if r.workload == workload and r.params["backend"] == backend
    ]


def test_the_grid_is_planned_and_every_available_backend_is_ok(run):
    _, records, _ = run
    assert len(records) == 16 + 8  # 4 backends x 2 batches x 2 threads; 4 x 2 modes
    for backend in CPU_BACKENDS:
        for rec in cells(records, "preprocessing", backend) + cells(
            records, "preprocessing_e2e", backend
        ):
            assert rec.status is Status.OK, (rec.cell_id, rec.reasons)
    for rec in cells(records, "preprocessing", "dali-gpu"):
        assert rec.status is Status.SKIPPED
        reason = rec.reasons[0]
        assert "dali-gpu needs an NVIDIA GPU" in reason or "nvidia.dali is not installed" in reason
    if not HAVE_DALI:
        for rec in cells(records, "preprocessing", "dali-cpu"):
            assert rec.status is Status.SKIPPED
            assert "pip install nvidia-dali-cuda120" in rec.reasons[0]


def test_preprocessing_cells_carry_stage_times_throughput_cpu_and_parity(run):
    _, records, _ = run
    for backend in CPU_BACKENDS:
        for rec in cells(records, "preprocessing", backend):
            m = rec.metrics
            stages = m["stage_times"]
            assert set(stages) == {"decode", "resize", "normalize"}
            assert all(s["per_image_s"] > 0 for s in stages.values())
            assert sum(s["share"] for s in stages.values()) == pytest.approx(1.0)
            tput = m["throughput"]
            assert tput["images"] == tput["batches"] * rec.params["batch"]
            assert tput["images_per_s"] == pytest.approx(tput["images"] / rec.window["duration_s"])
            assert tput["batches"] >= 100  # the quick profile's sample minimum
            assert m["latency"]["count"] == tput["batches"]
            assert 0 < m["cpu"]["cores_busy"] <= m["cpu"]["cores_available"] + 0.2
            assert m["parity"]["images"] == 12
            assert m["corpus"]["images"] == 12
            assert m["corpus"]["formats"] == {"jpg": 8, "png": 4}
            assert rec.engine_info["preprocessing"]["backend"] == backend
            assert rec.engine_info["preprocessing"]["threads"] == rec.params["threads"]


def test_the_reference_agrees_with_itself_and_others_are_measured(run):
    _, records, _ = run
    for rec in cells(records, "preprocessing", "pil"):
        assert rec.metrics["parity"]["max_abs"] == 0.0
        assert rec.metrics["parity"]["within_tolerance"] is True
    for rec in cells(records, "preprocessing", "opencv"):
        assert rec.metrics["parity"]["mean_abs"] > 0.0  # a different filter: never identical
    for rec in cells(records, "preprocessing", "dali-cpu") if HAVE_DALI else ():
        assert rec.metrics["parity"]["within_tolerance"] is True, rec.metrics["parity"]


def test_e2e_cells_split_latency_and_check_top1(run):
    _, records, _ = run
    for backend in CPU_BACKENDS:
        for rec in cells(records, "preprocessing_e2e", backend):
            m = rec.metrics
            expected = {"preprocess", "infer", "postprocess"}
            if rec.params["mode"] == "pipelined":
                expected.add("queue")
            assert set(m["stages"]) == expected
            assert 0 < m["time_account"]["infer"]["share"] < 1
            assert 0.0 <= m["parity"]["top1_agreement"] <= 1.0
            flips = m["parity"]["top1_flips"]
            assert len(flips) == round((1 - m["parity"]["top1_agreement"]) * 12)
            assert m["throughput"]["images_per_s"] > 0
            assert m["mode"]["name"] == rec.params["mode"]
            assert rec.engine_info["embedded_model"]["name"] == "tiny-cnn"
    for rec in cells(records, "preprocessing_e2e", "pil"):
        assert rec.metrics["parity"]["top1_agreement"] == 1.0


def test_a_parity_breach_is_a_warning_in_the_record_and_the_matrix(run):
    run_dir, records, _ = run
    matrix = (run_dir / "matrix.md").read_text()
    for rec in records.values():
        if rec.status is not Status.OK:
            continue
        parity = rec.metrics["parity"]
        flagged = [w for w in rec.validity.warnings if w.startswith("parity vs pil:")]
        assert bool(flagged) == (not parity["within_tolerance"])
        assert [w.removeprefix("parity vs pil: ") for w in flagged] == parity["breaches"]
        if flagged:
            assert f"`{rec.cell_id}`: parity vs pil" in matrix


def test_a_model_without_an_image_input_skips_saying_why(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "encoder.onnx"
    shutil.copy(models.embedded("tiny-encoder").path, model)
    result = run_workloads(
        tmp_path,
        f"--model={model}",
        f"--images={write_small_corpus(tmp_path / 'images', count=2)}",
        "-k",
        "test_preprocessing.py and e2e and pil",
    )
    # every cell skipped: nothing measured is not a pass (exit 12)
    assert result.returncode == RunExit.NOTHING_MEASURED, result.stdout[-3000:]
    assert len(result.records) == 2  # serial, pipelined
    for rec in result.records.values():
        assert rec.status is Status.SKIPPED
        assert rec.reasons[0].startswith("preprocessing needs one float32 [N, 3, H, W] image input")
        assert "input_ids" in rec.reasons[0]
