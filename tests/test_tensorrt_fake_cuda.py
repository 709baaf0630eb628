"""TensorRTEngine.load() and infer() end to end, on a CPU, against recording fakes of the
few cuda-python runtime and TensorRT calls the adapter makes.

The fakes test the adapter's logic only: which builder flags it sets and clears, what keys
its engine cache, and the order of its calls (host staging, events, copies, enqueues, CUDA
graph capture and launch) with the bytes it moves. They model nothing of TensorRT's kernels
or CUDA's timing beyond that; the real-engine conformance suite,
tests/test_gpu_conformance.py, is the test of record on a GPU.
"""

from __future__ import annotations

import ctypes
import enum
import importlib.machinery
import json
import sys
import types
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engines import tensorrt as adapter
from engines import trt_profiles
from engines.tensorrt import TensorRTEngine, build_plan
from harness.engine import EngineConfig, EngineError

COPY_MS = 0.25  # the fake device's cost of one copy
KERNEL_MS = 2.0  # and of one inference
CLASSES = 10  # tiny-cnn: image [batch, 3, 64, 64] -> logits [batch, 10]
TWO_PROFILES = "batch=1:1:2;batch=3:4:4"


class cudaError_t(enum.IntEnum):  # cuda-python's name
    cudaSuccess = 0
    cudaErrorInsufficientDriver = 35
    cudaErrorNoDevice = 100


OK = cudaError_t.cudaSuccess


@dataclass(eq=False)
class Handle:
    """A stream, event, graph or graph exec: cuda-python's handles convert with int()."""

    kind: str
    id: int
    nodes: list[Any] = field(default_factory=list)

    def __int__(self) -> int:
        return self.id


