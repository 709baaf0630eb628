"""The energy of a cell's measured window, from the GPU power its telemetry recorded.

Each GPU's joules over the window are taken from its total-energy counter where NVML
offers one (Volta and later: millijoules since the driver loaded, read at every telemetry
sample; recent drivers also average the power reading over about a second, which the
counter does not need), else from its power readings by the trapezoidal rule. Either way
the series is read as piecewise linear between samples and cut at the window's edges,
so the warm-up before the window and the teardown after it are not counted. Every GPU
NVML sees is summed (idle ones draw power the machine's owner pays for too); ``gpus``
keeps each one.

The result is a measurement or ``{"absent": why}``: no NVML, no power series, a workload
that did not say where its window lies on the telemetry's clock, a window the series does
not cover, or fewer than ``MIN_SAMPLES`` readings inside it. It is never an estimate from
a nameplate wattage or a utilisation.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

MIN_SAMPLES = 2
"""Power readings a window must contain: with fewer, its joules would be the edges'
interpolation, not a measurement."""

J_PER_KWH = 3.6e6

Source = Literal["counter", "power"]
Per = Literal["output token", "request"]
UNIT_KEYS: dict[str, str] = {"output token": "per_output_token_j", "request": "per_request_j"}
"""The key of each unit's figure in ``metrics.energy``."""


@dataclass(frozen=True)
class Energy:
    """The joules of one window and, where the cell counted them, the ``count`` of output
    tokens (generative) or completed requests (tensor) they bought."""

    joules: float
    source: Source
    gpus: dict[str, float]
    samples: int
    """The fewest power readings any GPU had inside the window."""
    interval_s: float
    window_s: float
    per: Per | None = None
    count: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.joules) and self.joules >= 0 and self.window_s > 0):
            raise ValueError("energy is finite and >= 0, over a window of positive length")
        if (self.per is None) != (self.count is None) or (self.count or 0) < 0:
            raise ValueError("a unit comes with its count, >= 0")

    @property
    def mean_power_w(self) -> float:
        return self.joules / self.window_s

    @property
    def per_unit_j(self) -> float | None:
        """Joules per ``per``; None where nothing was counted (no unit, or a count of 0)."""
        return self.joules / self.count if self.count else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "joules": round(self.joules, 6),
            "source": self.source,
            "gpus": {k: round(v, 6) for k, v in self.gpus.items()},
            "samples": self.samples,
            "interval_s": self.interval_s,
            "window_s": round(self.window_s, 6),
            "mean_power_w": round(self.mean_power_w, 6),
        }
        if self.per is not None:
            # a count of 0 leaves the figure None, beside the count that says why
            out[UNIT_KEYS[self.per]] = self.per_unit_j
            out["count"] = self.count
        return out


def integrate(t: Sequence[float], y: Sequence[float], lo: float, hi: float) -> float:
    """The integral over [lo, hi] of the piecewise-linear ``y(t)``: the trapezoidal rule
    on the samples inside, with the edges interpolated. ``t`` must cover [lo, hi]."""
    ts, ys = np.asarray(t, dtype=np.float64), np.asarray(y, dtype=np.float64)
    inside = (ts > lo) & (ts < hi)
    knots = np.concatenate(([lo], ts[inside], [hi]))
    values = np.concatenate(([np.interp(lo, ts, ys)], ys[inside], [np.interp(hi, ts, ys)]))
    return float(np.sum((values[1:] + values[:-1]) * np.diff(knots)) / 2.0)


def _numbers(values: Any, n: int) -> bool:
    """``values`` is a list of ``n`` finite numbers (a record read back may hold anything)."""
    return (
        isinstance(values, list)
        and len(values) == n
        and all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            for v in values
        )
    )


def _counter_joules(t: Sequence[float], mj: Any, lo: float, hi: float) -> float | None:
    """The counter's rise over [lo, hi] in joules; None where there is no counter series,
    or it ever went down (the driver reloaded)."""
    if not _numbers(mj, len(t)) or any(b < a for a, b in itertools.pairwise(mj)):
        return None
    return float(np.interp(hi, t, mj) - np.interp(lo, t, mj)) / 1000.0


@dataclass(frozen=True)
class _Device:
    counter_j: float | None
    power_j: float
    inside: int


