"""PyTorch baseline for the tensor workloads: eager, ``torch.compile`` and CUDA graphs.

Every engine decision is asked against plain PyTorch, so this adapter serves the same
model files as the others: an ONNX file of the operators ``engines.torch_onnx`` maps
(the embedded models, with the same weights), or a ``torch.export`` program (``.pt2``).

Modes: ``eager`` calls the module under ``inference_mode``; ``compile`` wraps it in
``torch.compile`` (compiled on the first call of each new shape, so warm-up pays for it);
``cudagraphs`` (CUDA only) captures one graph per input shape into static buffers and
replays it. On a GPU each ``infer`` copies inputs to the device, runs, and copies the
outputs back with a synchronizing ``.cpu()``: the host clock around ``infer`` sees the
whole request, and CUDA events split it into ``h2d``, ``compute`` and ``d2h`` device
times (``device_times()``, for the last call).

float32 on cuda is IEEE fp32, as on the other engines: torch lets cuDNN convolutions use
TF32 by default, so the adapter turns TF32 off while a float32 engine is loaded and
records the flags in ``describe()`` (``effective.tf32``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt
import psutil

from engines.cudatiming import MARKS, stage_times
from engines.onnxinfo import read_specs
from harness.engine import (
    Arrays,
    Availability,
    Capabilities,
    EngineConfig,
    EngineError,
    Family,
    TensorSpec,
    check_inputs,
)
from harness.engine.optionschema import OptionSchema, choice, integer

if TYPE_CHECKING:
    import torch

MODES = ("eager", "compile", "cudagraphs")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
DTYPES = ("float32", "float16", "bfloat16")
OPTIONS = OptionSchema(
    choice("mode", "how the module runs (cudagraphs: cuda only)", MODES, default="eager"),
    choice("compile_mode", "torch.compile mode", COMPILE_MODES, default="default"),
    choice(
        "dtype",
        "compute dtype of weights and float inputs (float32: on cuda IEEE fp32, TF32 off for"
        " matmuls and cuDNN convolutions)",
        DTYPES,
        default="float32",
    ),
    integer("threads", "torch.set_num_threads on cpu (default: physical cores)"),
)


def effective_options(options: Mapping[str, str], device: str) -> dict[str, Any]:
    """Options with defaults filled in, checked against the device (pure: unit-tested)."""
    o = OPTIONS.resolve(options)
    if o["mode"] == "cudagraphs" and not device.startswith("cuda"):
        raise ValueError("mode=cudagraphs needs a cuda device")
    threads = o.get("threads")
    return {
        "mode": o["mode"],
        "compile_mode": o["compile_mode"],
        "dtype": o["dtype"],
        "threads": int(threads) if threads else (psutil.cpu_count(logical=False) or 1),
    }


def strict_fp32(backends: Any) -> dict[str, Any]:
    """Make float32 cuBLAS matmuls and cuDNN convolutions true IEEE fp32, not TF32, so fp32
    means the same here as on the other engines; returns the settings replaced, for
    ``restore_fp32``. ``backends`` is ``torch.backends``; the flags are process-wide.

    torch 2.13 checks its legacy ``allow_tf32`` flags against the newer ``fp32_precision``
    ones and raises where they disagree (inductor reads ``cudnn.allow_tf32``), so both are
    set: the legacy ones first, then ``ieee`` for conv and RNN, explicitly, so a global
    ``torch.backends.fp32_precision = "tf32"`` does not reach them through ``none``."""
    saved = _fp32_settings(backends)
    backends.cuda.matmul.allow_tf32 = False  # also sets cuda.matmul.fp32_precision "ieee"
    backends.cudnn.allow_tf32 = False
    backends.cudnn.conv.fp32_precision = "ieee"
    backends.cudnn.rnn.fp32_precision = "ieee"
    return saved


def _fp32_settings(backends: Any) -> dict[str, Any]:
    return {
        "legacy_matmul": _legacy_flag(backends.cuda.matmul),
        "legacy_cudnn": _legacy_flag(backends.cudnn),
        "matmul": backends.cuda.matmul.fp32_precision,
        "conv": backends.cudnn.conv.fp32_precision,
        "rnn": backends.cudnn.rnn.fp32_precision,
    }


def _legacy_flag(holder: Any) -> bool | None:
    try:
        return bool(holder.allow_tf32)
    except RuntimeError:  # the process mixed the two APIs; torch will not say
        return None


def restore_fp32(backends: Any, saved: Mapping[str, Any]) -> None:
    """Put back what ``strict_fp32`` replaced: the legacy flags (which reset the newer
    ones), then the newer ones as they were."""
    for holder, key in ((backends.cuda.matmul, "legacy_matmul"), (backends.cudnn, "legacy_cudnn")):
        if saved[key] is not None:
            holder.allow_tf32 = saved[key]
    backends.cuda.matmul.fp32_precision = saved["matmul"]
    backends.cudnn.conv.fp32_precision = saved["conv"]
    backends.cudnn.rnn.fp32_precision = saved["rnn"]


def tf32_flags(backends: Any) -> dict[str, bool]:
    """Whether float32 matmuls and cuDNN convolutions may use TF32, resolved as torch does
    it: an op's ``none`` defers to the cuda backend's setting, then to the global one."""

    def allowed(op: str) -> bool:
        chain = (op, backends.cudnn.fp32_precision, backends.fp32_precision)
        return next((p for p in chain if p != "none"), "ieee") == "tf32"

    return {
        "matmul": allowed(backends.cuda.matmul.fp32_precision),
        "cudnn": allowed(backends.cudnn.conv.fp32_precision),
    }


class _StrictFp32:
    """The TF32 flags are process-wide and engines may overlap (a reference run beside
    the one measured), so the first fp32 cuda engine saves them and the last to close
    puts them back."""

    holders = 0
    saved: ClassVar[dict[str, Any]] = {}

    @classmethod
    def hold(cls, backends: Any) -> None:
        saved = strict_fp32(backends)
        if cls.holders == 0:
            cls.saved = saved
        cls.holders += 1

    @classmethod
    def release(cls, backends: Any) -> None:
        cls.holders -= 1
        if cls.holders == 0:
            restore_fp32(backends, cls.saved)


class TorchEngine:
    name: ClassVar[str] = "torch"
    option_schema: ClassVar[OptionSchema] = OPTIONS
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.TENSOR, devices=frozenset({"cpu", "cuda"}), dynamic_shapes=True
    )

    def __init__(self, config: EngineConfig) -> None:
        self.validate_options(config.options)
        self.config = config
        self.settings = effective_options(config.options, config.device)
        self._module: Any = None
        self._runner: Any = None
        self._inputs: tuple[TensorSpec, ...] = ()
        self._outputs: tuple[TensorSpec, ...] = ()
        self._graphs: dict[Any, Any] = {}
        self._last: dict[str, float] = {}
        self._strict_fp32 = False

    @classmethod
    def probe(cls, device: str) -> Availability:
        if importlib.util.find_spec("torch") is None:
            return Availability(
                False, "torch is not installed (pip install 'inference-harness[torch]')"
            )
        if device.startswith("cuda"):
            import torch  # noqa: PLC0415

            if not torch.cuda.is_available():
                return Availability(
                    False,
                    f"torch {torch.__version__} sees no CUDA device"
                    f" (built for CUDA {torch.version.cuda or 'none: a CPU build'})",
                )
        return Availability(True)

    @classmethod
    def validate_options(cls, options: Mapping[str, str]) -> None:
        OPTIONS.validate(options)

    @classmethod
    def precision_options(cls, name: str, device: str) -> dict[str, str]:
        dtypes = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
        if name not in dtypes:
            raise ValueError(
                f"torch has no {name} path here (int8 needs a quantization flow such as"
                " torch.ao or torchao, which this adapter does not run)"
            )
        return {"dtype": dtypes[name]}

    # -- lifecycle ----------------------------------------------------------------------------

    def load(self) -> None:
        import torch  # noqa: PLC0415

        path = self.config.model
        if not path.is_file():
            raise EngineError(f"model {path} is not a file (.onnx or a torch.export .pt2)")
        if not self.config.device.startswith("cuda"):
            torch.set_num_threads(self.settings["threads"])
        try:
            module, self._inputs, self._outputs = _load_module(path)
        except (ValueError, RuntimeError, OSError) as exc:
            raise EngineError(f"torch could not load {path}: {exc}") from exc
        dtype = getattr(torch, self.settings["dtype"])
        if self._cuda() and dtype == torch.float32 and not self._strict_fp32:
            _StrictFp32.hold(torch.backends)
            self._strict_fp32 = True
        self._module = _eval(module.to(device=self._device(), dtype=dtype))
        if hasattr(self._module, "float_dtype"):
            self._module.float_dtype = dtype
        self._runner = self._module
        if self.settings["mode"] == "compile":
            self._runner = torch.compile(self._module, mode=self.settings["compile_mode"])

    def _device(self) -> str:
        return self.config.device if self._cuda() else "cpu"

    def _cuda(self) -> bool:
        return self.config.device.startswith("cuda")

    def close(self) -> None:
        self._module = self._runner = None
        self._graphs.clear()
        if self._cuda() and importlib.util.find_spec("torch"):
            import torch  # noqa: PLC0415

            torch.cuda.empty_cache()
            if self._strict_fp32:
                _StrictFp32.release(torch.backends)
                self._strict_fp32 = False

    def describe(self) -> dict[str, Any]:
        import torch  # noqa: PLC0415

        info: dict[str, Any] = {
            "engine": self.name,
            "version": str(torch.__version__),
            "device": self.config.device,
            "requested": dict(self.config.options),
            "model": {"path": str(self.config.model), "format": self.config.model.suffix},
        }
        if self._module is not None:
            info["effective"] = self.settings | {
                "torch_threads": torch.get_num_threads(),
                "cuda": torch.version.cuda,
                "captured_graphs": len(self._graphs),
            }
            if self._cuda():
                info["gpu"] = torch.cuda.get_device_name(self._device())
                # what fp32 matmuls and convolutions ran as (TF32 or IEEE), this run
                info["effective"]["tf32"] = tf32_flags(torch.backends)
        return info

    # -- tensors ------------------------------------------------------------------------------

    def input_specs(self) -> tuple[TensorSpec, ...]:
        self._loaded()
        return self._inputs

    def output_specs(self) -> tuple[TensorSpec, ...]:
        self._loaded()
        return self._outputs

    def _loaded(self) -> None:
        if self._module is None:
            raise EngineError("engine not loaded: call load() first")

    def warmup(self, inputs: Arrays, iterations: int) -> None:
        for _ in range(iterations):
            self.infer(inputs)

    def device_times(self) -> dict[str, float]:
        """Seconds of the last ``infer`` on the device (CUDA events); empty on a CPU."""
        return dict(self._last)

    def infer(self, inputs: Arrays) -> dict[str, npt.NDArray[Any]]:
        import torch  # noqa: PLC0415

        self._loaded()
        arrays = check_inputs(self._inputs, inputs)
        cuda = self.config.device.startswith("cuda")
        events = [torch.cuda.Event(enable_timing=True) for _ in range(MARKS)] if cuda else []
        with torch.inference_mode():
            _mark(events, 0)
            tensors = [self._to_device(a) for a in arrays]
            _mark(events, 1)
            outs = self._run(tensors)
            _mark(events, 2)
            host = [o.to("cpu") for o in outs]  # synchronizes with the device
            _mark(events, 3)
        if events:
            events[-1].synchronize()
            self._last = stage_times(lambda i, j: events[i].elapsed_time(events[j]))
        return {
            spec.name: t.to(_torch_dtype(spec.dtype)).numpy()
            for spec, t in zip(self._outputs, host, strict=True)
        }

    def _to_device(self, array: npt.NDArray[Any]) -> torch.Tensor:
        import torch  # noqa: PLC0415

        tensor = torch.from_numpy(np.ascontiguousarray(array)).to(self._device())
        if tensor.is_floating_point():
            tensor = tensor.to(getattr(torch, self.settings["dtype"]))
        return tensor

    def _run(self, tensors: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if self.settings["mode"] == "cudagraphs":
            return self._replay(tensors)
        outs = self._runner(*tensors)
        return tuple(outs) if isinstance(outs, list | tuple) else (outs,)

    def _replay(self, tensors: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """One captured graph per input shape, fed through its static input buffers."""
        import torch  # noqa: PLC0415

        key = tuple((tuple(t.shape), t.dtype) for t in tensors)
        if key not in self._graphs:
            static = [t.clone() for t in tensors]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # allocations settle before capture
                for _ in range(2):
                    self._module(*static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    out = self._module(*static)
            except RuntimeError as exc:
                raise EngineError(f"CUDA graph capture failed for shapes {key}: {exc}") from exc
            self._graphs[key] = (graph, static, tuple(out) if isinstance(out, tuple) else (out,))
        graph, static, outs = self._graphs[key]
        for buffer, tensor in zip(static, tensors, strict=True):
            buffer.copy_(tensor)
        graph.replay()
        return tuple(o.clone() for o in outs)


def _eval(module: Any) -> Any:
    try:
        return module.eval()
    except NotImplementedError:  # exported programs refuse eval(); they are inference-only
        return module


def _mark(events: list[Any], i: int) -> None:
    if events:
        events[i].record()


def _torch_dtype(dtype: np.dtype[Any]) -> Any:
    import torch  # noqa: PLC0415

    return getattr(torch, np.dtype(dtype).name)


def export_specs(program: Any) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """TensorSpecs of a ``torch.export`` program's user inputs and outputs (symbolic
    sizes are dynamic dims)."""
    nodes = {n.name: n for n in program.graph.nodes}
    sig = program.graph_signature

    def spec(name: str, label: str) -> TensorSpec:
        val = nodes[name].meta["val"]
        dims = tuple(d if isinstance(d, int) else None for d in val.shape)
        return TensorSpec(label, np.dtype(str(val.dtype).removeprefix("torch.")), dims)

    inputs = tuple(spec(n, n) for n in sig.user_inputs)
    outputs = tuple(spec(str(n), f"output{i}") for i, n in enumerate(sig.user_outputs))
    return inputs, outputs


def _load_module(path: Path) -> tuple[Any, tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    if path.suffix == ".onnx":
        from engines.torch_onnx import OnnxModule  # noqa: PLC0415

        inputs, outputs = read_specs(path)
        return OnnxModule(path), inputs, outputs
    if path.suffix == ".pt2":
        import torch  # noqa: PLC0415

        program = torch.export.load(str(path))
        inputs, outputs = export_specs(program)
        return program.module(), inputs, outputs
    raise ValueError(f"{path.name}: the torch adapter loads .onnx or .pt2 (torch.export) files")
