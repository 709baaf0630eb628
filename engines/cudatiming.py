"""Device times of one ``infer`` from CUDA events, as the GPU tensor adapters report them
(``ReportsDeviceTimes``).

The tensorrt and torch adapters time a call the same way: an event before the
host-to-device copies, one before the compute, one before the copies back and one after
them, all on the stream doing the work. The three intervals between these four marks are
``DEVICE_STAGES`` (h2d, compute, d2h). Only the events differ (cuda-python handles in
tensorrt, ``torch.cuda.Event`` in torch), so this takes the elapsed-time call.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.engine import DEVICE_STAGES

MARKS = len(DEVICE_STAGES) + 1
"""Events per timed call: one before each stage and one after the last."""


def stage_times(elapsed_ms: Callable[[int, int], float]) -> dict[str, float]:
    """Seconds of each stage, from ``elapsed_ms(i, j)``: the milliseconds between marks
    ``i`` and ``j`` (CUDA events measure in milliseconds; the harness records seconds).
    Call it after the last mark has completed (a synchronized stream or event)."""
    return {stage: elapsed_ms(i, i + 1) / 1e3 for i, stage in enumerate(DEVICE_STAGES)}
