"""Reference-sized embedded models: what a GPU is actually bought to run, at the sizes of
the models people benchmark, generated locally from a seed (random weights, no download).

* ``resnet50``: a ResNet-50-shaped image classifier (bottleneck stages of 3, 4, 6 and 3
  blocks, widths 64 to 2048, the stride on the 3x3 convolution as in v1.5), ``image``
  float32 [batch, 3, 224, 224] -> ``logits`` [batch, 1000]; batch norm is folded into
  the convolutions' biases, as an inference export does;
* ``resnet50-dynhw``: the same network with dynamic height and width;
* ``bert-base``: a BERT-base-shaped encoder (12 layers, hidden 768, 12 heads, FFN 3072,
  vocab 30522, up to 512 positions) built by the tiny encoder's own builder
  (``workloads.lib.models.build_encoder``), so its inputs, output and masking are the tiny
  one's: ``input_ids``/``attention_mask`` int64 [batch, sequence] -> masked mean-pooled
  ``embedding`` [batch, 768].

Weights are He-initialised; the last convolution of each residual branch is scaled down
(``BRANCH_GAIN``) so that 16 residual additions do not grow activations past what fp16
holds. Building takes seconds (ResNet-50) to tens of seconds (BERT-base, 440 MB), so a
model is cached under a key of what was built (name, seed, shape, generator version,
numpy and onnx versions) and not rebuilt to be hashed: its sha256 is kept beside it and
checked once per process. A build is announced (seconds, size, parameters); a cache hit
says nothing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from harness.api import announce
from workloads.lib.models import (
    OPSET,
    EmbeddedModel,
    EncoderShape,
    _Graph,
    build_encoder,
    cache_dir,
    write_atomically,
)

GENERATOR_VERSION = 1  # bump when a builder here changes: the cache key holds it

RESNET_STAGES = ((3, 64), (4, 128), (6, 256), (3, 512))
"""(bottleneck blocks, bottleneck width) per stage; a block's output is 4 x its width."""
EXPANSION = 4
RESNET_IMAGE = 224
RESNET_CLASSES = 1000
BRANCH_GAIN = 0.25
"""Scale of each residual branch's last convolution: a block then adds 1/16 of its
input's variance instead of doubling it."""

BERT_BASE = EncoderShape(
    graph="bert_base", vocab=30522, hidden=768, heads=12, layers=12, ffn=3072, max_sequence=512
)


def _conv(g: _Graph, x: str, cin: int, cout: int, kernel: int, **kw: Any) -> str:
    """A convolution with a bias (batch norm folded in); ``stride`` and ``gain`` in ``kw``."""
    stride, gain = int(kw.get("stride", 1)), float(kw.get("gain", 1.0))
    w = g.weight((cout, cin, kernel, kernel), cin * kernel * kernel, gain=gain)
    b = g.const(np.zeros(cout, dtype=np.float32), "b")
    pad = kernel // 2
    return g.op(
        "Conv",
        [x, w, b],
        kernel_shape=[kernel, kernel],
        strides=[stride, stride],
        pads=[pad] * 4,
    )


def _bottleneck(g: _Graph, x: str, cin: int, width: int, stride: int) -> str:
    cout = width * EXPANSION
    y = g.op("Relu", [_conv(g, x, cin, width, 1)])
    y = g.op("Relu", [_conv(g, y, width, width, 3, stride=stride)])
    y = _conv(g, y, width, cout, 1, gain=BRANCH_GAIN)
    skip = x if stride == 1 and cin == cout else _conv(g, x, cin, cout, 1, stride=stride)
    return g.op("Relu", [g.op("Add", [y, skip])])


