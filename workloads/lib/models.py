"""Embedded default models, generated deterministically from a seed and cached.

No download and no committed binaries: each model is built with ``onnx.helper`` from
seeded random weights, so the same seed gives the same bytes (and sha256) everywhere.
Files are cached by content hash under ``$HARNESS_CACHE_DIR`` (default
``~/.cache/inference-harness/models``).

* ``tiny-cnn``: image classifier, ``image`` float32 [batch, 3, 64, 64] -> ``logits`` [batch, 10]
* ``tiny-cnn-dynhw``: the same network with dynamic height and width
* ``tiny-encoder``: transformer text encoder, ``input_ids``/``attention_mask`` int64
  [batch, sequence] -> masked mean-pooled ``embedding`` [batch, 128]

Their reference-sized counterparts (ResNet-50, BERT-base) are in ``workloads.lib.refmodels``;
``workloads.lib.modelset`` picks between the two sets.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import cache_root

OPSET = 17
GENERATOR_VERSION = 1  # bump when a builder changes, so cached files are not reused

IMAGE_SIZE = 64
CNN_CHANNELS = (32, 64, 128)
CLASSES = 10
VOCAB = 1000
HIDDEN = 128
HEADS = 4
LAYERS = 2
FFN = 512
MAX_SEQUENCE = 256
DYNAMIC_DIMS_ALL = ("height", "width", "sequence")
"""The dynamic non-batch dims of the embedded models (what ``--dim`` may size without
``--model``)."""


@dataclass(frozen=True)
class EncoderShape:
    """A text encoder's size; ``build_encoder`` builds any, with the same inputs, output
    and semantics (``workloads.lib.refmodels`` has the BERT-base-sized one)."""

    graph: str = "tiny_encoder"
    vocab: int = VOCAB
    hidden: int = HIDDEN
    heads: int = HEADS
    layers: int = LAYERS
    ffn: int = FFN
    max_sequence: int = MAX_SEQUENCE


TINY_ENCODER = EncoderShape()


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    path: Path
    sha256: str
    seed: int
    generator_version: int = GENERATOR_VERSION
    build: Mapping[str, Any] = field(default_factory=dict)
    """What building it cost and gave (reference models: seconds, bytes, parameters)."""

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sha256": self.sha256,
            "seed": self.seed,
            "generator_version": self.generator_version,
            "opset": OPSET,
            **dict(self.build),
        }


def cache_dir() -> Path:
    return cache_root() / "models"


class _Graph:
    """Accumulates nodes and initializers with unique names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._n = 0

    def name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._n}"

    def const(self, array: np.ndarray[Any, Any], prefix: str = "c") -> str:
        from onnx import numpy_helper  # noqa: PLC0415

        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def weight(
        self, shape: tuple[int, ...], fan_in: int, prefix: str = "w", gain: float = 1.0
    ) -> str:
        """He-initialised (variance 2 / fan_in, times ``gain`` squared): activations keep
        their scale through ReLU layers, so deep models stay finite in fp16."""
        scale = gain * np.sqrt(2.0 / fan_in)
        return self.const(self.rng.normal(0.0, scale, size=shape).astype(np.float32), prefix)

    def op(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        from onnx import helper  # noqa: PLC0415

        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def model(self, name: str, inputs: list[Any], outputs: list[Any]) -> bytes:
        import onnx  # noqa: PLC0415
        from onnx import helper  # noqa: PLC0415

        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(
            graph, producer_name="inference-harness", opset_imports=[helper.make_opsetid("", OPSET)]
        )
        model.ir_version = 8
        onnx.checker.check_model(model, full_check=True)
        return bytes(model.SerializeToString(deterministic=True))


def _conv_block(g: _Graph, x: str, cin: int, cout: int) -> str:
    w = g.weight((cout, cin, 3, 3), cin * 9)
    b = g.const(np.zeros(cout, dtype=np.float32), "b")
    y = g.op("Relu", [g.op("Conv", [x, w, b], pads=[1, 1, 1, 1], kernel_shape=[3, 3])])
    return y


def build_cnn(seed: int, dynamic_hw: bool) -> bytes:
    from onnx import TensorProto, helper  # noqa: PLC0415

    g = _Graph(seed)
    h: int | str = "height" if dynamic_hw else IMAGE_SIZE
    w: int | str = "width" if dynamic_hw else IMAGE_SIZE
    x = "image"
    cin = 3
    for i, cout in enumerate(CNN_CHANNELS):
        x = _conv_block(g, x, cin, cout)
        if i < len(CNN_CHANNELS) - 1:
            x = g.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
        cin = cout
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])])
    fc = g.weight((cin, CLASSES), cin)
    fb = g.const(np.zeros(CLASSES, dtype=np.float32), "b")
    logits = g.op("Gemm", [x, fc, fb])
    g.nodes[-1].output[0] = "logits"
    _ = logits
    inputs = [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, h, w])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])]
    return g.model("tiny_cnn_dynhw" if dynamic_hw else "tiny_cnn", inputs, outputs)


def _layer_norm(g: _Graph, x: str, hidden: int) -> str:
    scale = g.const(np.ones(hidden, dtype=np.float32), "ln_g")
    bias = g.const(np.zeros(hidden, dtype=np.float32), "ln_b")
    return g.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-5)


def _linear(g: _Graph, x: str, fan_in: int, fan_out: int) -> str:
    w = g.weight((fan_in, fan_out), fan_in)
    b = g.const(np.zeros(fan_out, dtype=np.float32), "b")
    return g.op("Add", [g.op("MatMul", [x, w]), b])


