"""The preprocessing measurement loops (windows, bounded pipelining) and the parity
verdict, against a fake backend that records what it was asked to do."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from workloads.lib.pipeline import (
    Corpus,
    Limits,
    Tolerance,
    compare,
    pipelined,
    preprocess_only,
    run_over,
    serial,
    stage_pass,
)
from workloads.lib.preprocess import Transform

CORPUS = Corpus(("a.jpg", "b.png", "c.jpeg"), (b"A", b"B", b"C"), "test")


class FakeBackend:
    """A harness-test fake: each image becomes a batch row filled with its first byte."""

    name = "fake"
    transform = Transform(shorter=8, crop=4)

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[list[bytes]] = []
        self.fail_at = fail_at
        self.lock = threading.Lock()

    def run(self, images: Any) -> tuple[np.ndarray, dict[str, float]]:
        with self.lock:
            if self.fail_at is not None and len(self.calls) == self.fail_at:
                raise RuntimeError("decoder exploded")
            self.calls.append(list(images))
        out = np.stack([np.full((3, 4, 4), float(d[0]), np.float32) for d in images])
        return out, {"decode": 1e-3, "resize": 2e-3, "normalize": 3e-3}

    def staged(self, images: Any) -> tuple[np.ndarray, dict[str, float]]:
        return self.run(images)

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name}

    def close(self) -> None:
        pass


def test_batches_go_round_robin_and_chunks_cover_the_corpus_once():
    assert CORPUS.batch(0, 2) == [b"A", b"B"]
    assert CORPUS.batch(1, 2) == [b"C", b"A"]
    assert [c for _, c in CORPUS.chunks(2)] == [[b"A", b"B"], [b"C"]]
    assert CORPUS.describe() == {
        "source": "test",
        "images": 3,
        "formats": {"jpg": 2, "png": 1},
        "bytes": 3,
    }
    with pytest.raises(ValueError, match="at least one image"):
        Corpus((), (), "empty")


def test_a_window_needs_its_duration_and_its_batches_unless_the_budget_ends():
    limits = Limits(window_s=1.0, min_batches=10, budget_s=5.0)
    assert not limits.done(10, 0.5)  # batches, not time
    assert not limits.done(3, 2.0)  # time, not batches
    assert limits.done(10, 1.0)
    assert limits.done(3, 5.0)  # out of budget: a short window


def test_preprocess_only_runs_full_batches_back_to_back():
    backend = FakeBackend()
    window = preprocess_only(backend, CORPUS, 2, Limits(0.0, 5, 60.0))
    assert len(window.latency) == 5
    assert window.images == 10
    assert backend.calls[:2] == [[b"A", b"B"], [b"C", b"A"]]
    assert window.spans["resize"] == [2e-3] * 5
    cpu = window.cpu()
    assert cpu["cores_available"] >= 1
    assert cpu["utilization"] == pytest.approx(cpu["cores_busy"] / cpu["cores_available"])


def test_stage_pass_warms_up_then_covers_the_corpus_twice():
    backend = FakeBackend()
    window = stage_pass(backend, CORPUS, 1)
    assert len(backend.calls) == 3 + 6
    assert len(window.latency) == 6
    assert sum(window.spans["decode"]) == pytest.approx(6e-3)


def test_serial_spans_split_each_batch():
    def classify(batch: np.ndarray) -> np.ndarray:
        return batch.reshape(len(batch), -1)

    window = serial(FakeBackend(), classify, CORPUS, 3, Limits(0.0, 4, 60.0))
    assert set(window.spans) == {"preprocess", "infer", "postprocess"}
    for i, latency in enumerate(window.latency):
        parts = sum(window.spans[k][i] for k in window.spans)
        assert latency == pytest.approx(parts, abs=1e-4)


def test_pipelining_keeps_the_producer_at_most_depth_batches_ahead():
    backend = FakeBackend()
    ahead: list[int] = []

    def classify(batch: np.ndarray) -> np.ndarray:
        consumed = len(ahead) + 1
        time.sleep(0.005)  # the engine is the slow stage: the queue fills
        ahead.append(len(backend.calls) - consumed)
        return batch.reshape(len(batch), -1)

    window = pipelined(backend, classify, CORPUS, 2, Limits(0.0, 20, 60.0), depth=2)
    assert len(window.latency) == 20
    # the queue's two + one made and waiting to be put; the producer then blocks
    assert max(ahead) <= 2 + 1
    assert max(ahead) >= 2  # and it did run ahead
    waits = window.spans["queue"][5:]
    assert np.median(waits) > 0.004  # a queued batch waited about one inference
    for i, latency in enumerate(window.latency):
        assert latency >= window.spans["queue"][i] + window.spans["infer"][i]


def test_a_producer_failure_reaches_the_caller():
    def classify(batch: np.ndarray) -> np.ndarray:
        return batch.reshape(len(batch), -1)

    with pytest.raises(RuntimeError, match="decoder exploded"):
        pipelined(FakeBackend(fail_at=3), classify, CORPUS, 1, Limits(0.0, 50, 60.0))


def test_run_over_keeps_corpus_order():
    out = run_over(FakeBackend(), CORPUS, 2)
    assert out[:, 0, 0, 0].tolist() == [ord("A"), ord("B"), ord("C")]


def _logits(batch: np.ndarray) -> np.ndarray:
    """Two classes: class 1 wins when the row's value is above 10."""
    v = batch.reshape(len(batch), -1)[:, 0]
    return np.stack([np.full_like(v, 10.0), v], axis=1)


def test_parity_within_tolerance_is_said_so():
    ref = (
        np.zeros((4, 3, 2, 2), np.float32)
        + np.array([0, 5, 20, 30], np.float32)[:, None, None, None]
    )
    found = compare(ref + 0.005, ref, ["a", "b", "c", "d"], _logits, Tolerance())
    assert found["within_tolerance"] is True
    assert found["breaches"] == []
    assert found["top1_agreement"] == 1.0
    assert found["top1_flips"] == []
    assert found["max_abs"] == pytest.approx(0.005, rel=1e-3)


def test_a_backend_that_changes_answers_is_flagged_with_the_images():
    ref = (
        np.zeros((4, 3, 2, 2), np.float32)
        + np.array([0, 9.9, 20, 30], np.float32)[:, None, None, None]
    )
    out = ref.copy()
    out[1] += 0.2  # 9.9 -> 10.1: crosses the decision boundary
    found = compare(out, ref, ["a", "b", "c", "d"], _logits, Tolerance())
    assert found["within_tolerance"] is False
    assert found["top1_agreement"] == 0.75
    (flip,) = found["top1_flips"]
    assert flip["image"] == "b"
    assert (flip["reference_class"], flip["class"]) == (0, 1)
    assert flip["reference_margin"] == pytest.approx(0.1, abs=1e-5)
    assert found["breaches"] == [
        "max abs diff 0.2 > 0.1",
        "mean abs diff 0.05 > 0.01",
        "top-1 agreement 75.0% < 99% (1 of 4 images change class)",
    ]
    assert found["tolerance"] == {"max_abs": 0.1, "mean_abs": 0.01, "top1_agreement": 0.99}


def test_parity_without_a_classifier_judges_pixels_only():
    ref = np.zeros((2, 3, 2, 2), np.float32)
    found = compare(ref + 0.5, ref, ["a", "b"], None, Tolerance())
    assert "top1_agreement" not in found
    assert found["breaches"] == ["max abs diff 0.5 > 0.1", "mean abs diff 0.5 > 0.01"]
