"""Resource use sampled while a cell runs: a time series and its summary, stored with it.

A daemon thread wakes every ``interval_s`` and reads, for this process and everything
it started (an engine core, a server): CPU time split into user and system, and
resident memory; for the machine: CPU utilisation. On NVIDIA GPUs it reads NVML:
utilisation, memory used, memory-bandwidth utilisation, power, temperature, SM clock,
and the clock-event (throttle) reasons, which become a validity warning; where the GPU
has one (Volta and later), its total-energy counter, from which harness.metrics.energy
takes a cell's joules. Each GPU reading keeps its own time (``t`` in the device's series),
since a reading that fails leaves a gap the host series does not have. Without NVML (a
CPU machine) the GPU part is recorded as absent, with the reason.

The thread does a few system calls per wake-up; at the default half second that is
well under 0.1 % of one core, on the cores the load generator also uses.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

INTERVAL_S = 0.5
# NVML clock-event reasons that mean the GPU ran slower than asked (not idle or app caps).
THROTTLE_BITS = {
    0x0000000000000004: "software power cap",
    0x0000000000000008: "hardware slowdown",
    0x0000000000000020: "software thermal slowdown",
    0x0000000000000040: "hardware thermal slowdown",
    0x0000000000000080: "hardware power brake",
}


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return [root]


def _host_sample(root: psutil.Process) -> dict[str, float]:
    user = system = rss = 0.0
    for proc in _tree(root):
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            user += times.user
            system += times.system
            rss += proc.memory_info().rss
    return {
        "cpu_user_s": user,
        "cpu_system_s": system,
        "rss_bytes": rss,
        "system_cpu_pct": psutil.cpu_percent(interval=None),
    }


class Nvml:
    """NVML through nvidia-ml-py, when there is a driver; ``absent`` says why not."""

    def __init__(self) -> None:
        self.absent: str | None = None
        self.handles: list[Any] = []
        try:
            import pynvml  # noqa: PLC0415  (optional: GPU machines only)

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.nv: Any = pynvml
        except ImportError:
            self.absent = "nvidia-ml-py is not installed"
        except Exception as exc:  # NVMLError: no driver, no GPU
            self.absent = f"NVML unavailable: {exc}"
        if self.absent is None and not self.handles:
            self.absent = "NVML found no GPU"
        self.energy_counter = self.absent is None and self._has_energy_counter()

    def _has_energy_counter(self) -> bool:
        """Every GPU has the counter, or none is read: one sample's keys hold for all."""
        try:
            for handle in self.handles:
                self.nv.nvmlDeviceGetTotalEnergyConsumption(handle)
        except Exception:  # NVMLError_NotSupported before Volta, or an old binding
            return False
        return True

    def sample(self) -> list[dict[str, float]]:
        nv = self.nv
        out = []
        for handle in self.handles:
            counter = (
                {"energy_mj": float(nv.nvmlDeviceGetTotalEnergyConsumption(handle))}
                if self.energy_counter
                else {}
            )
            util = nv.nvmlDeviceGetUtilizationRates(handle)
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
            out.append(
                {
                    "util_pct": float(util.gpu),
                    "mem_bw_util_pct": float(util.memory),
                    "mem_used_bytes": float(mem.used),
                    "power_w": nv.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                    "temp_c": float(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)),
                    "sm_clock_mhz": float(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM)),
                    "throttle_reasons": float(nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle)),
                }
                | counter
            )
        return out


@functools.cache
def shared_nvml() -> Nvml:
    """One NVML session per process: probing the driver once, not at every cell."""
    return Nvml()


@dataclass
class Series:
    t: list[float] = field(default_factory=list)
    host: list[dict[str, float]] = field(default_factory=list)
    gpu: list[list[dict[str, float]]] = field(default_factory=list)
    gpu_t: list[float] = field(default_factory=list)
    """The ``t`` of each entry of ``gpu``."""