def _device(index: str, device: Any, lo: float, hi: float) -> _Device | str:
    """One GPU's joules over [lo, hi] by either source and its readings inside, or why
    its series cannot give them."""
    series = device.get("series") if isinstance(device, Mapping) else None
    if not isinstance(series, Mapping) or not isinstance(series.get("t"), list):
        return f"GPU {index} recorded no power series with its sample times"
    t: list[float] = series["t"]
    power: Any = series.get("power_w")
    if not t or not _numbers(t, len(t)) or not _numbers(power, len(t)):
        return f"GPU {index} recorded no power series with its sample times"
    if t[0] > lo or t[-1] < hi:
        return (
            f"GPU {index}'s power series ({t[0]:g} to {t[-1]:g} s) does not cover the measured"
            f" window ({lo:g} to {hi:g} s on the telemetry clock)"
        )
    return _Device(
        counter_j=_counter_joules(t, series.get("energy_mj"), lo, hi),
        power_j=integrate(t, power, lo, hi),
        inside=sum(lo <= x <= hi for x in t),
    )


def _gpu_part(telemetry: Mapping[str, Any]) -> Mapping[str, Any] | str:
    gpu = telemetry.get("gpu")
    if not isinstance(gpu, Mapping):
        return "no telemetry was recorded for this cell"
    if "absent" in gpu:
        return f"no GPU power reading: {gpu['absent']}"
    return gpu if gpu else "NVML gave no GPU reading during the cell"


def measure(telemetry: Mapping[str, Any], window: tuple[float, float] | None) -> Energy | str:
    """The joules of ``window`` (its first and last instant in seconds on the telemetry's
    clock, as its series' ``t``), with no unit; or why there are none."""
    gpu = _gpu_part(telemetry)
    if isinstance(gpu, str):
        return gpu
    if window is None:
        return "the workload did not place its measured window on the telemetry clock"
    lo, hi = window
    if not hi > lo:
        return "the measured window is empty"
    found: dict[str, _Device] = {}
    for index, device in gpu.items():
        got = _device(str(index), device, lo, hi)
        if isinstance(got, str):
            return got
        found[str(index)] = got
    interval = float(telemetry.get("interval_s", 0.0))
    fewest = min(d.inside for d in found.values())
    if fewest < MIN_SAMPLES:
        return (
            f"{fewest} power reading(s) inside the {hi - lo:.3g} s window (one every"
            f" {interval:g} s); energy needs at least {MIN_SAMPLES}"
        )
    # one source for the whole cell: a sum of counter and trapezoid joules would be neither
    counter = all(d.counter_j is not None for d in found.values())
    per_gpu = {
        i: (d.counter_j if d.counter_j is not None and counter else d.power_j)
        for i, d in found.items()
    }
    return Energy(
        joules=sum(per_gpu.values()),
        source="counter" if counter else "power",
        gpus=per_gpu,
        samples=fewest,
        interval_s=interval,
        window_s=hi - lo,
    )


def _count(metrics: Mapping[str, Any], section: str, key: str) -> int | None:
    node = metrics.get(section)
    value = node.get(key) if isinstance(node, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def per_unit(energy: Energy, metrics: Mapping[str, Any]) -> Energy:
    """``energy`` counted against the output tokens of a cell that counts them
    (generative), else against its completed requests (tensor)."""
    tokens = _count(metrics, "tokens", "output")
    if tokens is not None:
        return dataclasses.replace(energy, per="output token", count=tokens)
    done = _count(metrics, "requests", "ok")
    if done is not None:
        return dataclasses.replace(energy, per="request", count=done)
    return energy


def of_cell(
    telemetry: Mapping[str, Any],
    metrics: Mapping[str, Any],
    span: tuple[float, float] | None,
    origin: float | None,
) -> dict[str, Any]:
    """``metrics.energy`` of a record: ``span`` the measured window on ``time.perf_counter``
    (harness.metrics.validity.Evidence.span), ``origin`` the perf_counter reading the
    telemetry's ``t`` counts from."""
    window = None if span is None or origin is None else (span[0] - origin, span[1] - origin)
    found = measure(telemetry, window)
    if isinstance(found, str):
        return {"absent": found}
    return per_unit(found, metrics).to_json()
