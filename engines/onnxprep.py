"""A user's ONNX model looked at once before a run, and the derived copies some runs need.

``inspect`` reads the file with the ``onnx`` package alone (no engine) and says in one
sentence why the harness cannot drive it: not ONNX, empty, a folder, an input without a
leading batch dimension. ``make_batch_dynamic`` rewrites a fixed batch dimension as a
named dynamic one in a copy, and refuses (``RewriteRefused``) when ONNX shape inference
shows that the graph still hard-codes the old batch (a ``Reshape`` to ``[1, 2048]``).
``prepare_for_quantization`` drops initializers listed as graph inputs (IR < 4 models),
which keeps graph optimizers from folding the constants that quantizers need.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.onnxinfo import value_specs
from harness.engine import TensorSpec

BATCH = "batch"
"""The dim_param a rewritten batch dimension gets."""

WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
LARGE_MODEL_BYTES = 1 << 30  # well below protobuf's 2 GB limit on one message


class ModelError(ValueError):
    """The model cannot be driven by the harness; the message says why, in one sentence."""


class RewriteRefused(ModelError):
    """The batch dimension cannot be made dynamic: the graph hard-codes it elsewhere."""


@dataclass(frozen=True)
class OnnxModel:
    """What the harness needs to know of an ONNX file before loading it in an engine."""

    path: Path
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    ir_version: int
    opset: int
    initializer_inputs: int
    """Initializers also listed as graph inputs (required before IR 4)."""

    @property
    def fixed_batch(self) -> int | None:
        return fixed_batch(self.inputs)

    def describe(self) -> dict[str, Any]:
        return {
            "inputs": [f"{s.name} {list(s.shape)} {s.dtype}" for s in self.inputs],
            "ir_version": self.ir_version,
            "opset": self.opset,
            "initializers_listed_as_inputs": self.initializer_inputs,
        }


def fixed_batch(specs: Iterable[TensorSpec]) -> int | None:
    """The leading dimension's size where an input fixes it, else None (dynamic)."""
    leading = [s.shape[0] for s in specs if s.shape]
    fixed = {d for d in leading if isinstance(d, int) and d > 0}
    return min(fixed) if fixed else None


def _load(path: Path, *, weights: bool = False) -> Any:
    """The ModelProto; ``weights``: with external data too (a copy written elsewhere must
    carry them, its relative references would not resolve)."""
    import onnx  # noqa: PLC0415
    from google.protobuf.message import DecodeError  # noqa: PLC0415

    if path.is_dir():
        raise ModelError(f"{path} is a directory, not an ONNX file")
    if path.stat().st_size == 0:
        raise ModelError(f"{path} is empty (0 bytes), not an ONNX model")
    try:
        model = onnx.load(str(path), load_external_data=weights)
    except DecodeError as exc:
        raise ModelError(f"{path} is not an ONNX model (protobuf: {exc})") from None
    # bytes that happen to parse as a protobuf give an empty ModelProto
    if model.ir_version < 1 or not model.graph.output:
        raise ModelError(f"{path} is not an ONNX model (no IR version or no graph outputs)")
    return model


def _opset(model: Any) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def inspect(path: Path) -> OnnxModel:
    """The model at ``path``, or a ``ModelError`` saying why the harness cannot run it."""
    model = _load(path)
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    try:
        inputs = value_specs([i for i in graph.input if i.name not in inits])
        outputs = value_specs(graph.output)
    except ValueError as exc:
        raise ModelError(f"{path}: {exc}") from None
    if not inputs:
        raise ModelError(f"{path} has no inputs to feed (every graph input is an initializer)")
    scalars = [s.name for s in inputs if not s.shape]
    if scalars:
        raise ModelError(
            f"{path}: input {', '.join(scalars)} is a scalar; the harness feeds batches, so"
            " every input needs a leading batch dimension ([batch, ...])"
        )
    return OnnxModel(
        path=path,
        inputs=inputs,
        outputs=outputs,
        ir_version=int(model.ir_version),
        opset=_opset(model),
        initializer_inputs=sum(1 for i in graph.input if i.name in inits),
    )


