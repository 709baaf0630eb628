"""ONNX Runtime adapter: CPU execution provider, CUDA and TensorRT providers on GPUs.

ORT falls back to the CPU provider without an error when a requested provider cannot
be created; this adapter checks the providers the session actually activated and fails
the load rather than report CPU numbers as GPU numbers. Before a GPU session it makes the
CUDA (and TensorRT) libraries the provider links loadable, and names what is missing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt
import psutil

from engines import ort_gpu, trt_profiles
from harness.engine import (
    Arrays,
    Availability,
    Capabilities,
    EngineConfig,
    EngineError,
    Family,
    TensorSpec,
)
from harness.engine.optionschema import OptionSchema, choice, custom, flag, integer, text
from harness.session.config import cache_root

if TYPE_CHECKING:
    import onnxruntime

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": ort_gpu.CUDA_PROVIDER,
    "tensorrt": ort_gpu.TENSORRT_PROVIDER,
}

OPT_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}

# ORT's default (spinning on) lets idle intra-op workers busy-wait after each run. They
# then hold the cores the in-process load generator needs to wake on time: on 2 cores
# its wake-up lag p99 went from 0.6 ms to 4 ms, and open-loop latency with it. Off by
# default here; set allow_spinning=1 to measure ORT with its own default.
DEFAULT_SPINNING = "0"


def _one_trt_profile(spec: str) -> object:
    profiles = trt_profiles.parse_ranges(spec)
    if len(profiles) != 1:
        raise ValueError("trt_profiles: onnxruntime's TensorRT provider takes one profile")
    return profiles


OPTIONS = OptionSchema(
    integer("intra_op_threads", "threads inside one operator (default: physical cores)"),
    integer("inter_op_threads", "threads across operators, parallel mode only", default="1"),
    choice("graph_optimization", "graph optimization level", tuple(OPT_LEVELS), default="all"),
    choice("provider", "execution provider on cuda devices", ("cuda", "tensorrt"), default="cuda"),
    flag(
        "allow_spinning",
        "intra-op workers busy-wait between runs (ORT's default 1; off here: spinning"
        " workers hold the cores the load generator needs)",
        default=DEFAULT_SPINNING,
    ),
    flag("cuda_graph", "on cuda: capture and replay a CUDA graph per input shape"),
    flag("tf32", "on the cuda provider: TF32 matmuls (ORT's default 1; here 0, fp32 as asked)"),
    flag("trt_fp16", "on the tensorrt provider: allow fp16 kernels"),
    custom(
        "trt_profiles",
        "the tensorrt provider's one optimization profile",
        _one_trt_profile,
        "NAME=MIN:OPT:MAX[,...]",
        default=trt_profiles.DEFAULT_PROFILE,
    ),
    custom(
        "dims",
        "sizes of named dynamic dims for the tensorrt provider's profile",
        trt_profiles.parse_dims,
        "NAME=N[,...]",
    ),
    text(
        "trt_cache_dir",
        "tensorrt provider engine and timing caches (default $HARNESS_CACHE_DIR/ort-trt)",
    ),
    choice(
        "quantize",
        "dynamic quantization (onnxruntime.quantization: int8 weights, uint8 activations"
        " quantized per call), of a cached copy of the model",
        ("int8",),
    ),
    choice("convert", "a cached fp16 copy of the model, inputs and outputs kept fp32", ("fp16",)),
)

_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}

# The run option that selects a CUDA graph; -1 is ORT's kCudaGraphAnnotationSkip: neither
# capture nor replay in that run. ORT reserves 0 (its default when the option is absent)
# for itself, so the adapter's graphs are numbered from 1.
GRAPH_ID = "gpu_graph_id"
GRAPH_SKIP = "-1"


def _provider_for(device: str, options: Mapping[str, str]) -> str:
    if device == "cpu":
        return PROVIDERS["cpu"]
    return PROVIDERS[OPTIONS.resolve(options)["provider"]]


def _flag(resolved: Mapping[str, str], key: str) -> str:
    return "1" if resolved[key] == "1" else "0"


def provider_list(
    device: str,
    options: Mapping[str, str],
    cache_dir: Path,
    specs: tuple[TensorSpec, ...] = (),
) -> list[tuple[str, dict[str, str]]]:
    """Pure: the providers and their options for ``device``, first the one asked for.

    The TensorRT provider is followed by the CUDA provider, so nodes TensorRT cannot take
    run on the GPU (never silently on the CPU: the load checks what was activated)."""
    if device == "cpu":
        return [(PROVIDERS["cpu"], {})]
    index = device.partition(":")[2] or "0"
    o = OPTIONS.resolve(options)
    cuda = {
        "device_id": index,
        "enable_cuda_graph": _flag(o, "cuda_graph"),
        "use_tf32": _flag(o, "tf32"),
        "cudnn_conv_algo_search": "EXHAUSTIVE",
    }
    if o["provider"] == "cuda":
        return [(PROVIDERS["cuda"], cuda)]
    trt = {
        "device_id": index,
        "trt_fp16_enable": _flag(o, "trt_fp16"),
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": str(cache_dir),
        "trt_timing_cache_enable": "1",
        "trt_timing_cache_path": str(cache_dir),
        "trt_cuda_graph_enable": _flag(o, "cuda_graph"),
    }
    if specs and any(s.dynamic_dims for s in specs):
        dims = trt_profiles.parse_dims(options.get("dims"))
        (profile,) = trt_profiles.derive_all(specs, options.get("trt_profiles"), dims)
        trt |= profile.ort_options()
    return [(PROVIDERS["tensorrt"], trt), (PROVIDERS["cuda"], cuda | {"enable_cuda_graph": "0"})]


def _graph_options(graph_id: str) -> Any:
    import onnxruntime  # noqa: PLC0415

    options = onnxruntime.RunOptions()
    options.add_run_config_entry(GRAPH_ID, graph_id)
    return options


@dataclass(frozen=True)
class _GraphSlot:
    """One input shape's CUDA graph: its binding, the device buffers bound to it (fixed
    addresses, refilled in place) and the run options naming its graph."""

    binding: Any
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    graph_id: int
    run_options: Any


class OnnxRuntimeEngine:
    name: ClassVar[str] = "onnxruntime"
    option_schema: ClassVar[OptionSchema] = OPTIONS
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.TENSOR, devices=frozenset({"cpu", "cuda"}), dynamic_shapes=True
    )

    def __init__(self, config: EngineConfig) -> None:
        self.validate_options(config.options)
        self.config = config
        self._session: onnxruntime.InferenceSession | None = None
        self._threads: dict[str, int] = {}
        self._spinning = False
        self._opt_level = OPTIONS.resolve(config.options)["graph_optimization"]
        self._graphs: dict[Any, _GraphSlot] = {}
        self._loaded_model: Path | None = None
        self._int8_prep: list[str] = []
        self._preload: list[str] | None = None  # what ORT's preload_dlls printed

    @classmethod
    def probe(cls, device: str) -> Availability:
        if importlib.util.find_spec("onnxruntime") is None:
            return Availability(
                False, "onnxruntime is not installed (pip install 'inference-harness[onnxruntime]')"
            )
        import onnxruntime  # noqa: PLC0415  (lazy: importing the adapter must not need ORT)

        if device.split(":", 1)[0] == "cpu":
            return Availability(True)
        reason = ort_gpu.cuda_unavailable(onnxruntime, ort_gpu.driver_cuda_version())
        return Availability(reason is None, reason or "")

    @classmethod
    def validate_options(cls, options: Mapping[str, str]) -> None:
        OPTIONS.validate(options)
        # the one rule between options: both would pick the model file that runs
        if "quantize" in options and "convert" in options:
            raise ValueError("quantize and convert are alternatives: give one")

    @classmethod
    def precision_options(cls, name: str, device: str) -> dict[str, str]:
        if name == "fp32":
            return {}
        if name == "int8":
            if device != "cpu":
                raise ValueError(
                    "dynamic int8 (ConvInteger / MatMulInteger) has no CUDA kernels in"
                    " onnxruntime: those nodes would run on the CPU; use TensorRT for int8"
                )
            return {"quantize": "int8"}
        if name == "fp16":
            if device == "cpu":
                raise ValueError(
                    "onnxruntime's CPU provider has few fp16 kernels (an fp16 model runs"
                    " through casts to fp32): fp16 is measured on cuda"
                )
            return {"convert": "fp16"}
        raise ValueError(f"onnxruntime has no {name} path (models are fp32, fp16 or int8)")

    def _derived_model(self) -> Path:
        """The model the session loads: the given file, or its cached int8 / fp16 copy."""
        source = self.config.model
        kind = self.config.options.get("quantize") or self.config.options.get("convert")
        if not kind:
            return source
        if kind == "int8":
            from engines.onnxprep import quantization_blockers  # noqa: PLC0415

            self._int8_prep = quantization_blockers(source)
        digest = _sha256(source) or "unreadable"
        name = f"{source.stem}-{digest[:16]}-{kind}{'-prep' if self._int8_prep else ''}.onnx"
        target = cache_root() / "ort-derived" / name
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".tmp-{os.getpid()}-{target.name}")
            if kind == "int8":
                _quantize(source, tmp, prepare=bool(self._int8_prep))
            else:
                import onnx  # noqa: PLC0415
                from onnxruntime.transformers.float16 import (  # noqa: PLC0415
                    convert_float_to_float16,
                )

                half = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
                onnx.save(half, str(tmp))
            os.replace(tmp, target)
        return target

    def _session_options(self) -> onnxruntime.SessionOptions:
        import onnxruntime  # noqa: PLC0415

        so = onnxruntime.SessionOptions()
        resolved = OPTIONS.resolve(self.config.options)
        intra = int(resolved.get("intra_op_threads", psutil.cpu_count(logical=False) or 1))
        inter = int(resolved["inter_op_threads"])
        so.intra_op_num_threads = intra
        so.inter_op_num_threads = inter
        so.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = getattr(
            onnxruntime.GraphOptimizationLevel, OPT_LEVELS[self._opt_level]
        )
        so.log_severity_level = 3  # errors only: fallback warnings are checked explicitly below
        spinning = resolved["allow_spinning"]
        so.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        so.add_session_config_entry("session.inter_op.allow_spinning", spinning)
        self._threads = {"intra_op": intra, "inter_op": inter}
        self._spinning = spinning == "1"
        return so

    def load(self) -> None:
        import onnxruntime  # noqa: PLC0415

        if not self.config.model.is_file():
            raise EngineError(f"model {self.config.model} is not an ONNX file")
        wanted = _provider_for(self.config.device, self.config.options)
        specs: tuple[TensorSpec, ...] = ()
        if wanted == PROVIDERS["tensorrt"]:
            from engines.onnxinfo import read_specs  # noqa: PLC0415

            specs = read_specs(self.config.model)[0]
        try:
            providers: list[Any] = provider_list(
                self.config.device, self.config.options, self._trt_cache(), specs
            )
        except ValueError as exc:
            raise EngineError(str(exc)) from exc
        if wanted != PROVIDERS["cpu"]:
            self._preload = ort_gpu.prepare_gpu_libraries(onnxruntime, wanted)
        try:
            self._loaded_model = self._derived_model()
            # enable_fallback=0: a provider that fails to register (the TensorRT provider
            # without TensorRT) raises instead of Python's retry with the CUDA provider on
            # its default options (InferenceSession reads only the **kwargs it knows)
            session = onnxruntime.InferenceSession(
                str(self._loaded_model),
                sess_options=self._session_options(),
                providers=providers,
                enable_fallback=0,
            )
        except Exception as exc:
            raise EngineError(f"onnxruntime could not load {self.config.model}: {exc}") from exc
        active = session.get_providers()
        if not active or active[0] != wanted:
            raise EngineError(
                f"requested {wanted} but onnxruntime activated {active}: it fell back silently;"
                " refusing to report these numbers as " + self.config.device
            )
        self._session = session

    @property
    def session(self) -> onnxruntime.InferenceSession:
        if self._session is None:
            raise EngineError("engine not loaded: call load() first")
        return self._session

    def _specs(self, nodes: list[Any]) -> tuple[TensorSpec, ...]:
        specs = []
        for node in nodes:
            if node.type not in _DTYPES:
                raise EngineError(f"unsupported tensor type {node.type} for {node.name}")
            shape = tuple(d if isinstance(d, int) else (d or None) for d in node.shape)
            specs.append(TensorSpec(node.name, np.dtype(_DTYPES[node.type]), shape))
        return tuple(specs)

    def input_specs(self) -> tuple[TensorSpec, ...]:
        return self._specs(self.session.get_inputs())

    def output_specs(self) -> tuple[TensorSpec, ...]:
        return self._specs(self.session.get_outputs())

    def warmup(self, inputs: Arrays, iterations: int) -> None:
        for _ in range(iterations):
            self.infer(inputs)

    def infer(self, inputs: Arrays) -> dict[str, npt.NDArray[Any]]:
        names = [o.name for o in self.session.get_outputs()]
        if self.config.device == "cpu":
            outputs = self.session.run(names, dict(inputs))
            return dict(zip(names, outputs, strict=True))
        if self.config.options.get("cuda_graph", "0") == "1":
            return self._replay(inputs, names)
        return self._bound(inputs, names)

    def _device_index(self) -> int:
        return int(self.config.device.partition(":")[2] or 0)

    def _bound(
        self, inputs: Arrays, names: list[str], run_options: Any = None
    ) -> dict[str, npt.NDArray[Any]]:
        """IOBinding: inputs copied to the device explicitly, outputs left there by ORT and
        copied back at the end, so no copy happens unseen inside ``run``."""
        from onnxruntime import OrtValue  # noqa: PLC0415

        index = self._device_index()
        binding = self.session.io_binding()
        for name, array in inputs.items():
            binding.bind_ortvalue_input(name, OrtValue.ortvalue_from_numpy(array, "cuda", index))
        for name in names:
            binding.bind_output(name, "cuda", index)
        if run_options is None:
            self.session.run_with_iobinding(binding)
        else:
            self.session.run_with_iobinding(binding, run_options)
        return dict(zip(names, binding.copy_outputs_to_cpu(), strict=True))

    def _replay(self, inputs: Arrays, names: list[str]) -> dict[str, npt.NDArray[Any]]:
        """CUDA graphs need the same device addresses every run: one set of input and
        output buffers and one ``gpu_graph_id`` per input shape. ORT captures a graph id's
        graph in the first run that names it and replays it in every later one."""
        key = tuple((n, a.shape, a.dtype.str) for n, a in sorted(inputs.items()))
        if key not in self._graphs:
            self._graphs[key] = self._graph_slot(inputs, names, len(self._graphs) + 1)
        slot = self._graphs[key]
        for name, array in inputs.items():
            slot.inputs[name].update_inplace(np.ascontiguousarray(array))
        self.session.run_with_iobinding(slot.binding, slot.run_options)
        return {name: slot.outputs[name].numpy() for name in names}

    def _graph_slot(self, inputs: Arrays, names: list[str], graph_id: int) -> _GraphSlot:
        """Buffers for a new input shape. The run that finds the output shapes must neither
        capture nor replay (gpu_graph_id -1): without run options ORT would capture graph 0
        on its throwaway buffers there, and replay that graph, stale shapes and freed
        buffers, in the next shape's probe."""
        from onnxruntime import OrtValue  # noqa: PLC0415

        index = self._device_index()
        shapes = self._bound(inputs, names, _graph_options(GRAPH_SKIP))
        in_values = {n: OrtValue.ortvalue_from_numpy(a, "cuda", index) for n, a in inputs.items()}
        out_values = {
            n: OrtValue.ortvalue_from_shape_and_type(a.shape, a.dtype, "cuda", index)
            for n, a in shapes.items()
        }
        binding = self.session.io_binding()
        for name, value in in_values.items():
            binding.bind_ortvalue_input(name, value)
        for name, value in out_values.items():
            binding.bind_ortvalue_output(name, value)
        return _GraphSlot(binding, in_values, out_values, graph_id, _graph_options(str(graph_id)))

    def _trt_cache(self) -> Path:
        return Path(self.config.options.get("trt_cache_dir") or cache_root() / "ort-trt")

    def describe(self) -> dict[str, Any]:
        import onnxruntime  # noqa: PLC0415

        info: dict[str, Any] = {
            "engine": self.name,
            "version": onnxruntime.__version__,
            "device": self.config.device,
            "requested_provider": _provider_for(self.config.device, self.config.options),
            "threads": dict(self._threads),
            "allow_spinning": self._spinning,
            "graph_optimization": self._opt_level,
            "execution_mode": "sequential",
            "model": {"path": str(self.config.model), "sha256": _sha256(self.config.model)},
        }
        if self._session is not None:
            info["effective"] = self._effective(onnxruntime, self._session)
            info["active_providers"] = self._session.get_providers()
            info["provider_options"] = _strs(self._session.get_provider_options())
            info["inputs"] = [_spec_json(s) for s in self.input_specs()]
            info["outputs"] = [_spec_json(s) for s in self.output_specs()]
        return info

    def _effective(self, ort: Any, session: Any) -> dict[str, Any]:
        """The settings the loaded session runs with, as the session reports them."""
        provider = session.get_providers()[0]
        effective: dict[str, Any] = {
            "model_loaded": str(self._loaded_model),
            "precision": {
                "quantize": "dynamic int8 (weights int8, activations uint8)",
                "convert": "fp16 (io kept fp32)",
            }.get(
                next((k for k in ("quantize", "convert") if k in self.config.options), ""),
                "as the model",
            ),
            "providers": session.get_providers(),
            **({"int8_prepared_for": self._int8_prep} if self._int8_prep else {}),
            "threads": dict(self._threads),
            "allow_spinning": self._spinning,
            "graph_optimization": self._opt_level,
            # comparable across engines: may fp32 matmuls and convolutions run as TF32
            "tf32": ort_gpu.effective_tf32(provider, session.get_provider_options()),
        }
        if provider == PROVIDERS["tensorrt"]:
            effective["tf32_source"] = "TensorRT's builder default (ORT has no option for it)"
        if provider != PROVIDERS["cpu"]:
            trt = provider == PROVIDERS["tensorrt"]
            effective["cuda_libraries"] = ort_gpu.cuda_libraries_record(ort, trt, self._preload)
        return effective

    def close(self) -> None:
        self._graphs.clear()
        self._session = None


