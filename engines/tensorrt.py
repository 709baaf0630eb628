"""TensorRT: an engine built from ONNX with optimization profiles, cached, run with
``execute_async_v3`` on its own CUDA stream.

Build (``engines.trt_build``): the options give a build plan, and the ONNX model with
optimization profiles from ``engines.trt_profiles`` a serialized engine, cached under a
key of ONNX hash, TensorRT version, GPU, profiles and builder settings; fp32 means fp32
(TF32 cleared unless ``tf32=1``), and fp16 is TensorRT 10's builder flag, refused on
TensorRT 11. Build time is its own figure in ``describe()`` (``build_s``), never inside a
latency.

Run: device buffers and pinned host buffers are allocated once, at the largest shapes
of every profile. Each ``infer`` first copies the inputs into the pinned buffers (host
work, untimed), then records the start event and issues the host-to-device copies, the
enqueue and the copies back, and synchronizes the stream. CUDA events around the three
parts give ``h2d``, ``compute`` and ``d2h`` device times (``device_times()``); on an
idle stream they also hold the Python time spent issuing each part.

CUDA graphs (``cuda_graph=1``): one graph per (profile, input shapes), on the one
execution context. TensorRT applies a profile switch or a new input shape at the next
``enqueueV3`` (its CUDA-graph guide: "Call enqueueV3() once after an input shape change
to update internal state"), which a graph replay is not. So after any change the adapter
runs one plain ``execute_async_v3`` before capturing or replaying, outside the timed
events (its outputs are overwritten by the replay); a run that alternates shapes pays
that enqueue on every change, and ``describe()`` counts them (``cuda_graph_flushes``).

CUDA runtime: cuda-python's ``cuda.bindings.runtime``, whose CUDA major should match the
TensorRT wheel's (``tensorrt-cu12`` with ``cuda-python<13``): a CUDA 13 runtime needs a
driver >= 580, and the probe says so when the driver is older or missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib
import importlib.util
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from engines import trt_profiles
from engines.cudatiming import MARKS, stage_times
from engines.onnxinfo import read_specs
from engines.trt_build import (
    NO_FP16,
    OPTIONS,
    BuildPlan,
    build_engine,
    build_plan,
    known_builder_flags,
)
from harness.engine import (
    Arrays,
    Availability,
    Capabilities,
    EngineConfig,
    EngineError,
    Family,
    TensorSpec,
    check_inputs,
    installed_version,
)
from harness.engine.optionschema import OptionSchema
from harness.results.store import replace
from harness.session.config import cache_root

# The TensorRT wheels, bindings first (they carry the library the adapter imports).
TENSORRT_DISTRIBUTIONS = (
    "tensorrt-cu12-bindings",
    "tensorrt-cu13-bindings",
    "tensorrt-cu12",
    "tensorrt-cu13",
    "tensorrt",
)
# The oldest driver each CUDA major's runtime runs on (CUDA minor version compatibility,
# docs.nvidia.com/deploy/cuda-compatibility: 12.x >= 525, 13.x >= 580).
MIN_DRIVER = {11: "450", 12: "525", 13: "580"}


def installed_tensorrt() -> str | None:
    """The installed TensorRT version from package metadata, without importing it."""
    return installed_version(*TENSORRT_DISTRIBUTIONS)


# -- CUDA runtime through cuda-python -------------------------------------------------------


def _cudart() -> Any:
    """cuda-python's runtime module: ``cuda.bindings.runtime`` (12.6.2+, the only one in
    13.x), else ``cuda.cudart`` (12.6.0)."""
    for name in ("cuda.bindings.runtime", "cuda.cudart"):
        with contextlib.suppress(ImportError):
            return importlib.import_module(name)
    raise EngineError("cuda-python is not installed (pip install 'cuda-python>=12.6,<13')")


def _check(result: Any) -> Any:
    """cuda-python returns (error, *values): raise on an error, return the value(s)."""
    err, *values = result if isinstance(result, tuple) else (result,)
    code: Any = getattr(err, "value", err)
    if int(code) != 0:
        cudart = _cudart()
        name = cudart.cudaGetErrorName(err)[1]
        raise EngineError(f"CUDA error {name.decode() if isinstance(name, bytes) else name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _cuda_version(encoded: int) -> str:
    """CUDA encodes versions as 1000 * major + 10 * minor."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def _tensorrt_cuda_major() -> int | None:
    """The CUDA major the installed TensorRT wheel is built for (tensorrt-cuNN)."""
    for major in (12, 13):
        if installed_version(f"tensorrt-cu{major}", f"tensorrt-cu{major}-bindings"):
            return major
    return None


