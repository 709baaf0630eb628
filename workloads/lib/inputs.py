"""Synthetic inputs for the built-in workloads: seeded lengths, and requests for a tensor
engine built from its declared input specs.

The requests come from ``harness.engine.synthetic`` (exported as
``harness.api.synthetic_inputs``, the same function a workload of your own calls):
float inputs standard normal, integer inputs ids in ``[0, int_high)``, masks all ones,
dynamic dims other than the batch sized by ``dims`` (``--dim NAME=SIZE``). This module
adds what the built-in workloads need besides: lengths, batches stacked from single
requests, and padding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.engine.contract import TensorSpec
from harness.engine.synthetic import InputError, dim_key, dim_names, resolve_shape
from harness.engine.synthetic import synthetic_inputs as synthesize

Array = npt.NDArray[Any]

__all__ = [
    "InputError",
    "collate",
    "dim_names",
    "lengths",
    "pad_to",
    "resolve_shape",
    "synthesize",
]


def lengths(rng: np.random.Generator, n: int, median: float, low: int, high: int) -> list[int]:
    """Seeded log-normal lengths around ``median`` (sigma 0.5), clipped to ``[low, high]``."""
    raw = rng.lognormal(np.log(median), 0.5, size=n)
    return [int(x) for x in np.clip(np.rint(raw), low, high)]


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
            key = dim_key(spec, i)
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