class RecordingCudart:
    """A fake of the cuda-python runtime calls TensorRTEngine makes, for testing the
    adapter's logic only (tests/test_gpu_conformance.py is the test of record on a GPU).

    Work runs at once, in call order, on a virtual clock (copies COPY_MS, inferences
    KERNEL_MS). Device memory is Python bytes; pinned host memory is real (the adapter
    writes it through ctypes), and every call first logs ``("host_write", address)`` for
    each pinned buffer the host changed since the previous call, so the log shows where
    the adapter staged its inputs among its CUDA calls."""

    cudaError_t = cudaError_t
    cudaMemcpyKind = types.SimpleNamespace(
        cudaMemcpyHostToDevice="H2D", cudaMemcpyDeviceToHost="D2H"
    )
    cudaStreamCaptureMode = types.SimpleNamespace(cudaStreamCaptureModeThreadLocal="thread-local")

    def __init__(self, count: Any = 1, runtime: int = 12090, driver: int = 12080) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.count, self.runtime, self.driver = count, runtime, driver
        self.device: dict[int, bytearray] = {}
        self.host: dict[int, tuple[Any, bytes]] = {}
        self.capturing: dict[int, list[Any]] = {}
        self.event_ms: dict[int, float] = {}
        self.clock = 0.0
        self._ids = 0

    # -- bookkeeping -----------------------------------------------------------------------

    def _call(self, *entry: Any) -> None:
        for address, (buffer, seen) in self.host.items():
            now = ctypes.string_at(address, len(buffer))
            if now != seen:
                self.log.append(("host_write", address))
                self.host[address] = (buffer, now)
        self.log.append(entry)

    def _handle(self, kind: str) -> Handle:
        self._ids += 1
        return Handle(kind, self._ids)

    def submit(self, stream: int, label: tuple[Any, ...], work: Any) -> None:
        """Run ``work`` now, or add it to the graph being captured on ``stream``."""
        if stream in self.capturing:
            self.capturing[stream].append((label, work))
            return
        self.clock += KERNEL_MS
        work()

    # -- the runtime API -------------------------------------------------------------------

    def cudaGetErrorName(self, err):
        return OK, cudaError_t(err).name.encode()

    def cudaGetDeviceCount(self):
        if isinstance(self.count, cudaError_t):  # as cuda-python: the error and None
            return self.count, None
        return OK, self.count

    def cudaRuntimeGetVersion(self):
        return OK, self.runtime

    def cudaDriverGetVersion(self):
        return OK, self.driver

    def cudaSetDevice(self, index):
        self._call("set_device", index)
        return (OK,)

    def cudaGetDeviceProperties(self, index):
        return OK, types.SimpleNamespace(name=b"Fake GPU\x00\x00", major=9, minor=0)

    def cudaMalloc(self, nbytes):
        address = 0x1000_0000 * (len(self.device) + 1)
        self.device[address] = bytearray(nbytes)
        return OK, address

    def cudaMallocHost(self, nbytes):
        buffer = ctypes.create_string_buffer(nbytes)
        address = ctypes.addressof(buffer)
        self.host[address] = (buffer, bytes(nbytes))
        return OK, address

    def cudaFree(self, address):
        del self.device[address]
        return (OK,)

    def cudaFreeHost(self, address):
        del self.host[address]
        return (OK,)

    def cudaStreamCreate(self):
        return OK, self._handle("stream")

    def cudaStreamDestroy(self, stream):
        return (OK,)

    def cudaStreamSynchronize(self, stream):
        self._call("sync")
        return (OK,)

    def cudaEventCreate(self):
        return OK, self._handle("event")

    def cudaEventDestroy(self, event):
        return (OK,)

    def cudaEventRecord(self, event, stream):
        self._call("event", event.id)
        self.event_ms[event.id] = self.clock
        return (OK,)

    def cudaEventElapsedTime(self, start, end):
        return OK, self.event_ms[end.id] - self.event_ms[start.id]

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):
        self._call("memcpy", kind, dst, src, nbytes)
        self.clock += COPY_MS
        if kind == "H2D":
            self.device[dst][:nbytes] = ctypes.string_at(src, nbytes)
            return (OK,)
        ctypes.memmove(dst, bytes(self.device[src][:nbytes]), nbytes)
        buffer, _ = self.host[dst]
        self.host[dst] = (buffer, ctypes.string_at(dst, len(buffer)))  # not a host write
        return (OK,)

    def cudaStreamBeginCapture(self, stream, mode):
        self._call("begin_capture")
        self.capturing[int(stream)] = []
        return (OK,)

    def cudaStreamEndCapture(self, stream):
        self._call("end_capture")
        graph = self._handle("graph")
        graph.nodes = self.capturing.pop(int(stream))
        return OK, graph

    def cudaGraphInstantiate(self, graph, flags):
        executable = self._handle("graph_exec")
        executable.nodes = list(graph.nodes)
        return OK, executable

    def cudaGraphDestroy(self, graph):
        return (OK,)

    def cudaGraphExecDestroy(self, executable):
        self._call("graph_exec_destroy", executable.id)
        return (OK,)

    def cudaGraphLaunch(self, executable, stream):
        self._call("graph_launch", executable.id)
        for _label, work in executable.nodes:
            self.clock += KERNEL_MS
            work()
        return (OK,)


@dataclass(eq=False)
class Flag:
    name: str


class RecordingTensorRT:
    """A fake ``tensorrt`` module for one input and one output (tiny-cnn's), for testing
    the adapter's logic only (tests/test_gpu_conformance.py is the test of record on a GPU).

    The builder logs ``set_flag``/``clear_flag`` and serializes what it was asked for as
    JSON (TF32 on by default, as in TensorRT). The execution context models the rule the
    adapter must follow: a profile switch or ``set_input_shape`` is applied by the next
    plain ``execute_async_v3``; capturing with such an update pending fails, and replaying
    a graph while the context is not at the graph's shapes logs ``stale_replay`` and
    writes NaN."""

    def __init__(self, cudart: RecordingCudart, version: str = "10.16.1.11") -> None:
        self.cudart, self.log = cudart, cudart.log
        self.major = int(version.split(".", maxsplit=1)[0])
        names = ["TF32", "DEBUG"] if self.major >= 11 else ["FP16", "BF16", "TF32", "DEBUG"]
        flags = {name: Flag(name) for name in names}
        module = types.ModuleType("tensorrt")
        module.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
        module.__dict__.update(
            __version__=version,
            Logger=type("Logger", (), {"WARNING": 2, "__init__": lambda self, level: None}),
            BuilderFlag=type("BuilderFlag", (), {**flags, "__members__": flags}),
            NetworkDefinitionCreationFlag=types.SimpleNamespace(
                STRONGLY_TYPED=0 if self.major >= 11 else 1
            ),
            MemoryPoolType=types.SimpleNamespace(WORKSPACE="workspace"),
            Builder=lambda logger: _Builder(self),
            OnnxParser=_Parser,
            Runtime=lambda logger: types.SimpleNamespace(
                deserialize_cuda_engine=lambda data: _Engine(self, json.loads(data))
            ),
        )
        self.module = module