def driver_hint(cudart: Any) -> str:
    """When CUDA cannot start: which driver cuda-python's runtime needs, and what is here.
    Both calls are safe without a driver (the runtime version is a compile-time constant;
    the driver version reads 0 when none is installed)."""
    runtime = int(_check(cudart.cudaRuntimeGetVersion()))
    driver = int(_check(cudart.cudaDriverGetVersion()))
    major = runtime // 1000
    if driver and driver // 1000 >= major:
        return ""  # the driver is new enough: the error is about something else
    have = f"the driver supports CUDA {_cuda_version(driver)}" if driver else "no driver loaded"
    hint = (
        f"cuda-python's CUDA runtime is {_cuda_version(runtime)}, which needs an NVIDIA driver"
        f" >= {MIN_DRIVER.get(major, '?')} (CUDA {major}.x); {have}"
    )
    trt_major = _tensorrt_cuda_major()
    if trt_major is not None and trt_major < major:
        hint += (
            f"; tensorrt-cu{trt_major} needs only CUDA {trt_major}: install"
            f" 'cuda-python<{trt_major + 1}' beside it"
        )
    return hint


def _why_no_gpu(cudart: Any) -> str:
    """Why CUDA sees no GPU here ("" when it sees one), with the driver it would need."""
    try:
        count = int(_check(cudart.cudaGetDeviceCount()))
    except EngineError as exc:
        hint = driver_hint(cudart)
        return f"{exc}; {hint}" if hint else str(exc)
    return "" if count > 0 else "none found"


@dataclass
class _Buffer:
    """One IO tensor: device memory and a pinned host mirror, sized for its largest shape."""

    name: str
    dtype: np.dtype[Any]
    nbytes: int
    device: int = 0
    host: int = 0

    def allocate(self, cudart: Any) -> None:
        self.device = int(_check(cudart.cudaMalloc(self.nbytes)))
        self.host = int(_check(cudart.cudaMallocHost(self.nbytes)))

    def view(self, shape: tuple[int, ...]) -> npt.NDArray[Any]:
        count = int(np.prod(shape)) if shape else 1
        raw: Any = (ctypes.c_byte * (count * self.dtype.itemsize)).from_address(self.host)
        return np.frombuffer(raw, dtype=self.dtype, count=count).reshape(shape)

    def free(self, cudart: Any) -> None:
        if self.device:
            cudart.cudaFree(self.device)
        if self.host:
            cudart.cudaFreeHost(self.host)
        self.device = self.host = 0


# (profile index, sorted (input name, shape) pairs): what the execution context is set to
State = tuple[int, tuple[tuple[str, tuple[int, ...]], ...]]