def _heads(g: _Graph, x: str, perm: list[int], shape: EncoderShape) -> str:
    split = np.array([0, 0, shape.heads, shape.hidden // shape.heads], dtype=np.int64)
    return g.op("Transpose", [g.op("Reshape", [x, g.const(split, "shape")])], perm=perm)


def _attention(g: _Graph, x: str, mask_bias: str, shape: EncoderShape) -> str:
    hidden = shape.hidden
    q = _heads(g, _linear(g, x, hidden, hidden), [0, 2, 1, 3], shape)
    k = _heads(g, _linear(g, x, hidden, hidden), [0, 2, 3, 1], shape)
    v = _heads(g, _linear(g, x, hidden, hidden), [0, 2, 1, 3], shape)
    scale = g.const(np.array(1.0 / np.sqrt(hidden // shape.heads), dtype=np.float32))
    scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]), scale]), mask_bias])
    ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    merged = g.op(
        "Reshape",
        [
            g.op("Transpose", [ctx], perm=[0, 2, 1, 3]),
            g.const(np.array([0, 0, hidden], dtype=np.int64), "shape"),
        ],
    )
    return _linear(g, merged, hidden, hidden)


def _gelu(g: _Graph, x: str) -> str:
    half = g.const(np.array(0.5, dtype=np.float32))
    one = g.const(np.array(1.0, dtype=np.float32))
    inv_sqrt2 = g.const(np.array(1.0 / np.sqrt(2.0), dtype=np.float32))
    erf = g.op("Erf", [g.op("Mul", [x, inv_sqrt2])])
    return g.op("Mul", [g.op("Mul", [x, half]), g.op("Add", [erf, one])])


def _embed(g: _Graph, shape: EncoderShape) -> str:
    """Token plus learned position embeddings of ``input_ids``."""
    rows = (shape.vocab, shape.hidden)
    tok = g.const((g.rng.normal(0, 0.02, rows)).astype(np.float32), "tok_emb")
    rows = (shape.max_sequence, shape.hidden)
    pos = g.const((g.rng.normal(0, 0.02, rows)).astype(np.float32), "pos_emb")
    seq_len = g.op(
        "Squeeze",
        [
            g.op("Shape", ["input_ids"], start=1, end=2),
            g.const(np.array([0], dtype=np.int64), "axes"),
        ],
    )
    positions = g.op(
        "Range",
        [g.const(np.array(0, dtype=np.int64)), seq_len, g.const(np.array(1, dtype=np.int64))],
    )
    return g.op("Add", [g.op("Gather", [tok, "input_ids"]), g.op("Gather", [pos, positions])])


def _pool(g: _Graph, x: str, mask_f: str) -> None:
    """Masked mean over the sequence, written to ``embedding``."""
    m3 = g.op("Unsqueeze", [mask_f, g.const(np.array([2], dtype=np.int64), "axes")])
    axis1 = g.const(np.array([1], dtype=np.int64), "axes")
    total = g.op("ReduceSum", [g.op("Mul", [x, m3]), axis1], keepdims=0)
    count = g.op(
        "Max",
        [g.op("ReduceSum", [m3, axis1], keepdims=0), g.const(np.array(1.0, dtype=np.float32))],
    )
    g.op("Div", [total, count])
    g.nodes[-1].output[0] = "embedding"


def build_encoder(seed: int, shape: EncoderShape = TINY_ENCODER) -> bytes:
    """Pre-LayerNorm transformer encoder of ``shape``: ``input_ids``/``attention_mask``
    int64 [batch, sequence] -> masked mean-pooled ``embedding`` [batch, hidden]."""
    from onnx import TensorProto, helper  # noqa: PLC0415

    g = _Graph(seed)
    hidden = shape.hidden
    x = _embed(g, shape)
    mask_f = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    inv = g.op("Sub", [g.const(np.array(1.0, dtype=np.float32)), mask_f])
    bias = g.op("Mul", [inv, g.const(np.array(-1e4, dtype=np.float32))])
    mask_bias = g.op("Unsqueeze", [bias, g.const(np.array([1, 2], dtype=np.int64), "axes")])
    for _ in range(shape.layers):
        x = g.op("Add", [x, _attention(g, _layer_norm(g, x, hidden), mask_bias, shape)])
        up = _linear(g, _layer_norm(g, x, hidden), hidden, shape.ffn)
        x = g.op("Add", [x, _linear(g, _gelu(g, up), shape.ffn, hidden)])
    _pool(g, _layer_norm(g, x, hidden), mask_f)
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
    ]
    outputs = [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", hidden])]
    return g.model(shape.graph, inputs, outputs)


BUILDERS: dict[str, Callable[[int], bytes]] = {
    "tiny-cnn": lambda seed: build_cnn(seed, dynamic_hw=False),
    "tiny-cnn-dynhw": lambda seed: build_cnn(seed, dynamic_hw=True),
    "tiny-encoder": build_encoder,
}


def embedded(name: str, seed: int = 0) -> EmbeddedModel:
    """Build (or reuse from the cache) the embedded model ``name``."""
    if name not in BUILDERS:
        raise KeyError(f"no embedded model {name!r}; have {', '.join(sorted(BUILDERS))}")
    data = BUILDERS[name](seed)
    digest = hashlib.sha256(data).hexdigest()
    directory = cache_dir()
    path = directory / f"{name}-s{seed}-g{GENERATOR_VERSION}-{digest[:16]}.onnx"
    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
        directory.mkdir(parents=True, exist_ok=True)
        write_atomically(path, data)
    return EmbeddedModel(name, path, digest, seed)


def write_atomically(path: Path, data: bytes) -> None:
    """A concurrent builder writes the same bytes, and a reader sees whole files only."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