class _Parser:
    num_errors = 0

    def __init__(self, network: Any, logger: Any) -> None:
        self.network = network

    def parse(self, data: bytes, path: str) -> bool:
        return data[:1] != b""


class _Builder:
    def __init__(self, trt: RecordingTensorRT) -> None:
        self.trt = trt

    def create_network(self, flags: int) -> Any:
        return types.SimpleNamespace(flags=flags)

    def create_builder_config(self) -> _Config:
        return _Config(self.trt)

    def create_optimization_profile(self) -> Any:
        shapes: dict[str, Any] = {}
        return types.SimpleNamespace(
            shapes=shapes, set_shape=lambda n, lo, opt, hi: shapes.update({n: [lo, opt, hi]})
        )

    def build_serialized_network(self, network: Any, config: _Config) -> bytes:
        self.trt.log.append(("build",))
        plan = {"flags": sorted(config.flags), "profiles": config.profiles, "net": network.flags}
        return json.dumps(plan).encode()


class _Config:
    def __init__(self, trt: RecordingTensorRT) -> None:
        self.trt = trt
        self.flags = {"TF32"}  # TensorRT's default
        self.profiles: list[dict[str, Any]] = []
        self.builder_optimization_level = 3

    def set_memory_pool_limit(self, pool: str, nbytes: int) -> None:
        self.workspace = nbytes

    def set_flag(self, flag: Flag) -> None:
        self.trt.log.append(("set_flag", flag.name))
        self.flags.add(flag.name)

    def clear_flag(self, flag: Flag) -> None:
        self.trt.log.append(("clear_flag", flag.name))
        self.flags.discard(flag.name)

    def add_optimization_profile(self, profile: Any) -> int:
        self.profiles.append(profile.shapes)
        return len(self.profiles) - 1

    def create_timing_cache(self, data: bytes) -> bytes:
        return data

    def set_timing_cache(self, cache: bytes, ignore_mismatch: bool) -> None:
        self.timing = cache

    def get_timing_cache(self) -> Any:
        return types.SimpleNamespace(serialize=lambda: b"timing")


class _Engine:
    def __init__(self, trt: RecordingTensorRT, plan: dict[str, Any]) -> None:
        self.trt, self.plan = trt, plan

    def create_execution_context(self) -> _Context:
        return _Context(self.trt, self.plan["profiles"])