def _batch_dims(model: Any, fixed: int) -> Iterable[tuple[str, Any]]:
    """(tensor name, dim) of every graph input and output whose leading dim is ``fixed``."""
    inits = {i.name for i in model.graph.initializer}
    for value in (*model.graph.input, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        if value.name in inits or not dims:
            continue
        if dims[0].HasField("dim_value") and dims[0].dim_value == fixed:
            yield value.name, dims[0]


def _set_batch(model: Any, fixed: int, size: int | str) -> list[str]:
    changed = []
    for name, dim in _batch_dims(model, fixed):
        if isinstance(size, str):
            dim.dim_param = size  # a oneof: clears dim_value
        else:
            dim.dim_value = size
        changed.append(f"{name} dim 0: {fixed} -> {size}")
    return changed


def _infers(model: Any) -> str | None:
    """None when strict ONNX shape inference accepts ``model``, else its first error."""
    import onnx  # noqa: PLC0415

    try:
        onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception as exc:  # onnx raises several types (InferenceError, ValidationError)
        return str(exc).strip().splitlines()[0]
    return None


def _hardcoded(model: Any, fixed: int) -> list[str]:
    """Reshape nodes whose constant target shape starts with the old batch size."""
    from onnx import numpy_helper  # noqa: PLC0415

    consts = {i.name: i for i in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type == "Reshape" and len(node.input) > 1 and node.input[1] in consts:
            shape = numpy_helper.to_array(consts[node.input[1]]).tolist()
            if shape and shape[0] == fixed:
                found.append(f"Reshape {node.name or node.output[0]} to {shape}")
    return found


def _probe(model: Any, fixed: int, path: Path) -> None:
    """Raise ``RewriteRefused`` when the graph cannot take another batch than ``fixed``.

    Strict shape inference with the batch at ``fixed`` and at ``fixed + 1``: where the
    first passes and the second fails, something in the graph still holds the old batch.
    Where even the first fails, inference cannot judge this graph and the rewrite stands.
    """
    import onnx  # noqa: PLC0415

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    if _infers(probe) is not None:
        return
    _set_batch(probe, fixed, fixed + 1)
    error = _infers(probe)
    if error is None:
        return
    culprits = _hardcoded(model, fixed)
    where = f" ({'; '.join(culprits[:3])})" if culprits else ""
    raise RewriteRefused(
        f"{path.name} cannot take a batch other than {fixed}: the graph hard-codes it"
        f"{where}; ONNX shape inference at batch {fixed + 1}: {error}"
    )


def make_batch_dynamic(source: Path, target: Path) -> list[str]:
    """Write to ``target`` a copy of ``source`` whose fixed batch dimension (inputs and
    outputs) is the dynamic ``batch``; -> what was rewritten. ``source`` is not touched."""
    info = inspect(source)
    fixed = info.fixed_batch
    if fixed is None:
        return []
    model = _load(source, weights=True)
    del model.graph.value_info[:]  # intermediate shapes recorded for the old batch
    _probe(model, fixed, source)
    changed = _set_batch(model, fixed, BATCH)
    _save(model, target, check=True)
    return changed


def quantization_blockers(path: Path) -> list[str]:
    """Why a weight quantizer would not see this model's weights as constants: weights
    listed as graph inputs (overridable, so never folded), or computed by nodes."""
    model = _load(path)
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    listed = sum(1 for i in graph.input if i.name in inits)
    producers = {out: node.op_type for node in graph.node for out in node.output}
    computed = [
        f"{node.input[1]} (from {producers[node.input[1]]})"
        for node in graph.node
        if node.op_type in WEIGHTED_OPS
        and len(node.input) > 1
        and node.input[1] in producers
        and producers[node.input[1]] in ("Constant", "ConstantOfShape")
    ]
    out = [f"{listed} initializers listed as graph inputs"] if listed else []
    if computed:
        out.append(f"{len(computed)} weights computed by nodes, e.g. {computed[0]}")
    return out


def drop_initializer_inputs(source: Path, target: Path) -> None:
    """A copy of ``source`` whose initializers are no longer also graph inputs (IR >= 4
    allows that), so that graph optimizers may fold them as constants."""
    model = _load(source, weights=True)
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    kept = [i for i in graph.input if i.name not in inits]
    del graph.input[:]
    graph.input.extend(kept)
    model.ir_version = max(int(model.ir_version), 4)
    _save(model, target)


def _save(model: Any, target: Path, *, check: bool = False) -> None:
    """Write ``model`` to ``target`` atomically (a concurrent reader sees the old file or
    the new); past protobuf's 2 GB its weights go to ``target.name + .data`` beside it.
    ``check``: the ONNX checker must accept the file first."""
    import onnx  # noqa: PLC0415

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".tmp-{os.getpid()}-{target.name}")
    large = model.ByteSize() > LARGE_MODEL_BYTES
    onnx.save_model(model, str(tmp), save_as_external_data=large, location=f"{target.name}.data")
    if check:
        try:
            onnx.checker.check_model(str(tmp))  # by path: works past 2 GB
        except (onnx.checker.ValidationError, ValueError) as exc:
            tmp.unlink()
            target.with_name(f"{target.name}.data").unlink(missing_ok=True)
            raise RewriteRefused(
                f"{target.name}: the rewritten model is not valid: {exc}"
            ) from None
    os.replace(tmp, target)
