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
from typing import Any

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


def _reshape(x: list[Any], a: Mapping[str, Any]) -> Any:
    shape = [int(s) for s in x[1].tolist()]
    if not a.get("allowzero", 0):  # ONNX: 0 copies the input's size at that position
        shape = [x[0].shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x[0].reshape(shape)


def _axes(x: list[Any], a: Mapping[str, Any]) -> list[int]:
    if len(x) > 1:
        return [int(v) for v in x[1].tolist()]
    return list(a.get("axes", []))


def _unsqueeze(x: list[Any], a: Mapping[str, Any]) -> Any:
    out = x[0]
    for axis in sorted(_axes(x, a)):
        out = out.unsqueeze(axis)
    return out


def _squeeze(x: list[Any], a: Mapping[str, Any]) -> Any:
    axes = _axes(x, a)
    return x[0].squeeze(tuple(axes)) if axes else x[0].squeeze()


def _shape(x: list[Any], a: Mapping[str, Any]) -> Any:
    dims = list(x[0].shape)[a.get("start", 0) : a.get("end", None)]
    return torch.tensor(dims, dtype=torch.int64, device=x[0].device)


def _range(x: list[Any], a: Mapping[str, Any]) -> Any:
    start, limit, delta = (int(v) for v in x)
    return torch.arange(start, limit, delta, dtype=torch.int64, device=x[0].device)


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
    "Shape": _shape,
    "Range": _range,
    "Gather": lambda x, a: torch.index_select(x[0], a.get("axis", 0), x[1].reshape(-1)).reshape(
        *x[0].shape[: a.get("axis", 0)], *x[1].shape, *x[0].shape[a.get("axis", 0) + 1 :]
    ),
    "Cast": lambda x, a: x[0].to(DTYPES[a["to"]]),
    "LayerNormalization": _layer_norm,
    "ReduceSum": _reduce_sum,
}


class OnnxModule(torch.nn.Module):
    """Runs the nodes of an ONNX graph in order; initializers are buffers (they follow
    ``.to(device)``)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        import onnx  # noqa: PLC0415
        from onnx import numpy_helper  # noqa: PLC0415

        model = onnx.load(str(path))
        graph = model.graph
        missing = sorted({n.op_type for n in graph.node} - set(OPS))
        if missing:
            raise ValueError(
                f"{path.name} uses ONNX operators the torch adapter does not map:"
                f" {', '.join(missing)}; export the model with torch.export and pass the .pt2"
            )
        self.slots: dict[str, str] = {}
        for i, init in enumerate(graph.initializer):
            array = np.array(numpy_helper.to_array(init))  # writable copy for torch
            self.register_buffer(f"c{i}", torch.from_numpy(array), persistent=False)
            self.slots[init.name] = f"c{i}"
        self.nodes = [
            (n.op_type, list(n.input), list(n.output), _attributes(n)) for n in graph.node
        ]
        self.input_names = [i.name for i in graph.input if i.name not in self.slots]
        self.float_dtype = torch.float32  # the adapter sets it with the weights' dtype
        self.output_names = [o.name for o in graph.output]

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values: dict[str, Any] = {name: getattr(self, slot) for name, slot in self.slots.items()}
        values.update(zip(self.input_names, inputs, strict=True))
        for op_type, ins, outs, attrs in self.nodes:
            args = [values[i] for i in ins if i]
            if op_type == "Cast" and DTYPES[attrs["to"]].is_floating_point:
                # a float cast follows the module's compute dtype (fp16/bf16 runs), as its
                # weights do; otherwise a float32 mask meets bf16 activations
                values[outs[0]] = args[0].to(self.float_dtype)
                continue
            values[outs[0]] = OPS[op_type](args, attrs)
        return tuple(values[name] for name in self.output_names)


def _attributes(node: Any) -> dict[str, Any]:
    from onnx import helper  # noqa: PLC0415

    return {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}