class _Context:
    def __init__(self, trt: RecordingTensorRT, profiles: list[dict[str, Any]]) -> None:
        self.trt, self.log, self.profiles = trt, trt.log, profiles
        self.profile = 0
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.pending = True  # set since the last plain enqueue
        self.applied: Any = None  # the state the last plain enqueue ran with

    def state(self) -> Any:
        return (self.profile, tuple(sorted(self.shapes.items())))

    def set_optimization_profile_async(self, index: int, stream: int) -> bool:
        self.log.append(("set_profile", index))
        self.profile, self.shapes, self.pending = index, {}, True  # shapes must be set again
        return True

    def set_input_shape(self, name: str, shape: Any) -> bool:
        low, _, high = self.profiles[self.profile][name]
        if not all(lo <= s <= hi for s, lo, hi in zip(shape, low, high, strict=True)):
            return False
        self.log.append(("set_input_shape", name, tuple(shape)))
        self.shapes[name], self.pending = tuple(shape), True
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        if name == "logits":
            return (self.shapes["image"][0], CLASSES)
        return self.shapes[name]

    def set_tensor_address(self, name: str, address: int) -> bool:
        self.addresses[name] = address
        return True

    def execute_async_v3(self, stream: int) -> bool:
        state = self.state()
        if stream not in self.trt.cudart.capturing:
            self.log.append(("enqueue", state))
            self.trt.cudart.submit(stream, ("enqueue",), lambda: self._infer(state))
            self.pending, self.applied = False, state
            return True
        self.log.append(("enqueue_captured", state))
        if self.pending:
            self.log.append(("capture_with_pending_update", state))
            return False
        self.trt.cudart.submit(stream, ("kernel",), lambda: self._replay(state))
        return True

    def _replay(self, state: Any) -> None:
        if self.pending or self.applied != state:
            self.log.append(("stale_replay", state))
            self._write_logits(state, None)
            return
        self._infer(state)

    def _infer(self, state: Any) -> None:
        shape = dict(state[1])["image"]
        device = self.trt.cudart.device
        count = int(np.prod(shape))
        image = np.frombuffer(device[self.addresses["image"]], np.float32, count).reshape(shape)
        self._write_logits(state, expected_logits(image))

    def _write_logits(self, state: Any, logits: Any) -> None:
        batch = dict(state[1])["image"][0]
        if logits is None:
            logits = np.full((batch, CLASSES), np.nan, np.float32)
        out = self.trt.cudart.device[self.addresses["logits"]]
        out[: logits.nbytes] = logits.astype(np.float32).tobytes()


def expected_logits(image: np.ndarray) -> np.ndarray:
    """What the fake 'network' computes: each image's mean times 1..CLASSES."""
    means = image.reshape(image.shape[0], -1).mean(axis=1, dtype=np.float32)
    return (means[:, None] * np.arange(1, CLASSES + 1, dtype=np.float32)).astype(np.float32)


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cnn() -> Path:
    pytest.importorskip("onnx")
    from workloads.lib.models import embedded  # noqa: PLC0415

    return embedded("tiny-cnn").path


@dataclass
class Fakes:
    cudart: RecordingCudart
    trt: RecordingTensorRT


def install(monkeypatch, version: str = "10.16.1.11", **cudart: Any) -> Fakes:
    runtime = RecordingCudart(**cudart)
    fakes = Fakes(runtime, RecordingTensorRT(runtime, version))
    monkeypatch.setattr(adapter, "_cudart", lambda: fakes.cudart)
    monkeypatch.setitem(sys.modules, "tensorrt", fakes.trt.module)
    return fakes


def loaded(model: Path, tmp_path: Path, **options: str) -> TensorRTEngine:
    engine = TensorRTEngine(EngineConfig(model, "cuda", {"cache_dir": str(tmp_path), **options}))
    engine.load()
    return engine


def images(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + batch)
    return {"image": rng.standard_normal((batch, 3, 64, 64)).astype(np.float32)}


def entries(log: list[tuple[Any, ...]], kind: str) -> list[tuple[Any, ...]]:
    return [e for e in log if e[0] == kind]


# -- building: flags and the engine cache --------------------------------------------------


@pytest.mark.parametrize("version", ["10.16.1.11", "11.4.0.106"])
def test_fp32_clears_tf32_which_tensorrt_enables_by_default(monkeypatch, tmp_path, cnn, version):
    fakes = install(monkeypatch, version)
    engine = loaded(cnn, tmp_path)
    flags = [e for e in fakes.cudart.log if e[0] in ("set_flag", "clear_flag")]
    assert flags == [("clear_flag", "TF32")]
    (engine_file,) = tmp_path.glob("*.engine")
    built = json.loads(engine_file.read_bytes())
    assert built["flags"] == []  # the builder got no TF32
    # STRONGLY_TYPED is bit 1 in TensorRT 10 (asked only from 11 on), bit 0 in 11
    assert built["net"] == (1 if version.startswith("11") else 0)
    effective = engine.describe()["effective"]
    assert effective["tf32"] is False
    assert effective["build"]["cleared_flags"] == ["TF32"]
    assert effective["build"]["strongly_typed"] is (version.startswith("11"))
    assert effective["engine_cache"]["result"] == "miss"
    engine.close()
    again = loaded(cnn, tmp_path)  # same settings: the cached engine, no build
    assert again.describe()["effective"]["engine_cache"]["result"] == "hit"
    assert len(entries(fakes.cudart.log, "build")) == 1
    again.close()