def build_resnet50(seed: int, dynamic_hw: bool) -> bytes:
    from onnx import TensorProto, helper  # noqa: PLC0415

    g = _Graph(seed)
    x = g.op("Relu", [_conv(g, "image", 3, 64, 7, stride=2)])
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for i, (blocks, width) in enumerate(RESNET_STAGES):
        for b in range(blocks):
            x = _bottleneck(g, x, cin, width, 2 if b == 0 and i > 0 else 1)
            cin = width * EXPANSION
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])])
    fc = g.weight((cin, RESNET_CLASSES), cin)
    g.op("Gemm", [x, fc, g.const(np.zeros(RESNET_CLASSES, dtype=np.float32), "b")])
    g.nodes[-1].output[0] = "logits"
    h: int | str = "height" if dynamic_hw else RESNET_IMAGE
    w: int | str = "width" if dynamic_hw else RESNET_IMAGE
    inputs = [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, h, w])]
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", RESNET_CLASSES])
    ]
    return g.model("resnet50_dynhw" if dynamic_hw else "resnet50", inputs, outputs)


@dataclass(frozen=True)
class Reference:
    """One reference model: how to build it and what it is (for the cache key)."""

    build: Callable[[int], bytes]
    shape: Mapping[str, Any]


_RESNET_SHAPE = {"stages": RESNET_STAGES, "expansion": EXPANSION, "classes": RESNET_CLASSES}
BUILDERS: dict[str, Reference] = {
    "resnet50": Reference(
        lambda seed: build_resnet50(seed, dynamic_hw=False), _RESNET_SHAPE | {"image": 224}
    ),
    "resnet50-dynhw": Reference(
        lambda seed: build_resnet50(seed, dynamic_hw=True), _RESNET_SHAPE | {"image": "dynamic"}
    ),
    "bert-base": Reference(lambda seed: build_encoder(seed, BERT_BASE), asdict(BERT_BASE)),
}


def cache_key(name: str, seed: int) -> str:
    """What the file is: a builder, library or shape change gives another file."""
    parts = {
        "name": name,
        "seed": seed,
        "generator": GENERATOR_VERSION,
        "opset": OPSET,
        "shape": BUILDERS[name].shape,
        "libs": {lib: version(lib) for lib in ("numpy", "onnx")},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def parameter_count(data: bytes) -> int:
    """Float weights of an ONNX model (shape constants and scalars are not parameters)."""
    import onnx  # noqa: PLC0415

    graph = onnx.ModelProto.FromString(data).graph
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    return sum(int(np.prod(t.dims)) for t in graph.initializer if t.data_type in floats and t.dims)


def embedded(name: str, seed: int = 0) -> EmbeddedModel:
    """The reference model ``name`` for ``seed``: from the cache, else built (announced)."""
    if name not in BUILDERS:
        raise KeyError(f"no reference model {name!r}; have {', '.join(sorted(BUILDERS))}")
    path = cache_dir() / f"{name}-s{seed}-{cache_key(name, seed)}.onnx"
    info = _cached(path)
    if info is None:
        info = _build(name, seed, path)
    build = {k: info[k] for k in ("parameters", "bytes", "build_s")}
    return EmbeddedModel(name, path, str(info["sha256"]), seed, GENERATOR_VERSION, build)


def _note(path: Path) -> Path:
    return path.with_suffix(".json")


def _cached(path: Path) -> dict[str, Any] | None:
    """The note of a cached model whose file is the one the note describes, else None."""
    try:
        info: dict[str, Any] = json.loads(_note(path).read_text())
        stat = path.stat()
    except (OSError, ValueError):
        return None
    if stat.st_size != info.get("bytes"):
        return None
    return info if _sha256(path, stat.st_size, stat.st_mtime_ns) == info.get("sha256") else None


@functools.lru_cache(maxsize=16)
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    """Once per process and file version: hashing BERT-base's 440 MB takes about a second."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _build(name: str, seed: int, path: Path) -> dict[str, Any]:
    began = time.perf_counter()
    data = BUILDERS[name].build(seed)
    info: dict[str, Any] = {
        "name": name,
        "seed": seed,
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "parameters": parameter_count(data),
        "build_s": round(time.perf_counter() - began, 2),
        "generator_version": GENERATOR_VERSION,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, data)
    # the note after the file it vouches for
    write_atomically(_note(path), json.dumps(info, indent=1).encode())
    announce(
        f"embedded model {name} (seed {seed}) built in {info['build_s']:.1f} s:"
        f" {info['parameters'] / 1e6:.1f}M parameters, {len(data) / 1e6:.0f} MB at {path}"
    )
    return info
