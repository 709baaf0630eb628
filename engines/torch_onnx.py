"""An ONNX graph run as a ``torch.nn.Module``: every node becomes the torch call that
computes it, so the PyTorch baseline serves the same model file (and weights) as the
other tensor engines.

Only the operators the harness's embedded models use are covered (listed in ``OPS``);
any other makes ``OnnxModule`` refuse the model by name, and a user's own model is
better given to the torch adapter as a ``torch.export`` program (``.pt2``). Imported only
by ``engines.torch`` when it loads a model: it needs torch and onnx.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from engines.onnxinfo import DTYPES as ONNX_DTYPES

Op = Callable[[list[Any], Mapping[str, Any]], Any]

# onnx.TensorProto data types -> torch (16: bfloat16, which numpy lacks)
DTYPES = {code: getattr(torch, name) for code, name in ONNX_DTYPES.items()} | {16: torch.bfloat16}


def _conv(x: list[Any], a: Mapping[str, Any]) -> Any:
    pads = a.get("pads", [0, 0, 0, 0])
    if pads[:2] != pads[2:]:
        raise ValueError(f"asymmetric Conv pads {pads} are not supported")
    bias = x[2] if len(x) > 2 else None
    return F.conv2d(
        x[0],
        x[1],
        bias,
        stride=a.get("strides", [1, 1]),
        padding=pads[:2],
        dilation=a.get("dilations", [1, 1]),
        groups=a.get("group", 1),
    )


def _maxpool(x: list[Any], a: Mapping[str, Any]) -> Any:
    kernel = a["kernel_shape"]
    pads = a.get("pads", [0] * 2 * len(kernel))
    return F.max_pool2d(x[0], kernel, stride=a.get("strides", kernel), padding=pads[:2])


def _gemm(x: list[Any], a: Mapping[str, Any]) -> Any:
    left = x[0].T if a.get("transA", 0) else x[0]
    right = x[1].T if a.get("transB", 0) else x[1]
    out = a.get("alpha", 1.0) * (left @ right)
    return out + a.get("beta", 1.0) * x[2] if len(x) > 2 else out


def _ints(value: Any) -> list[Any]:
    """A shape, axes or bounds input as Python ints. Host values (constants, ``Shape``
    arithmetic) are read as they are; a tensor computed from data costs a device sync."""
    if isinstance(value, torch.Tensor):
        return list(value.reshape(-1).tolist())
    return list(value) if isinstance(value, tuple | list) else [value]


def _reshape(x: list[Any], a: Mapping[str, Any]) -> Any:
    shape = _ints(x[1])
    if not a.get("allowzero", 0):  # ONNX: 0 copies the input's size at that position
        shape = [x[0].shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x[0].reshape(shape)


def _axes(x: list[Any], a: Mapping[str, Any]) -> list[int]:
    return _ints(x[1]) if len(x) > 1 else list(a.get("axes", []))


def _unsqueeze(x: list[Any], a: Mapping[str, Any]) -> Any:
    out = x[0]
    for axis in sorted(_axes(x, a)):
        out = out.unsqueeze(axis)
    return out


def _squeeze(x: list[Any], a: Mapping[str, Any]) -> Any:
    axes = _axes(x, a)
    return x[0].squeeze(tuple(axes)) if axes else x[0].squeeze()


def _range(x: list[Any], device: torch.device) -> torch.Tensor:
    # built on the device from Python scalars: a kernel launch, which a CUDA graph captures
    bounds = [v.item() if isinstance(v, torch.Tensor) else v for v in x]
    dtype = next((v.dtype for v in x if isinstance(v, torch.Tensor)), None)
    return torch.arange(*bounds, dtype=dtype, device=device)


def _layer_norm(x: list[Any], a: Mapping[str, Any]) -> Any:
    axis = a.get("axis", -1)
    shape = x[0].shape[axis:]
    bias = x[2] if len(x) > 2 else None
    return F.layer_norm(x[0], shape, x[1], bias, eps=a.get("epsilon", 1e-5))


def _reduce_sum(x: list[Any], a: Mapping[str, Any]) -> Any:
    axes = _axes(x, a)
    keep = bool(a.get("keepdims", 1))
    return x[0].sum(dim=axes, keepdim=keep) if axes else x[0].sum()


def _max(x: list[Any], a: Mapping[str, Any]) -> Any:
    out = x[0]
    for other in x[1:]:
        out = torch.maximum(out, other)
    return out


OPS: dict[str, Op] = {
    "Conv": _conv,
    "Relu": lambda x, a: F.relu(x[0]),
    "MaxPool": _maxpool,
    "GlobalAveragePool": lambda x, a: x[0].mean(dim=(2, 3), keepdim=True),
    "Flatten": lambda x, a: x[0].flatten(a.get("axis", 1)),
    "Gemm": _gemm,
    "MatMul": lambda x, a: torch.matmul(x[0], x[1]),
    "Add": lambda x, a: x[0] + x[1],
    "Sub": lambda x, a: x[0] - x[1],
    "Mul": lambda x, a: x[0] * x[1],
    "Div": lambda x, a: x[0] / x[1],
    "Max": _max,
    "Erf": lambda x, a: torch.erf(x[0]),
    "Softmax": lambda x, a: torch.softmax(x[0], dim=a.get("axis", -1)),
    "Transpose": lambda x, a: x[0].permute(a["perm"]),
    "Reshape": _reshape,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Gather": lambda x, a: torch.index_select(x[0], a.get("axis", 0), x[1].reshape(-1)).reshape(
        *x[0].shape[: a.get("axis", 0)], *x[1].shape, *x[0].shape[a.get("axis", 0) + 1 :]
    ),
    "Cast": lambda x, a: x[0].to(DTYPES[a["to"]]),
    "LayerNormalization": _layer_norm,
    "ReduceSum": _reduce_sum,
}


# -- shape arithmetic on the host ------------------------------------------------------------
# Shape values (``Shape`` of a tensor, and what Squeeze/Unsqueeze/Gather/Cast make of it)
# stay Python ints: a tuple for rank 1, an int for rank 0 (SymInts under torch.compile).
# Kept off the device, they cost no sync to read back, which is also what lets a CUDA graph
# capture the module and torch.compile trace it without a graph break.

HostValue = int | tuple[int, ...]

# The inputs that torch reads as Python ints (a shape, axes, range bounds): a host value
# goes there as it is.
SHAPE_INPUTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}),
    "Unsqueeze": frozenset({1}),
    "Squeeze": frozenset({1}),
    "ReduceSum": frozenset({1}),
    "Range": frozenset({0, 1, 2}),
}


def _host_gather(x: list[Any], a: Mapping[str, Any]) -> HostValue:
    values, index = x
    return tuple(values[i] for i in index) if isinstance(index, tuple) else values[index]


HOST_OPS: dict[str, Op] = {
    "Shape": lambda x, a: tuple(x[0].shape[a.get("start", 0) : a.get("end", None)]),
    "Squeeze": lambda x, a: x[0][0],
    "Unsqueeze": lambda x, a: (x[0],),
    "Gather": _host_gather,
    "Cast": lambda x, a: x[0],
}

Rule = Callable[[list[int | None], list[Any], Mapping[str, Any]], int | None]


def _one_axis(consts: list[Any]) -> bool:
    return isinstance(consts[1], tuple) and len(consts[1]) == 1


# Rank of a HOST_OPS node's output from its inputs' host ranks (None: a tensor) and constant
# values; None where the node needs tensors (what HOST_OPS does not cover, e.g. rank 2).
HOST_RANKS: dict[str, Rule] = {
    "Shape": lambda r, c, a: 1,
    "Squeeze": lambda r, c, a: 0 if r == [1, 1] and _one_axis(c) else None,
    "Unsqueeze": lambda r, c, a: 1 if r == [0, 1] and _one_axis(c) else None,
    "Gather": lambda r, c, a: (
        r[1] if r[0] == 1 and r[1] is not None and not a.get("axis") else None
    ),
    "Cast": lambda r, c, a: r[0] if DTYPES[a["to"]] == torch.int64 else None,  # a no-op
}


class Step(NamedTuple):
    """One node, planned: ``host`` computes it with HOST_OPS; ``to_tensor`` lists the inputs
    whose host value a tensor op needs as a tensor."""

    op_type: str
    inputs: list[str]
    output: str
    attrs: dict[str, Any]
    host: bool
    to_tensor: tuple[int, ...]


def plan(nodes: list[Any], consts: Mapping[str, HostValue]) -> list[Step]:
    """Which nodes run on host values, given the initializers kept on the host."""
    ranks = {name: 0 if isinstance(v, int) else 1 for name, v in consts.items()}
    steps = []
    for op_type, ins, outs, attrs in nodes:
        in_ranks = [ranks.get(i) for i in ins]
        # only what derives from a Shape is computed on the host: a node on constants
        # alone (a Gather from an int64 table) is data, for the device
        derived = [None if ins[0] in consts else in_ranks[0], *in_ranks[1:]]
        rule = HOST_RANKS.get(op_type)
        rank = rule(derived, [consts.get(i) for i in ins], attrs) if rule else None
        if rank is not None:
            ranks[outs[0]] = rank
        host_reads = _host_reads(op_type, rank is not None, len(ins))
        to_tensor = tuple(
            p for p, r in enumerate(in_ranks) if r is not None and p not in host_reads
        )
        steps.append(Step(op_type, ins, outs[0], attrs, rank is not None, to_tensor))
    return steps


def _host_reads(op_type: str, host: bool, count: int) -> frozenset[int]:
    if host and op_type != "Shape":  # Shape reads its input's sizes, a tensor's
        return frozenset(range(count))
    return SHAPE_INPUTS.get(op_type, frozenset())


def host_constants(
    nodes: list[Any], arrays: Mapping[str, np.ndarray[Any, Any]], outputs: list[str]
) -> tuple[dict[str, HostValue], list[Step]]:
    """The int64 initializers of rank 0 or 1 that no tensor op reads, as Python ints, and
    the plan they give. One a tensor op reads stays a buffer, rather than being remade on
    the device at every call; dropping it can turn a node using it back to tensors, so
    this repeats until nothing changes."""
    consts = {n: _host_value(a) for n, a in arrays.items() if a.dtype == np.int64 and a.ndim < 2}
    while True:
        steps = plan(nodes, consts)
        tensor_reads = {s.inputs[p] for s in steps for p in s.to_tensor} | set(outputs)
        kept = {n: v for n, v in consts.items() if n not in tensor_reads}
        if len(kept) == len(consts):
            return consts, steps
        consts = kept


def _host_value(array: np.ndarray[Any, Any]) -> HostValue:
    value = array.tolist()
    return tuple(value) if isinstance(value, list) else int(value)


def _tensor(value: Any, device: torch.device) -> torch.Tensor:
    """A host value where a tensor op needs one. Filled in on the device, not copied from
    host memory: a copy would sync, and a CUDA graph capture refuses it."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, tuple):
        items = [torch.full((), v, dtype=torch.int64, device=device) for v in value]
        return torch.stack(items) if items else torch.zeros(0, dtype=torch.int64, device=device)
    return torch.full((), value, dtype=torch.int64, device=device)