class TensorRTEngine:
    name: ClassVar[str] = "tensorrt"
    option_schema: ClassVar[OptionSchema] = OPTIONS
    capabilities: ClassVar[Capabilities] = Capabilities(
        family=Family.TENSOR, devices=frozenset({"cuda"}), dynamic_shapes=True
    )

    def __init__(self, config: EngineConfig) -> None:
        self.validate_options(config.options)
        self.config = config
        self.options = dict(config.options)
        self._cuda_graph = OPTIONS.resolve(config.options)["cuda_graph"] == "1"
        self._inputs: tuple[TensorSpec, ...] = ()
        self._outputs: tuple[TensorSpec, ...] = ()
        self._profiles: list[trt_profiles.Profile] = []
        self._engine: Any = None
        self._context: Any = None
        self._stream: Any = None
        self._events: list[Any] = []
        self._buffers: dict[str, _Buffer] = {}
        self._graphs: dict[State, Any] = {}
        self._active_profile = -1
        self._state: State | None = None  # what the context is set to
        # a shape or profile was set since the last plain enqueue, which applies it
        self._update_pending = True
        self._out_shapes: dict[str, tuple[int, ...]] = {}
        self._flushes = 0
        self._last: dict[str, float] = {}
        self._info: dict[str, Any] = {}

    @classmethod
    def probe(cls, device: str) -> Availability:
        if importlib.util.find_spec("tensorrt") is None:
            return Availability(
                False,
                "tensorrt is not installed (pip install 'inference-harness[tensorrt]'"
                " --extra-index-url https://pypi.nvidia.com: tensorrt-cu12 with cuda-python 12,"
                " driver >= 525; or tensorrt-cu13 with cuda-python 13, driver >= 580; on a"
                " machine with an NVIDIA GPU)",
            )
        try:
            why = _why_no_gpu(_cudart())
        except EngineError as exc:
            why = str(exc)
        if why:
            return Availability(False, f"tensorrt needs an NVIDIA GPU: {why}")
        return Availability(True)

    @classmethod
    def validate_options(cls, options: Mapping[str, str]) -> None:
        OPTIONS.validate(options)

    @classmethod
    def precision_options(cls, name: str, device: str) -> dict[str, str]:
        if name == "fp16":
            version = installed_tensorrt()
            # not installed: the cell skips later, with the probe's "not installed" reason
            if version is not None and "FP16" not in known_builder_flags(_major(version)):
                raise ValueError(NO_FP16.format(version=version))
        if name in ("fp32", "fp16"):
            return {"precision": name}
        raise ValueError(
            f"tensorrt {name} needs a model carrying it (int8: Q/DQ nodes; bf16: a bf16"
            " ONNX model); the adapter builds fp32 models and fp16 through the builder flag"
        )

    # -- build ---------------------------------------------------------------------------------

    def _cache_dir(self) -> Path:
        return Path(self.options.get("cache_dir") or cache_root() / "tensorrt")

    def _gpu(self, cudart: Any) -> str:
        index = int(self.config.device.partition(":")[2] or 0)
        _check(cudart.cudaSetDevice(index))
        props = _check(cudart.cudaGetDeviceProperties(index))
        name = props.name.decode() if isinstance(props.name, bytes) else str(props.name)
        return f"{name.strip(chr(0))} sm_{props.major}{props.minor}"

    def _plan(self, trt: Any, path: Path) -> BuildPlan:
        """Plan, specs and profiles; a ValueError (bad option or model) is an EngineError."""
        flags = getattr(trt.BuilderFlag, "__members__", None)
        try:
            plan = build_plan(self.options, _major(trt.__version__), flags)
            self._inputs, self._outputs = read_specs(path)
            dims = trt_profiles.parse_dims(self.options.get("dims"))
            self._profiles = trt_profiles.derive_all(
                self._inputs, self.options.get("profiles"), dims
            )
        except ValueError as exc:
            raise EngineError(str(exc)) from exc
        return plan

    def load(self) -> None:
        import tensorrt as trt  # noqa: PLC0415

        path = self.config.model
        if path.suffix != ".onnx" or not path.is_file():
            raise EngineError(f"tensorrt builds from an ONNX file; {path} is not one")
        cudart = _cudart()
        gpu = self._gpu(cudart)
        plan = self._plan(trt, path)
        data = path.read_bytes()
        key = trt_profiles.cache_key(
            hashlib.sha256(data).hexdigest(), trt.__version__, gpu, self._profiles, plan.settings()
        )
        self._cache_dir().mkdir(parents=True, exist_ok=True)
        engine_file = self._cache_dir() / f"{path.stem}-{key}.engine"
        logger = trt.Logger(trt.Logger.WARNING)
        started = time.perf_counter()
        if engine_file.is_file():
            serialized, cache = engine_file.read_bytes(), "hit"
        else:
            serialized = build_engine(
                trt,
                logger,
                data,
                plan,
                model=path,
                profiles=self._profiles,
                cache_dir=self._cache_dir(),
                gpu=gpu,
            )
            cache = "miss"
            replace(engine_file, serialized)
        build_s = time.perf_counter() - started if cache == "miss" else 0.0
        self._engine = trt.Runtime(logger).deserialize_cuda_engine(serialized)
        if self._engine is None:
            raise EngineError(f"TensorRT could not deserialize {engine_file}")
        self._context = self._engine.create_execution_context()
        self._stream = _check(cudart.cudaStreamCreate())
        self._events = [_check(cudart.cudaEventCreate()) for _ in range(MARKS)]
        self._allocate(cudart)
        self._info = {
            "gpu": gpu,
            "api_major": _major(trt.__version__),
            "cuda_runtime": _cuda_version(int(_check(cudart.cudaRuntimeGetVersion()))),
            "build": plan.settings(),
            "tf32": plan.tf32,
            "build_s": round(build_s, 3),
            "engine_cache": {"file": str(engine_file), "result": cache},
            "profiles": [p.ort_options() for p in self._profiles],
            "cuda_graph": self._graphs_on(),
        }

    def _allocate(self, cudart: Any) -> None:
        """Buffers sized for the largest shape any profile allows, allocated once."""
        largest: dict[str, int] = {}
        for index, profile in enumerate(self._profiles):
            self._select(index)
            for name, (_, _, high) in profile.shapes.items():
                if not self._context.set_input_shape(name, high):
                    raise EngineError(f"TensorRT refused shape {high} for {name}")
            for spec in (*self._inputs, *self._outputs):
                shape = tuple(self._context.get_tensor_shape(spec.name))
                nbytes = int(np.prod(shape)) * spec.dtype.itemsize
                largest[spec.name] = max(largest.get(spec.name, 0), nbytes)
        self._state = None  # the shapes above were for sizing: the first infer sets its own
        self._update_pending = True
        for spec in (*self._inputs, *self._outputs):
            buffer = _Buffer(spec.name, spec.dtype, max(largest[spec.name], 1))
            buffer.allocate(cudart)
            self._buffers[spec.name] = buffer
            if not self._context.set_tensor_address(spec.name, buffer.device):
                raise EngineError(f"TensorRT refused the address of {spec.name}")

    def _select(self, index: int) -> None:
        if index != self._active_profile:
            self._context.set_optimization_profile_async(index, int(self._stream))
            _check(_cudart().cudaStreamSynchronize(self._stream))
            self._active_profile = index

    # -- run -----------------------------------------------------------------------------------

    def input_specs(self) -> tuple[TensorSpec, ...]:
        self._loaded()
        return self._inputs

    def output_specs(self) -> tuple[TensorSpec, ...]:
        self._loaded()
        return self._outputs

    def _loaded(self) -> None:
        if self._context is None:
            raise EngineError("engine not loaded: call load() first")

    def _graphs_on(self) -> bool:
        return self._cuda_graph

    def warmup(self, inputs: Arrays, iterations: int) -> None:
        for _ in range(iterations):
            self.infer(inputs)

    def device_times(self) -> dict[str, float]:
        return dict(self._last)

    def infer(self, inputs: Arrays) -> dict[str, npt.NDArray[Any]]:
        self._loaded()
        cudart = _cudart()
        arrays = dict(
            zip((s.name for s in self._inputs), check_inputs(self._inputs, inputs), strict=True)
        )
        self._set_shapes({name: tuple(a.shape) for name, a in arrays.items()})
        # host work first, so the start event below times the copies and not numpy
        for name, array in arrays.items():
            self._buffers[name].view(array.shape)[...] = array
        graph = self._graph(cudart) if self._graphs_on() else None
        self._timed_run(cudart, arrays, graph)
        return {
            name: self._buffers[name].view(shape).copy() for name, shape in self._out_shapes.items()
        }

    def _set_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Select the profile and set the input shapes, only when they change."""
        try:
            profile = trt_profiles.select_profile(self._profiles, shapes)
        except ValueError as exc:
            raise ValueError(f"{exc}; the engine was built for {self._info['profiles']}") from None
        state: State = (profile, tuple(sorted(shapes.items())))
        if state == self._state:
            return
        self._state = None  # until every shape is accepted
        self._update_pending = True
        self._select(profile)
        for name, shape in shapes.items():
            if not self._context.set_input_shape(name, shape):
                raise ValueError(f"TensorRT refused input shape {shape} for {name}")
        self._out_shapes = {
            s.name: tuple(self._context.get_tensor_shape(s.name)) for s in self._outputs
        }
        self._state = state

    def _timed_run(self, cudart: Any, arrays: Mapping[str, npt.NDArray[Any]], graph: Any) -> None:
        h2d, d2h = (
            cudart.cudaMemcpyKind.cudaMemcpyHostToDevice,
            cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost,
        )
        stream, ev = self._stream, self._events
        _check(cudart.cudaEventRecord(ev[0], stream))
        for name, array in arrays.items():
            buffer = self._buffers[name]
            _check(cudart.cudaMemcpyAsync(buffer.device, buffer.host, array.nbytes, h2d, stream))
        _check(cudart.cudaEventRecord(ev[1], stream))
        if graph is None:
            self._plain_enqueue()
        else:
            _check(cudart.cudaGraphLaunch(graph, stream))
        _check(cudart.cudaEventRecord(ev[2], stream))
        for name, shape in self._out_shapes.items():
            buffer = self._buffers[name]
            nbytes = int(np.prod(shape)) * buffer.dtype.itemsize
            _check(cudart.cudaMemcpyAsync(buffer.host, buffer.device, nbytes, d2h, stream))
        _check(cudart.cudaEventRecord(ev[3], stream))
        _check(cudart.cudaStreamSynchronize(stream))
        self._last = stage_times(lambda i, j: _check(cudart.cudaEventElapsedTime(ev[i], ev[j])))

    def _plain_enqueue(self) -> None:
        if not self._context.execute_async_v3(int(self._stream)):
            raise EngineError("TensorRT execute_async_v3 failed")
        self._update_pending = False

    def _graph(self, cudart: Any) -> Any:
        """The executable graph for the context's state, captured on first use. TensorRT
        applies a profile or shape change at the next enqueue, and a graph replay is not
        one: a plain enqueue first brings the context's internal state to these shapes."""
        if self._update_pending:
            self._plain_enqueue()
            self._flushes += 1
        assert self._state is not None  # _set_shapes ran
        if self._state not in self._graphs:
            self._graphs[self._state] = self._capture(cudart)
        return self._graphs[self._state]

    def _capture(self, cudart: Any) -> Any:
        """Capture one enqueue, after the plain one (as trtexec does, so that TensorRT's
        setup work is not captured), on a synchronized stream."""
        _check(cudart.cudaStreamSynchronize(self._stream))
        mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        _check(cudart.cudaStreamBeginCapture(self._stream, mode))
        ok = self._context.execute_async_v3(int(self._stream))
        graph = _check(cudart.cudaStreamEndCapture(self._stream))
        if not ok:
            raise EngineError("TensorRT could not enqueue inside a CUDA graph capture")
        executable = _check(cudart.cudaGraphInstantiate(graph, 0))
        _check(cudart.cudaGraphDestroy(graph))
        return executable

    # -- report and release --------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "engine": self.name,
            "version": installed_tensorrt() or "not installed",
            "device": self.config.device,
            "requested": dict(self.options),
            "model": {"path": str(self.config.model)},
        }
        if self._info:
            info["effective"] = dict(self._info)
            if self._graphs_on():
                info["effective"]["cuda_graph_captures"] = len(self._graphs)
                info["effective"]["cuda_graph_flushes"] = self._flushes
        return info

    def close(self) -> None:
        if self._context is None and not self._buffers:
            return
        cudart = _cudart()
        for executable in self._graphs.values():
            cudart.cudaGraphExecDestroy(executable)
        self._graphs.clear()
        for buffer in self._buffers.values():
            buffer.free(cudart)
        self._buffers.clear()
        for event in self._events:
            cudart.cudaEventDestroy(event)
        self._events = []
        if self._stream is not None:
            cudart.cudaStreamDestroy(self._stream)
            self._stream = None
        self._context = self._engine = None
        self._active_profile = -1
        self._state = None
        self._update_pending = True


def _major(version: str) -> int:
    return int(version.split(".", maxsplit=1)[0])
