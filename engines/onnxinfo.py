"""Input and output specs read from an ONNX file with the ``onnx`` package alone, for the
adapters whose engine does not say (TensorRT's network loses dim names; torch has none)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from harness.engine import TensorSpec

# onnx.TensorProto element types -> numpy dtype names
DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
}


def value_specs(values: Any) -> tuple[TensorSpec, ...]:
    """TensorSpecs of ONNX graph inputs or outputs; a dynamic dim keeps its dim_param name
    (``--dim sequence=N`` sizes it) or is None."""
    specs = []
    for v in values:
        kind = v.type.tensor_type
        if kind.elem_type not in DTYPES:
            raise ValueError(f"{v.name}: unsupported ONNX element type {kind.elem_type}")
        dims = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in kind.shape.dim
        )
        specs.append(TensorSpec(v.name, np.dtype(DTYPES[kind.elem_type]), dims))
    return tuple(specs)


def read_specs(path: Path) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """(inputs, outputs) of the ONNX model at ``path``; initializers are not inputs."""
    import onnx  # noqa: PLC0415

    graph = onnx.load(str(path), load_external_data=False).graph
    init = {i.name for i in graph.initializer}
    return value_specs([i for i in graph.input if i.name not in init]), value_specs(graph.output)