def test_fp16_sets_the_flag_on_tensorrt_10_and_tf32_stays_cleared(monkeypatch, tmp_path, cnn):
    fakes = install(monkeypatch, "10.16.1.11")
    engine = loaded(cnn, tmp_path, precision="fp16")
    flags = [e for e in fakes.cudart.log if e[0] in ("set_flag", "clear_flag")]
    assert flags == [("set_flag", "FP16"), ("clear_flag", "TF32")]
    (engine_file,) = tmp_path.glob("*.engine")
    assert json.loads(engine_file.read_bytes())["flags"] == ["FP16"]
    assert engine.describe()["effective"]["build"]["builder_flags"] == ["FP16"]
    engine.close()


def test_fp16_on_tensorrt_11_is_refused_before_building(monkeypatch, tmp_path, cnn):
    fakes = install(monkeypatch, "11.4.0.106")
    engine = TensorRTEngine(
        EngineConfig(cnn, "cuda", {"cache_dir": str(tmp_path), "precision": "fp16"})
    )
    with pytest.raises(EngineError, match="TensorRT 11 has no FP16 builder flag"):
        engine.load()
    assert entries(fakes.cudart.log, "build") == []
    assert list(tmp_path.glob("*.engine")) == []


def test_tf32_on_keeps_the_flag_and_is_another_cached_engine(monkeypatch, tmp_path, cnn):
    fakes = install(monkeypatch)
    loaded(cnn, tmp_path).close()
    engine = loaded(cnn, tmp_path, tf32="1")
    assert [e for e in fakes.cudart.log if e[0] == "set_flag"] == [("set_flag", "TF32")]
    assert engine.describe()["effective"]["tf32"] is True
    assert engine.describe()["effective"]["engine_cache"]["result"] == "miss"
    assert len(list(tmp_path.glob("*.engine"))) == 2
    engine.close()
    profiles = trt_profiles.derive_all(
        (adapter.TensorSpec("image", np.dtype(np.float32), ("batch", 3, 64, 64)),), None, {}
    )
    keys = {
        trt_profiles.cache_key("m", "10.16.1.11", "GPU", profiles, build_plan(o, 10).settings())
        for o in ({}, {"tf32": "0"}, {"tf32": "1"})
    }
    assert len(keys) == 2  # tf32=0 is the default: one key for it, another for tf32=1


def test_build_plans_follow_the_flags_the_installed_tensorrt_has():
    assert build_plan({}, 10).settings() == {
        "strongly_typed": False,
        "builder_flags": [],
        "cleared_flags": ["TF32"],
        "tf32": False,
        "workspace_bytes": 4096 * 2**20,
        "optimization_level": 3,
    }
    assert build_plan({"tf32": "1"}, 11).builder_flags == ("TF32",)
    assert build_plan({"tf32": "1"}, 11).cleared_flags == ()
    # a TensorRT without the flag: nothing to set or clear, and the plan says so
    assert build_plan({}, 12, flags={"DEBUG"}).tf32 is None
    assert build_plan({}, 12, flags={"DEBUG"}).cleared_flags == ()
    with pytest.raises(ValueError, match="TensorRT 10 has no FP16 builder flag"):
        build_plan({"precision": "fp16"}, 10, flags={"TF32"})


def test_the_tensorrt_version_comes_from_package_metadata(monkeypatch):
    found = {"tensorrt-cu12-bindings": "11.4.0.106", "tensorrt-cu12": "11.4.0.106"}

    def version(name):
        if name not in found:
            raise PackageNotFoundError(name)
        return found[name]

    monkeypatch.setattr("harness.engine.contract.version", version)
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
    assert adapter.installed_tensorrt() == "11.4.0.106"
    assert "tensorrt" not in sys.modules
    with pytest.raises(ValueError, match=r"TensorRT 11\.4\.0\.106 has no FP16 builder flag"):
        TensorRTEngine.precision_options("fp16", "cuda")