class Telemetry:
    """``start()`` before the cell's work, ``stop()`` after; ``stop`` returns the record part."""

    def __init__(
        self,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.perf_counter,
        nvml: Nvml | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be > 0")
        self.interval_s = interval_s
        self.clock = clock
        self.nvml = nvml if nvml is not None else shared_nvml()
        self.series = Series()
        self._root = psutil.Process(os.getpid())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="harness-telemetry", daemon=True)
        self._t0 = 0.0
        self._result: dict[str, Any] | None = None

    @property
    def origin(self) -> float:
        """The clock reading the series' ``t`` counts from: perf_counter, like MonotonicClock,
        so a workload can place its requests on the telemetry timeline."""
        return self._t0

    def rss_series(self) -> tuple[list[float], list[float]]:
        """``(t, rss_bytes)`` sampled so far, for a workload that reports drift itself."""
        n = min(len(self.series.t), len(self.series.host))
        return list(self.series.t[:n]), [h["rss_bytes"] for h in self.series.host[:n]]

    def start(self) -> None:
        psutil.cpu_percent(interval=None)  # the first call only sets psutil's reference
        self._t0 = self.clock()
        self.sample()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        t = round(self.clock() - self._t0, 4)
        self.series.t.append(t)
        self.series.host.append(_host_sample(self._root))
        if self.nvml.absent is None:
            with contextlib.suppress(Exception):  # a GPU fallen off the bus must not kill the cell
                self.series.gpu.append(self.nvml.sample())
                self.series.gpu_t.append(t)

    def stop(self) -> dict[str, Any]:
        """Stop sampling (idempotent) and return the time series with its summary."""
        if self._result is None:
            self._stop.set()
            if self._thread.is_alive():
                self._thread.join(timeout=5.0)
            self.sample()
            self._result = summarize(self.series, self.interval_s, self.nvml.absent)
        return self._result


def _rates(series: Series, key: str) -> list[float]:
    """CPU seconds per wall second between samples, as % of one core."""
    out = []
    for i in range(1, len(series.t)):
        dt = series.t[i] - series.t[i - 1]
        used = series.host[i][key] - series.host[i - 1][key]
        out.append(round(100.0 * used / dt, 2) if dt > 0 else 0.0)
    return out


def summarize(series: Series, interval_s: float, gpu_absent: str | None) -> dict[str, Any]:
    rss = [h["rss_bytes"] for h in series.host]
    user, system = _rates(series, "cpu_user_s"), _rates(series, "cpu_system_s")
    summary: dict[str, Any] = {
        "rss_start_bytes": rss[0] if rss else None,
        "rss_end_bytes": rss[-1] if rss else None,
        "rss_max_bytes": max(rss) if rss else None,
        "rss_drift_bytes": rss[-1] - rss[0] if rss else None,
        "cpu_user_pct_mean": round(sum(user) / len(user), 2) if user else None,
        "cpu_system_pct_mean": round(sum(system) / len(system), 2) if system else None,
    }
    out: dict[str, Any] = {
        "interval_s": interval_s,
        "series": {
            "t": series.t,
            "rss_bytes": rss,
            "cpu_user_pct": user,
            "cpu_system_pct": system,
            "system_cpu_pct": [h["system_cpu_pct"] for h in series.host],
        },
        "summary": summary,
        "gpu": {"absent": gpu_absent} if gpu_absent else _gpu(series),
        "warnings": [] if gpu_absent else _throttled(series),
    }
    return out


# Series kept without a mean: a counter since the driver loaded has none worth reading.
_NO_MEAN = ("energy_mj",)


def _gpu(series: Series) -> dict[str, Any]:
    devices: dict[str, Any] = {}
    # a series filled by hand (tests) may lack gpu_t; then the samples are the host's
    times = series.gpu_t if len(series.gpu_t) == len(series.gpu) else series.t
    for index in range(len(series.gpu[0]) if series.gpu else 0):
        kept = [
            (t, sample[index])
            for t, sample in zip(times, series.gpu, strict=False)
            if index < len(sample)
        ]
        rows = [r for _, r in kept]
        keys = [k for k in rows[0] if k != "throttle_reasons"]
        devices[str(index)] = {
            "series": {"t": [t for t, _ in kept]} | {k: [r[k] for r in rows] for k in keys},
            "summary": {
                f"{k}_mean": round(sum(r[k] for r in rows) / len(rows), 3)
                for k in keys
                if k not in _NO_MEAN
            }
            | {"sm_clock_mhz_min": min(r["sm_clock_mhz"] for r in rows)},
        }
    return devices


def _throttled(series: Series) -> list[str]:
    seen: set[str] = set()
    for sample in series.gpu:
        for dev in sample:
            bits = int(dev["throttle_reasons"])
            seen |= {name for bit, name in THROTTLE_BITS.items() if bits & bit}
    if not seen:
        return []
    reasons = ", ".join(sorted(seen))
    return [f"the GPU throttled during the cell ({reasons}); its figures are not a steady clock's"]