def _quantize(source: Path, target: Path, *, prepare: bool) -> None:
    """Dynamic int8 of ``source`` into ``target``. ``prepare``: the weights are not plain
    initializers (listed as graph inputs, as IR < 4 requires, or computed by
    ``ConstantOfShape`` nodes, as in ONNX's own test models), which ``quantize_dynamic``
    refuses ("Expected conv1_w_0 to be an initializer"). The initializers are dropped
    from the graph inputs first, so that ORT's ``quant_pre_process`` may fold the
    computed weights into initializers; both in temporary copies beside ``target``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415

    steps: list[Path] = []
    try:
        if prepare:
            from onnxruntime.quantization.shape_inference import (  # noqa: PLC0415
                quant_pre_process,
            )

            from engines.onnxprep import drop_initializer_inputs  # noqa: PLC0415

            steps = [target.with_name(f"{target.name}.{step}.onnx") for step in ("in", "fold")]
            drop_initializer_inputs(source, steps[0])
            # symbolic shape inference needs sympy, which onnxruntime does not install
            quant_pre_process(str(steps[0]), str(steps[1]), skip_symbolic_shape=True)
            source = steps[1]
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
    finally:
        for step in steps:
            step.unlink(missing_ok=True)


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _strs(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _strs(v) for k, v in value.items()}
    return str(value)


def _spec_json(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "dtype": spec.dtype.name, "shape": list(spec.shape)}
