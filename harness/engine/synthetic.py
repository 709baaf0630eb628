"""Seeded synthetic inputs for a tensor engine, built from the ``TensorSpec``s it declares.

Engine-neutral: it reads only the contract's specs, so it serves the embedded models and
a user's ``--model`` alike. Float inputs are standard normal, integer inputs are ids in
``[0, int_high)``, inputs whose name contains ``mask`` (and booleans) are all ones. Dim 0
is the batch; other dynamic dims take their size from ``dims`` (``--dim NAME=SIZE``), by
the dim's name or, unnamed, ``INPUT:INDEX``; a missing one is an error naming the flag.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.engine.contract import TensorSpec
from harness.exceptions import HarnessError

Array = npt.NDArray[Any]


class InputError(HarnessError, ValueError):
    """An input cannot be built or padded as asked (a dynamic dim without a size)."""


def dim_key(spec: TensorSpec, index: int) -> str:
    """How ``--dim`` names dim ``index`` of ``spec``: its symbolic name, else ``INPUT:INDEX``."""
    d = spec.shape[index]
    return d if isinstance(d, str) else f"{spec.name}:{index}"


def dim_names(specs: Sequence[TensorSpec]) -> list[str]:
    """Names of the dynamic non-batch dims across all inputs, in first-seen order."""
    names = {dim_key(spec, i): None for spec in specs for i in spec.dynamic_dims if i != 0}
    return list(names)


def resolve_shape(spec: TensorSpec, batch: int, dims: Mapping[str, int]) -> tuple[int, ...]:
    """The concrete shape of ``spec``: static dims as declared, dim 0 ``batch``, other
    dynamic dims from ``dims``."""
    shape: list[int] = []
    for i, d in enumerate(spec.shape):
        if isinstance(d, int) and d >= 0:
            shape.append(d)
        elif i == 0:
            shape.append(batch)
        else:
            key = dim_key(spec, i)
            if key not in dims:
                raise InputError(
                    f"input {spec.name!r} has dynamic dimension {key!r} (shape {list(spec.shape)});"
                    f" pass --dim {key}=SIZE"
                )
            shape.append(dims[key])
    return tuple(shape)


def synthetic_inputs(
    specs: Sequence[TensorSpec],
    dims: Mapping[str, int],
    rng: np.random.Generator,
    batch: int = 1,
    int_high: int = 100,
) -> dict[str, Array]:
    """One request for a tensor engine: an array per declared input, drawn from ``rng``."""
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
