"""Seeded synthetic inputs built from a model's declared input specs.

Works for the embedded models and for a user's ``--model`` alike: float inputs are
standard normal, integer inputs are ids in ``[0, int_high)``, inputs whose name contains
``mask`` are 1 on real positions and 0 on padding. Dynamic dims other than the batch
take their size from ``dims`` (``--dim NAME=SIZE``); a missing one is an error that says
which flag to pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.api import TensorSpec

Array = npt.NDArray[Any]


class InputError(ValueError):
    pass


def lengths(rng: np.random.Generator, n: int, median: float, low: int, high: int) -> list[int]:
    """Seeded log-normal lengths around ``median`` (sigma 0.5), clipped to ``[low, high]``."""
    raw = rng.lognormal(np.log(median), 0.5, size=n)
    return [int(x) for x in np.clip(np.rint(raw), low, high)]


def dim_names(specs: Sequence[TensorSpec]) -> list[str]:
    """Names of the dynamic non-batch dims across all inputs, in first-seen order."""
    names: dict[str, None] = {}
    for spec in specs:
        for i in spec.dynamic_dims:
            if i == 0:
                continue
            d = spec.shape[i]
            names[d if isinstance(d, str) else f"{spec.name}:{i}"] = None
    return list(names)


def resolve_shape(spec: TensorSpec, batch: int, dims: Mapping[str, int]) -> tuple[int, ...]:
    shape: list[int] = []
    for i, d in enumerate(spec.shape):
        if isinstance(d, int) and d >= 0:
            shape.append(d)
        elif i == 0:
            shape.append(batch)
        else:
            key = d if isinstance(d, str) else f"{spec.name}:{i}"
            if key not in dims:
                raise InputError(
                    f"input {spec.name!r} has dynamic dimension {key!r} (shape {list(spec.shape)});"
                    f" pass --dim {key}=SIZE"
                )
            shape.append(dims[key])
    return tuple(shape)


def synthesize(
    specs: Sequence[TensorSpec],
    dims: Mapping[str, int],
    rng: np.random.Generator,
    batch: int = 1,
    int_high: int = 100,
) -> dict[str, Array]:
    out: dict[str, Array] = {}
    for spec in specs:
        shape = resolve_shape(spec, batch, dims)
        if "mask" in spec.name.lower():
            out[spec.name] = np.ones(shape, dtype=spec.dtype)
        elif np.issubdtype(spec.dtype, np.integer):
            out[spec.name] = rng.integers(0, int_high, size=shape).astype(spec.dtype)
        elif spec.dtype == np.bool_:
            out[spec.name] = np.ones(shape, dtype=np.bool_)
        else:
            out[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
    return out


def collate(items: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
    """Stack single requests (batch dim 1 each) into one batch along axis 0."""
    return {name: np.concatenate([it[name] for it in items], axis=0) for name in items[0]}


def pad_to(
    item: Mapping[str, Array], specs: Sequence[TensorSpec], target: Mapping[str, int]
) -> dict[str, Array]:
    """Zero-pad each input's dynamic dims up to ``target`` sizes (masks pad with 0 too)."""
    out: dict[str, Array] = {}
    for spec in specs:
        arr = item[spec.name]
        pads = [(0, 0)] * arr.ndim
        for i in spec.dynamic_dims:
            if i == 0:
                continue
            d = spec.shape[i]
            key = d if isinstance(d, str) else f"{spec.name}:{i}"
            if key in target:
                extra = target[key] - arr.shape[i]
                if extra < 0:
                    raise InputError(
                        f"cannot pad {spec.name} dim {key} from {arr.shape[i]}"
                        f" down to {target[key]}"
                    )
                pads[i] = (0, extra)
        out[spec.name] = np.pad(arr, pads) if any(p != (0, 0) for p in pads) else arr
    return out