class OnnxModule(torch.nn.Module):
    """Runs the nodes of an ONNX graph in order. Initializers are buffers (they follow
    ``.to(device)``), except the shape constants, kept as Python ints (``host_constants``)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        import onnx  # noqa: PLC0415
        from onnx import numpy_helper  # noqa: PLC0415

        graph = onnx.load(str(path)).graph
        missing = sorted({n.op_type for n in graph.node} - set(OPS) - set(HOST_OPS) - {"Range"})
        if missing:
            raise ValueError(
                f"{path.name} uses ONNX operators the torch adapter does not map:"
                f" {', '.join(missing)}; export the model with torch.export and pass the .pt2"
            )
        # writable copies for torch
        arrays = {i.name: np.array(numpy_helper.to_array(i)) for i in graph.initializer}
        nodes = [
            (n.op_type, [i for i in n.input if i], list(n.output), _attributes(n))
            for n in graph.node
        ]
        self.output_names = [o.name for o in graph.output]
        self.host_constants, self.steps = host_constants(nodes, arrays, self.output_names)
        self.slots: dict[str, str] = {}
        for i, (name, array) in enumerate(arrays.items()):
            if name not in self.host_constants:
                self.register_buffer(f"c{i}", torch.from_numpy(array), persistent=False)
                self.slots[name] = f"c{i}"
        self.input_names = [i.name for i in graph.input if i.name not in arrays]
        self.float_dtype = torch.float32  # the adapter sets it with the weights' dtype

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values: dict[str, Any] = {name: getattr(self, slot) for name, slot in self.slots.items()}
        values.update(self.host_constants)
        values.update(zip(self.input_names, inputs, strict=True))
        device = inputs[0].device
        for step in self.steps:
            values[step.output] = self._run(step, [values[i] for i in step.inputs], device)
        return tuple(_tensor(values[name], device) for name in self.output_names)

    def _run(self, step: Step, args: list[Any], device: torch.device) -> Any:
        for position in step.to_tensor:
            args[position] = _tensor(args[position], device)
        if step.host:
            return HOST_OPS[step.op_type](args, step.attrs)
        if step.op_type == "Range":
            return _range(args, device)
        if step.op_type == "Cast" and DTYPES[step.attrs["to"]].is_floating_point:
            # a float cast follows the module's compute dtype (fp16/bf16 runs), as its
            # weights do; otherwise a float32 mask meets bf16 activations
            return args[0].to(self.float_dtype)
        return OPS[step.op_type](args, step.attrs)


def _attributes(node: Any) -> dict[str, Any]:
    from onnx import helper  # noqa: PLC0415

    return {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}
