"""Reading environment fingerprints (harness.environment) back: which hardware a cell ran
on, and where two environments differ.

Readers that put cells side by side (the merged matrix, ``compare``, ``recommend``) use
these so that cells measured on different machines are never silently mixed.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

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
