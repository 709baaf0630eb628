"""TensorRT optimization profiles and engine-cache keys, derived without TensorRT.

A profile gives every input a (min, opt, max) shape; TensorRT builds kernels valid for
the whole range and tuned for ``opt``. The ranges come from the inputs' specs: static dims
are fixed, the batch dim and named dynamic dims take their range from a spec string

    "batch=1:8:32,sequence=16:128:512"          one profile
    "batch=1:1:1;batch=2:16:32"                 two profiles, ';'-separated

and a named dim missing from it takes ``1:N:N`` from ``--dim NAME=N``. Used by the
TensorRT adapter and ONNX Runtime's TensorRT provider (``trt_profile_*_shapes``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.engine import TensorSpec

DEFAULT_BATCH = (1, 8, 32)
DEFAULT_PROFILE = "batch=" + ":".join(map(str, DEFAULT_BATCH))
"""The profile used when none is given (a named dim not in it: 1:N:N from dims)."""


@dataclass(frozen=True)
class DimRange:
    low: int
    opt: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.opt <= self.high:
            raise ValueError(f"a range needs 1 <= min <= opt <= max, got {self.text()}")

    def text(self) -> str:
        return f"{self.low}:{self.opt}:{self.high}"


@dataclass(frozen=True)
class Profile:
    """(min, opt, max) shape per input name."""

    shapes: Mapping[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]

    def ort_options(self) -> dict[str, str]:
        """The three ``trt_profile_*_shapes`` strings of ONNX Runtime's TensorRT provider."""
        keys = ("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes")
        return {
            key: ",".join(
                f"{name}:{'x'.join(map(str, shapes[i]))}" for name, shapes in self.shapes.items()
            )
            for i, key in enumerate(keys)
        }


def parse_ranges(text: str) -> list[dict[str, DimRange]]:
    """``"batch=1:8:32,sequence=16:128:512;batch=..."`` -> one dict per profile."""
    profiles: list[dict[str, DimRange]] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        ranges: dict[str, DimRange] = {}
        for item in part.split(","):
            name, sep, spec = item.strip().partition("=")
            bounds = spec.split(":")
            if not sep or not name or len(bounds) != 3 or not all(b.isdigit() for b in bounds):
                raise ValueError(f"profile item {item.strip()!r}: expected NAME=MIN:OPT:MAX")
            ranges[name] = DimRange(*(int(b) for b in bounds))
        profiles.append(ranges)
    if not profiles:
        raise ValueError("empty profile specification")
    return profiles


def parse_dims(text: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"dims item {item!r}: expected NAME=N with N >= 1")
        out[name.strip()] = int(value)
    return out


def _dim_range(
    spec: TensorSpec, axis: int, ranges: Mapping[str, DimRange], dims: Mapping[str, int]
) -> DimRange:
    dim = spec.shape[axis]
    if isinstance(dim, int) and dim > 0:
        return DimRange(dim, dim, dim)
    name = "batch" if axis == 0 else (str(dim) if dim else "")
    if name in ranges:
        return ranges[name]
    if axis == 0:
        return DimRange(*DEFAULT_BATCH)
    if name and name in dims:
        return DimRange(1, dims[name], dims[name])
    label = f"{name!r}" if name else "unnamed"
    raise ValueError(
        f"input {spec.name} dim {axis} ({label}) is dynamic: give its range in the profile"
        f" (NAME=MIN:OPT:MAX) or --dim {name or 'NAME'}=MAX"
    )


def derive(
    specs: Sequence[TensorSpec], ranges: Mapping[str, DimRange], dims: Mapping[str, int]
) -> Profile:
    """One profile for ``specs``: every dynamic dim's range from ``ranges`` or ``dims``."""
    shapes = {}
    for spec in specs:
        per_axis = [_dim_range(spec, axis, ranges, dims) for axis in range(len(spec.shape))]
        shapes[spec.name] = (
            tuple(r.low for r in per_axis),
            tuple(r.opt for r in per_axis),
            tuple(r.high for r in per_axis),
        )
    return Profile(shapes)


def derive_all(
    specs: Sequence[TensorSpec], text: str | None, dims: Mapping[str, int]
) -> list[Profile]:
    """Every profile of ``text`` (one default profile when None)."""
    return [derive(specs, ranges, dims) for ranges in (parse_ranges(text) if text else [{}])]


def cache_key(
    model_sha256: str,
    trt_version: str,
    gpu: str,
    profiles: Sequence[Profile],
    build: Mapping[str, object],
) -> str:
    """An engine is only valid for the same model bytes, TensorRT version, GPU (name and
    compute capability), profiles and builder settings: all of them key its cache file."""
    payload = {
        "model": model_sha256,
        "tensorrt": trt_version,
        "gpu": gpu,
        "profiles": [
            {name: [list(s) for s in shapes] for name, shapes in p.shapes.items()} for p in profiles
        ],
        "build": dict(sorted(build.items())),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def select_profile(profiles: Sequence[Profile], shapes: Mapping[str, tuple[int, ...]]) -> int:
    """Index of the first profile whose ranges hold every input shape (ValueError: none)."""
    for index, profile in enumerate(profiles):
        if all(_within(shapes[name], bounds) for name, bounds in profile.shapes.items()):
            return index
    got = ", ".join(f"{k}={list(v)}" for k, v in shapes.items())
    raise ValueError(f"no optimization profile holds the input shapes {got}")


def _within(
    shape: tuple[int, ...], bounds: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
) -> bool:
    low, _, high = bounds
    return len(shape) == len(low) and all(
        lo <= s <= hi for s, lo, hi in zip(shape, low, high, strict=True)
    )