def test_the_tensorrt_extra_keeps_one_cuda_major():
    """tensorrt-cu12 beside a CUDA 13 cuda-python would need a driver >= 580 for the
    adapter's own calls, where TensorRT itself runs on >= 525."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement  # noqa: PLC0415

    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    wanted = {
        r.name: r.specifier for r in map(Requirement, project["optional-dependencies"]["tensorrt"])
    }
    assert "tensorrt-cu12" in wanted
    assert "12.9.10" in wanted["cuda-python"]
    assert "13.0.0" not in wanted["cuda-python"]


# -- running: staging, events, copies -------------------------------------------------------


def test_inputs_are_staged_before_the_start_event_and_copied_after_it(monkeypatch, tmp_path, cnn):
    fakes = install(monkeypatch)
    engine = loaded(cnn, tmp_path, profiles="batch=1:2:4")
    log = fakes.cudart.log
    start = len(log)
    batch = images(3)
    out = engine.infer(batch)
    call = log[start:]
    ev = [e.id for e in engine._events]
    image, logits = engine._buffers["image"], engine._buffers["logits"]
    order = [
        ("set_input_shape", "image", (3, 3, 64, 64)),
        ("host_write", image.host),
        ("event", ev[0]),
        ("memcpy", "H2D", image.device, image.host, batch["image"].nbytes),
        ("event", ev[1]),
        ("enqueue", (0, (("image", (3, 3, 64, 64)),))),
        ("event", ev[2]),
        ("memcpy", "D2H", logits.host, logits.device, 3 * CLASSES * 4),
        ("event", ev[3]),
        ("sync",),
    ]
    assert call == order
    np.testing.assert_array_equal(out["logits"], expected_logits(batch["image"]))
    assert engine.device_times() == pytest.approx(
        {"h2d": COPY_MS / 1e3, "compute": KERNEL_MS / 1e3, "d2h": COPY_MS / 1e3}
    )
    engine.close()


def test_without_graphs_a_repeated_shape_is_not_set_again(monkeypatch, tmp_path, cnn):
    fakes = install(monkeypatch)
    engine = loaded(cnn, tmp_path, profiles=TWO_PROFILES)
    start = len(fakes.cudart.log)
    for batch in (2, 2, 4, 1):
        out = engine.infer(images(batch))
        np.testing.assert_array_equal(out["logits"], expected_logits(images(batch)["image"]))
    call = fakes.cudart.log[start:]
    assert [e[2][0] for e in entries(call, "set_input_shape")] == [2, 4, 1]
    # load() sized the buffers at profile 1's maximum: batch 2 switches back to profile 0
    assert [e[1] for e in entries(call, "set_profile")] == [0, 1, 0]
    assert len(entries(call, "enqueue")) == 4
    assert entries(call, "graph_launch") == []
    engine.close()


# -- CUDA graphs: a plain enqueue after every shape or profile change ----------------------


def calls(log: list[tuple[Any, ...]], start: int) -> list[list[tuple[Any, ...]]]:
    """The log from ``start`` cut after each infer's final synchronize."""
    out: list[list[tuple[Any, ...]]] = [[]]
    for entry in log[start:]:
        out[-1].append(entry)
        if entry == ("sync",) and any(e[0] == "event" for e in out[-1]):
            out.append([])
    return out[:-1]


