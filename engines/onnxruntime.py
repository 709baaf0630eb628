"""ONNX Runtime adapter: CPU execution provider, CUDA and TensorRT providers on GPUs.

ORT falls back to the CPU provider without an error when a requested provider cannot
be created; this adapter checks the providers the session actually activated and fails
the load rather than report CPU numbers as GPU numbers.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt
import psutil

from harness.engine import (
    Arrays,
    Availability,
    Capabilities,
    EngineConfig,
    EngineError,
    Family,
    TensorSpec,
    reject_unknown_options,
)

if TYPE_CHECKING:
    import onnxruntime

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}

OPT_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}

OPTIONS = {
    "intra_op_threads": "threads inside one operator (default: physical cores)",
    "inter_op_threads": "threads across operators, parallel mode only (default: 1)",
    "graph_optimization": f"one of {', '.join(OPT_LEVELS)} (default: all)",
    "provider": "on cuda devices: cuda (default) or tensorrt",
    "allow_spinning": "0 or 1: intra-op workers busy-wait between runs (default: 0, see below)",
}

# ORT's default (spinning on) lets idle intra-op workers busy-wait after each run. They
# then hold the cores the in-process load generator needs to wake on time: on 2 cores
# its wake-up lag p99 went from 0.6 ms to 4 ms, and open-loop latency with it. Off by
# default here; set allow_spinning=1 to measure ORT with its own default.
DEFAULT_SPINNING = "0"

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


def _provider_for(device: str, options: Mapping[str, str]) -> str:
    if device == "cpu":
        return PROVIDERS["cpu"]
    return PROVIDERS[options.get("provider", "cuda")]


class OnnxRuntimeEngine:
    name: ClassVar[str] = "onnxruntime"
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.TENSOR, devices=frozenset({"cpu", "cuda"}), dynamic_shapes=True
    )

    def __init__(self, config: EngineConfig) -> None:
        self.validate_options(config.options)
        self.config = config
        self._session: onnxruntime.InferenceSession | None = None
        self._threads: dict[str, int] = {}
        self._spinning = False
        self._opt_level = config.options.get("graph_optimization", "all")

    @classmethod
    def probe(cls, device: str) -> Availability:
        if importlib.util.find_spec("onnxruntime") is None:
            return Availability(
                False, "onnxruntime is not installed (pip install 'inference-harness[onnxruntime]')"
            )
        import onnxruntime  # noqa: PLC0415  (lazy: importing the adapter must not need ORT)

        kind = device.split(":", 1)[0]
        available = onnxruntime.get_available_providers()
        if kind == "cpu":
            return Availability(True)
        if PROVIDERS["cuda"] not in available:
            return Availability(
                False,
                f"onnxruntime {onnxruntime.__version__} has no CUDAExecutionProvider"
                f" (providers: {', '.join(available)});"
                " install onnxruntime-gpu on a machine with an NVIDIA GPU",
            )
        return Availability(True)

    @classmethod
    def validate_options(cls, options: Mapping[str, str]) -> None:
        reject_unknown_options(options, OPTIONS)
        for key in ("intra_op_threads", "inter_op_threads"):
            if key in options and (not options[key].isdigit() or int(options[key]) < 1):
                raise ValueError(f"{key} must be a positive integer, got {options[key]!r}")
        if options.get("graph_optimization", "all") not in OPT_LEVELS:
            raise ValueError(f"graph_optimization must be one of {', '.join(OPT_LEVELS)}")
        if options.get("provider", "cuda") not in ("cuda", "tensorrt"):
            raise ValueError("provider must be cuda or tensorrt")
        if options.get("allow_spinning", DEFAULT_SPINNING) not in ("0", "1"):
            raise ValueError("allow_spinning must be 0 or 1")

    def _session_options(self) -> onnxruntime.SessionOptions:
        import onnxruntime  # noqa: PLC0415

        so = onnxruntime.SessionOptions()
        intra = int(
            self.config.options.get("intra_op_threads", psutil.cpu_count(logical=False) or 1)
        )
        inter = int(self.config.options.get("inter_op_threads", 1))
        so.intra_op_num_threads = intra
        so.inter_op_num_threads = inter
        so.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = getattr(
            onnxruntime.GraphOptimizationLevel, OPT_LEVELS[self._opt_level]
        )
        so.log_severity_level = 3  # errors only: fallback warnings are checked explicitly below
        spinning = self.config.options.get("allow_spinning", DEFAULT_SPINNING)
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
        providers: list[Any] = [wanted]
        if wanted != PROVIDERS["cpu"]:
            index = self.config.device.partition(":")[2] or "0"
            providers = [(wanted, {"device_id": index})]
        try:
            session = onnxruntime.InferenceSession(
                str(self.config.model), sess_options=self._session_options(), providers=providers
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
        outputs = self.session.run(names, dict(inputs))
        return dict(zip(names, outputs, strict=True))

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
            info["active_providers"] = self._session.get_providers()
            info["provider_options"] = _strs(self._session.get_provider_options())
            info["inputs"] = [_spec_json(s) for s in self.input_specs()]
            info["outputs"] = [_spec_json(s) for s in self.output_specs()]
        return info

    def close(self) -> None:
        self._session = None


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