def test_graphs_replay_only_after_a_plain_enqueue_at_their_shapes(monkeypatch, tmp_path, cnn):
    fakes = install(monkeypatch)
    engine = loaded(cnn, tmp_path, profiles=TWO_PROFILES, cuda_graph="1")
    start = len(fakes.cudart.log)
    batches = (1, 1, 2, 4, 1, 3)  # repeat, shape change, profile change, back, profile change
    for batch in batches:
        out = engine.infer(images(batch))
        np.testing.assert_array_equal(out["logits"], expected_logits(images(batch)["image"]))
        assert engine.device_times()["compute"] == pytest.approx(KERNEL_MS / 1e3)
    per_call = calls(fakes.cudart.log, start)
    assert len(per_call) == len(batches)
    for previous, batch, call in zip((None, *batches), batches, per_call, strict=False):
        kinds = [e[0] for e in call]
        launch = kinds.index("graph_launch")
        if batch == previous:  # nothing changed: replay at once
            assert "set_input_shape" not in kinds
            assert "enqueue" not in kinds
            continue
        last_set = max(i for i, k in enumerate(kinds) if k in ("set_input_shape", "set_profile"))
        plain = kinds.index("enqueue")
        # the plain enqueue applies the change, before any capture or launch, untimed
        assert last_set < plain < kinds.index("event") < launch
        assert "begin_capture" not in kinds[:plain]
    assert entries(fakes.cudart.log, "stale_replay") == []
    assert entries(fakes.cudart.log, "capture_with_pending_update") == []
    captured = entries(fakes.cudart.log, "begin_capture")
    assert len(captured) == len(set(batches))  # one graph per shape, batch 1's replayed
    effective = engine.describe()["effective"]
    assert effective["cuda_graph_captures"] == 4
    assert effective["cuda_graph_flushes"] == 5  # every call but the repeat
    graphs = [e for e in engine._graphs.values()]
    engine.close()
    destroyed = {e[1] for e in entries(fakes.cudart.log, "graph_exec_destroy")}
    assert destroyed == {g.id for g in graphs}
    assert fakes.cudart.device == {}
    assert fakes.cudart.host == {}


def test_the_fake_catches_a_replay_without_the_plain_enqueue(monkeypatch, tmp_path, cnn):
    """The rule the test above checks has teeth: skip the plain enqueue after a shape
    change, and the fake replays stale state."""
    fakes = install(monkeypatch)
    engine = loaded(cnn, tmp_path, profiles="batch=1:2:4", cuda_graph="1")
    engine.infer(images(1))
    engine.infer(images(2))
    monkeypatch.setattr(engine, "_plain_enqueue", lambda: None)
    out = engine.infer(images(1))  # graph for batch 1 exists: replayed without the flush
    assert entries(fakes.cudart.log, "stale_replay") != []
    assert np.isnan(out["logits"]).all()
    engine.close()


# -- the probe says which driver cuda-python's runtime needs --------------------------------


def test_probe_names_the_driver_the_cuda_runtime_needs(monkeypatch):
    insufficient = cudaError_t.cudaErrorInsufficientDriver
    install(monkeypatch, count=insufficient, runtime=13050, driver=0)
    monkeypatch.setattr(adapter, "_tensorrt_cuda_major", lambda: None)
    reason = TensorRTEngine.probe("cuda").reason
    assert reason == (
        "tensorrt needs an NVIDIA GPU: CUDA error cudaErrorInsufficientDriver; cuda-python's"
        " CUDA runtime is 13.5, which needs an NVIDIA driver >= 580 (CUDA 13.x);"
        " no driver loaded"
    )
    install(monkeypatch, count=insufficient, runtime=13050, driver=12040)
    monkeypatch.setattr(adapter, "_tensorrt_cuda_major", lambda: 12)
    reason = TensorRTEngine.probe("cuda").reason
    assert "the driver supports CUDA 12.4" in reason
    assert reason.endswith("tensorrt-cu12 needs only CUDA 12: install 'cuda-python<13' beside it")
    # a driver new enough: the error alone, no driver advice
    install(monkeypatch, count=cudaError_t.cudaErrorNoDevice, runtime=12090, driver=12080)
    assert TensorRTEngine.probe("cuda").reason == (
        "tensorrt needs an NVIDIA GPU: CUDA error cudaErrorNoDevice"
    )
    install(monkeypatch, count=0)
    assert TensorRTEngine.probe("cuda").reason == "tensorrt needs an NVIDIA GPU: none found"
    install(monkeypatch, count=1)
    assert TensorRTEngine.probe("cuda").available
