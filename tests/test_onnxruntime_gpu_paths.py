"""The ONNX Runtime adapter's GPU paths on a CPU, with recording fakes in place of ORT's
CUDA session and of the dynamic loader.

These tests check the adapter's logic only: which run options each run carries under CUDA
graphs, which libraries it checks and preloads before a GPU session, what its refusals
say, what describe() records. Whether ORT and the GPU behave as the fakes assume is
checked by the real conformance suite on a GPU (tests/test_gpu_conformance.py, tox -e
tensorrt / onnxruntime-trt), which is the test of record.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from engines import ort_gpu
from engines.onnxruntime import OnnxRuntimeEngine
from engines.ort_gpu import ProviderLoadError
from harness.engine import EngineConfig, EngineError

CUDA_LIBS = [
    "libcudart.so.13",
    "libcublasLt.so.13",
    "libcublas.so.13",
    "libcurand.so.10",
    "libcudnn.so.9",
]


# -- fakes -------------------------------------------------------------------------------------


class FakeOrtValue:
    """A device buffer: fixed shape once allocated, like an OrtValue on cuda."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    @classmethod
    def ortvalue_from_numpy(cls, array, device="cpu", index=0):
        assert (device, index) == ("cuda", 0)
        return cls(np.array(array, copy=True))

    @classmethod
    def ortvalue_from_shape_and_type(cls, shape, dtype, device="cpu", index=0):
        assert (device, index) == ("cuda", 0)
        return cls(np.zeros(shape, dtype))

    def update_inplace(self, array) -> None:
        if array.shape != self.array.shape:
            raise ValueError(f"buffer of {self.array.shape} cannot take {array.shape}")
        self.array[...] = array

    def numpy(self) -> np.ndarray:
        return self.array.copy()


class FakeRunOptions:
    def __init__(self) -> None:
        self.entries: dict[str, str] = {}

    def add_run_config_entry(self, key: str, value: str) -> None:
        self.entries[key] = value


class FakeBinding:
    def __init__(self) -> None:
        self.inputs: dict[str, FakeOrtValue] = {}
        self.outputs: dict[str, FakeOrtValue | None] = {}

    def bind_ortvalue_input(self, name, value) -> None:
        self.inputs[name] = value

    def bind_output(self, name, device, index) -> None:
        assert (device, index) == ("cuda", 0)
        self.outputs[name] = None  # ORT allocates it in the run

    def bind_ortvalue_output(self, name, value) -> None:
        self.outputs[name] = value

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        unset = [n for n, v in self.outputs.items() if v is None]
        if unset:
            raise RuntimeError(f"outputs {unset} were never written: the run replayed a graph")
        return [v.numpy() for v in self.outputs.values() if v is not None]


def logits_of(image: np.ndarray) -> np.ndarray:
    return image.reshape(len(image), -1)[:, :10] * 2.0 + 1.0


class RecordingOrtSession:
    """Stands in for an InferenceSession with enable_cuda_graph=1, following ORT's protocol
    (onnxruntime_run_options_config_keys.h, cuda_graph.cc, inference_session.cc): the run
    option gpu_graph_id selects a graph, 0 when absent; -1 neither captures nor replays;
    the first run naming a graph id captures it on that run's buffers, and a later run
    naming it only replays the captured kernels on the captured buffers. Records every
    run (graph id, binding). The adapter's logic only: ORT itself is not run."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, FakeBinding]] = []
        self.graphs: dict[int, FakeBinding] = {}
        self.options = {"CUDAExecutionProvider": {"use_tf32": "0", "device_id": "0"}}

    def get_outputs(self):
        return [SimpleNamespace(name="logits", type="tensor(float)", shape=["batch", 10])]

    def get_inputs(self):
        return [SimpleNamespace(name="image", type="tensor(float)", shape=["batch", 3, 4, 4])]

    def get_providers(self):
        return list(self.options)

    def get_provider_options(self):
        return self.options

    def io_binding(self) -> FakeBinding:
        return FakeBinding()

    def run_with_iobinding(self, binding: FakeBinding, run_options=None) -> None:
        entries = run_options.entries if run_options is not None else {}
        graph = int(entries.get("gpu_graph_id", "0"))
        self.runs.append((graph, binding))
        if graph in self.graphs:
            self._compute(self.graphs[graph])  # replay: captured kernels, captured addresses
            return
        self._compute(binding)
        if graph != -1:
            self.graphs[graph] = binding

    @staticmethod
    def _compute(binding: FakeBinding) -> None:
        result = logits_of(binding.inputs["image"].array).astype(np.float32)
        out = binding.outputs["logits"]
        if out is None:
            binding.outputs["logits"] = FakeOrtValue(result)
        else:
            out.update_inplace(result)


class RecordingLoader:
    """Stands in for ctypes.CDLL: records what is opened, refuses ``missing`` with the
    loader's message, and answers the CUDA version calls (cuDriverGetVersion,
    cudaRuntimeGetVersion) by writing through their int* as the C functions do."""

    def __init__(self, missing=(), versions=None) -> None:
        self.opened: list[str] = []
        self.missing = set(missing)
        self.versions = versions or {}

    def __call__(self, name: str):
        self.opened.append(name)
        if Path(name).name in self.missing:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        return SimpleNamespace(
            cuDriverGetVersion=self._writes(self.versions.get("driver", 13000)),
            cudaRuntimeGetVersion=self._writes(self.versions.get("runtime", 13000)),
        )

    @staticmethod
    def _writes(value: int):
        def call(ref) -> int:
            ref._obj.value = value  # what the C function writes through its int*
            return 0

        return call


def fake_ort_module(tmp_path: Path, *, providers=None, preload_says=(), cuda_version="13.0"):
    """An ``onnxruntime`` module for the adapter's lazy imports, with a capi/ folder."""
    module: Any = types.ModuleType("onnxruntime")
    module.__spec__ = importlib.machinery.ModuleSpec("onnxruntime", None)  # probe's find_spec
    package = tmp_path / "onnxruntime"
    (package / "capi").mkdir(parents=True, exist_ok=True)
    module.__file__ = str(package / "__init__.py")
    module.__version__ = "1.31.1"
    module.cuda_version = cuda_version
    module.OrtValue = FakeOrtValue
    module.RunOptions = FakeRunOptions
    names = providers or [
        "TensorrtExecutionProvider",
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]
    module.get_available_providers = lambda: list(names)
    module.sessions = []

    def preload_dlls(cuda=True, cudnn=True, msvc=True, directory=None):
        for line in preload_says:
            print(line)

    module.preload_dlls = preload_dlls

    def session(path, sess_options=None, providers=(), **kwargs):
        module.sessions.append({"providers": providers, "kwargs": kwargs})
        return RecordingOrtSession()

    module.InferenceSession = session
    module.SessionOptions = lambda: SimpleNamespace(add_session_config_entry=lambda k, v: None)
    module.ExecutionMode = SimpleNamespace(ORT_SEQUENTIAL="sequential")
    module.GraphOptimizationLevel = SimpleNamespace(ORT_ENABLE_ALL="all")
    return module


@pytest.fixture
def fake_ort(tmp_path, monkeypatch):
    module = fake_ort_module(tmp_path)
    monkeypatch.setitem(sys.modules, "onnxruntime", module)
    return module


def _cuda_graph_engine() -> tuple[OnnxRuntimeEngine, RecordingOrtSession]:
    engine = OnnxRuntimeEngine(
        EngineConfig(Path("m.onnx"), device="cuda", options={"cuda_graph": "1"})
    )
    session = RecordingOrtSession()
    engine._session = session  # type: ignore[assignment]
    return engine, session


# -- CUDA graphs: one graph id per input shape, none for the probe run ---------------------------


def test_the_fake_replays_graph_0_into_a_plain_run_as_ort_does():
    """Why the probe run must say -1: a run without run options is graph 0 to ORT, so the
    next plain run replays graph 0 on the first run's buffers and writes nothing of its own."""
    session = RecordingOrtSession()
    first, second = FakeBinding(), FakeBinding()
    for binding, batch in ((first, 1), (second, 2)):
        binding.bind_ortvalue_input("image", FakeOrtValue(np.ones((batch, 3, 4, 4), np.float32)))
        binding.bind_output("logits", "cuda", 0)
        session.run_with_iobinding(binding)
    assert [g for g, _ in session.runs] == [0, 0]
    with pytest.raises(RuntimeError, match="never written"):
        second.copy_outputs_to_cpu()


def test_each_shape_replays_its_own_graph_and_the_probe_runs_skip_graphs(fake_ort):
    engine, session = _cuda_graph_engine()
    rng = np.random.default_rng(0)
    batches = [1, 2, 3, 1]
    inputs = [rng.standard_normal((b, 3, 4, 4)).astype(np.float32) for b in batches]
    outputs = [engine.infer({"image": x}) for x in inputs]
    for x, out in zip(inputs, outputs, strict=True):
        np.testing.assert_allclose(out["logits"], logits_of(x))
        assert out["logits"].shape == (len(x), 10)
    ids = [graph for graph, _ in session.runs]
    # a new shape: a probe run that skips graphs (-1), then its own graph; batch 1 again
    # only replays graph 1
    assert ids == [-1, 1, -1, 2, -1, 3, 1]
    assert sorted(session.graphs) == [1, 2, 3]  # never graph 0, ORT's reserved default
    first_batch1, again_batch1 = session.runs[1][1], session.runs[6][1]
    assert again_batch1 is first_batch1  # the same device buffers, refilled in place
    slot = next(iter(engine._graphs.values()))
    assert (slot.graph_id, slot.run_options.entries) == (1, {"gpu_graph_id": "1"})


def test_a_bad_input_leaves_no_graph_slot_behind(fake_ort):
    engine, session = _cuda_graph_engine()
    with pytest.raises(KeyError):
        engine.infer({"not_image": np.zeros((1, 3, 4, 4), np.float32)})
    assert engine._graphs == {}
    assert session.graphs == {}


# -- the probe names the driver the build needs --------------------------------------------


def test_a_missing_driver_or_an_old_one_is_named_with_the_builds_requirement():
    missing = ort_gpu.driver_problem("1.31.1", "13.0", None)
    assert missing == (
        "no NVIDIA driver here (libcuda.so.1 not found): onnxruntime-gpu 1.31.1 is built"
        " with CUDA 13.0, needs an NVIDIA driver >= 580"
    )
    old = ort_gpu.driver_problem("1.31.1", "13.0", 12080)
    assert old is not None
    assert old.startswith("the NVIDIA driver supports CUDA 12.8, but onnxruntime-gpu 1.31.1")
    assert "needs an NVIDIA driver >= 580" in old
    assert "onnxruntime-gpu[cuda,cudnn]>=1.21,<1.27 (CUDA 12 builds)" in old
    assert ort_gpu.driver_problem("1.31.1", "13.0", 13000) is None
    assert ort_gpu.driver_problem("1.26.0", "12.8", 13000) is None
    assert ort_gpu.driver_problem("1.31.1", "", 12080) is None  # a build that does not say


def test_the_driver_version_comes_from_cuDriverGetVersion():
    assert ort_gpu.driver_cuda_version(RecordingLoader(versions={"driver": 12080})) == 12080
    assert ort_gpu.driver_cuda_version(RecordingLoader(missing={"libcuda.so.1"})) is None


def test_probe_on_cuda_reports_the_driver_requirement(fake_ort, monkeypatch):
    monkeypatch.setattr(ort_gpu, "driver_cuda_version", lambda: None)
    status = OnnxRuntimeEngine.probe("cuda:0")
    assert not status.available
    assert "libcuda.so.1 not found" in status.reason
    assert "built with CUDA 13.0, needs an NVIDIA driver >= 580" in status.reason
    monkeypatch.setattr(ort_gpu, "driver_cuda_version", lambda: 13000)
    assert OnnxRuntimeEngine.probe("cuda:0").available
    fake_ort.get_available_providers = lambda: ["CPUExecutionProvider"]
    cpu_build = OnnxRuntimeEngine.probe("cuda")
    assert "has no CUDAExecutionProvider" in cpu_build.reason
    assert ort_gpu.INSTALL_GPU in cpu_build.reason


# -- libraries checked before a GPU session ---------------------------------------------------


def test_the_cuda_stack_is_preloaded_and_checked_before_the_session(tmp_path):
    ort = fake_ort_module(tmp_path, preload_says=["Failed to load libcurand.so.10: gone"])
    loader = RecordingLoader()
    said = ort_gpu.prepare_gpu_libraries(ort, "CUDAExecutionProvider", loader)
    assert said == ["Failed to load libcurand.so.10: gone"]
    assert loader.opened == CUDA_LIBS


def test_a_missing_cuda_library_fails_the_load_naming_it_and_the_extra(tmp_path):
    said = ["Failed to load libcublasLt.so.13: not there", "Please follow https://onnxruntime.ai"]
    ort = fake_ort_module(tmp_path, preload_says=said)
    loader = RecordingLoader(missing={"libcublasLt.so.13", "libcublas.so.13"})
    with pytest.raises(ProviderLoadError) as caught:
        ort_gpu.prepare_gpu_libraries(ort, "CUDAExecutionProvider", loader)
    message = str(caught.value)
    assert message.startswith(
        "onnxruntime-gpu 1.31.1 (built with CUDA 13.0) cannot load libcublasLt.so.13,"
        " libcublas.so.13: libcublasLt.so.13: cannot open shared object file"
    )
    # what preload_dlls printed about the libraries named already is not repeated
    assert "(preload_dlls: Please follow https://onnxruntime.ai);" in message
    assert message.endswith(f"{ort_gpu.INSTALL_GPU} installs them (onnxruntime-gpu[cuda,cudnn])")
    assert isinstance(caught.value, EngineError)


def test_a_cpu_build_or_an_old_one_changes_nothing(tmp_path):
    cpu = fake_ort_module(tmp_path, providers=["CPUExecutionProvider"], cuda_version="")
    loader = RecordingLoader()
    assert ort_gpu.prepare_gpu_libraries(cpu, "CUDAExecutionProvider", loader) is None
    assert loader.opened == []
    old = fake_ort_module(tmp_path)
    del old.preload_dlls  # onnxruntime-gpu < 1.21
    assert ort_gpu.prepare_gpu_libraries(old, "CUDAExecutionProvider", loader) is None
    assert loader.opened == CUDA_LIBS


def _trt_provider(tmp_path: Path, major: int) -> None:
    capi = tmp_path / "onnxruntime" / "capi"
    capi.mkdir(parents=True, exist_ok=True)
    body = b"\x7fELF...libcudart.so.13\x00libnvinfer.so.%d\x00libnvonnxparser.so.%d\x00"
    (capi / ort_gpu.TRT_PROVIDER_LIB).write_bytes(body % (major, major))


def _wheel(tmp_path: Path, *names: str) -> Path:
    lib_dir = tmp_path / "tensorrt_libs"
    lib_dir.mkdir()
    for name in ("__init__.py", *names):
        (lib_dir / name).write_bytes(b"")
    return lib_dir


def test_the_tensorrt_major_is_the_one_the_provider_links(tmp_path):
    _trt_provider(tmp_path, 10)
    assert ort_gpu.linked_tensorrt_major(tmp_path / "onnxruntime" / "capi") == 10
    assert ort_gpu.linked_tensorrt_major(tmp_path / "nowhere") is None


def test_tensorrt_11_from_the_tensorrt_extra_cannot_serve_a_provider_linking_10(
    tmp_path, monkeypatch
):
    ort = fake_ort_module(tmp_path)
    _trt_provider(tmp_path, 10)
    wheel = _wheel(tmp_path, "libnvinfer.so.11", "libnvonnxparser.so.11")
    monkeypatch.setattr(ort_gpu, "tensorrt_wheel_dir", lambda: wheel)
    loader = RecordingLoader(missing={"libnvinfer.so.10", "libnvonnxparser.so.10"})
    with pytest.raises(ProviderLoadError) as caught:
        ort_gpu.prepare_gpu_libraries(ort, "TensorrtExecutionProvider", loader)
    assert str(caught.value) == (
        "onnxruntime 1.31.1's TensorRT provider links libnvinfer.so.10 (TensorRT 10), and"
        " libnvinfer.so.10, libnvonnxparser.so.10 cannot be loaded here: libnvinfer.so.10:"
        " cannot open shared object file: No such file or directory; tensorrt_libs here has"
        f" libnvinfer.so.11; {ort_gpu.INSTALL_TRT} installs TensorRT 10 (tensorrt-cu13-libs)"
    )
    assert not [n for n in loader.opened if ".so.11" in n]  # the other major is left alone
    assert loader.opened == [*CUDA_LIBS, "libnvinfer.so.10", "libnvonnxparser.so.10"]


def test_the_wheels_tensorrt_libraries_load_by_path_libnvinfer_first(tmp_path):
    wheel = _wheel(
        tmp_path,
        "libnvonnxparser.so.10",
        "libnvinfer_plugin.so.10",
        "libnvinfer_builder_resource.so.10.14.1",
        "libnvinfer.so.10",
        "libnvinfer_lean.so.10",
        "libnvinfer.so.11",
    )
    loader = RecordingLoader(missing={"libnvinfer_lean.so.10"})  # optional parts may fail
    ort_gpu.load_tensorrt_wheel(10, wheel, loader)
    assert [Path(p).name for p in loader.opened] == [
        "libnvinfer.so.10",
        "libnvinfer_builder_resource.so.10.14.1",
        "libnvinfer_lean.so.10",
        "libnvinfer_plugin.so.10",
        "libnvonnxparser.so.10",
    ]
    assert all(Path(p).parent == wheel for p in loader.opened)
    ort_gpu.load_tensorrt_wheel(10, None, loader)  # no wheel: nothing to do


def test_the_load_stops_before_the_session_when_tensorrt_is_missing(
    fake_ort, tmp_path, monkeypatch
):
    pytest.importorskip("onnx")
    from workloads.lib import models  # noqa: PLC0415

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    _trt_provider(tmp_path, 10)
    monkeypatch.setattr(ort_gpu, "tensorrt_wheel_dir", lambda: None)
    monkeypatch.setattr(ort_gpu, "open_library", RecordingLoader(missing={"libnvinfer.so.10"}))
    model = models.embedded("tiny-cnn").path
    engine = OnnxRuntimeEngine(EngineConfig(model, device="cuda", options={"provider": "tensorrt"}))
    with pytest.raises(ProviderLoadError, match=r"links libnvinfer\.so\.10 \(TensorRT 10\)"):
        engine.load()
    assert fake_ort.sessions == []


# -- what describe() records on a GPU ---------------------------------------------------------


def test_the_session_is_made_without_pythons_provider_fallback_and_described(
    fake_ort, tmp_path, monkeypatch
):
    monkeypatch.setattr(ort_gpu, "open_library", RecordingLoader())
    model = tmp_path / "m.onnx"
    model.write_bytes(b"onnx")
    fake_ort.preload_dlls = lambda: print("Failed to load libcufft.so.12: optional")
    engine = OnnxRuntimeEngine(EngineConfig(model, device="cuda"))
    engine.load()
    (made,) = fake_ort.sessions
    assert made["kwargs"] == {"enable_fallback": 0}
    assert made["providers"][0][0] == "CUDAExecutionProvider"
    effective = engine.describe()["effective"]
    assert effective["tf32"] is False
    libraries = effective["cuda_libraries"]
    assert libraries["built_with_cuda"] == "13.0"
    assert libraries["preload_dlls"] == ["Failed to load libcufft.so.12: optional"]
    assert set(libraries) == {"built_with_cuda", "mapped", "reported", "packages", "preload_dlls"}


def test_tf32_is_what_the_provider_reports():
    cuda = "CUDAExecutionProvider"
    assert ort_gpu.effective_tf32(cuda, {cuda: {"use_tf32": "0"}}) is False
    assert ort_gpu.effective_tf32(cuda, {cuda: {"use_tf32": "1"}}) is True
    assert ort_gpu.effective_tf32(cuda, {cuda: {}}) is None  # not reported: not claimed
    assert ort_gpu.effective_tf32("TensorrtExecutionProvider", {}) is True  # TensorRT default
    assert ort_gpu.effective_tf32("CPUExecutionProvider", {}) is None


MAPS = """\
7f00-7f01 r-xp 00000000 08:01 11 /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06
7f01-7f02 r--p 00001000 08:01 11 /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06
7f02-7f03 r-xp 00000000 08:01 12 /venv/site-packages/nvidia/cu13/lib/libcudart.so.13
7f03-7f04 r-xp 00000000 08:01 13 /venv/site-packages/nvidia/cu13/lib/libcublasLt.so.13
7f04-7f05 r-xp 00000000 08:01 14 /venv/site-packages/nvidia/cudnn/lib/libcudnn.so.9
7f05-7f06 r-xp 00000000 08:01 15 /venv/site-packages/nvidia/cudnn/lib/libcudnn_ops.so.9
7f06-7f07 r-xp 00000000 08:01 16 /venv/site-packages/tensorrt_libs/libnvinfer.so.10
7f07-7f08 rw-p 00000000 00:00 0 [heap]
7f08-7f09 rw-p 00000000 00:00 0
"""


def test_the_mapped_libraries_are_read_from_the_process_maps():
    found = ort_gpu.mapped_libraries(MAPS, ort_gpu.WATCHED_LIBS)
    assert found == {
        "libcuda.so.580.65.06": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06",
        "libcudart.so.13": "/venv/site-packages/nvidia/cu13/lib/libcudart.so.13",
        "libcublasLt.so.13": "/venv/site-packages/nvidia/cu13/lib/libcublasLt.so.13",
        "libcudnn.so.9": "/venv/site-packages/nvidia/cudnn/lib/libcudnn.so.9",
    }
    trt = ort_gpu.mapped_libraries(MAPS, ort_gpu.WATCHED_LIBS + ort_gpu.WATCHED_LIBS_TRT)
    assert trt["libnvinfer.so.10"].endswith("tensorrt_libs/libnvinfer.so.10")


def test_loaded_libraries_report_their_versions():
    loader = RecordingLoader(versions={"driver": 13000, "runtime": 13050})
    cudnn = SimpleNamespace(cudnnGetVersion=lambda: 92801)

    def load(name: str):
        return cudnn if name == "libcudnn.so.9" else loader(name)

    assert ort_gpu.reported_versions(13, load) == {
        "driver_supports_cuda": "13.0",
        "cuda_runtime": "13.5",
        "cudnn": "9.28.1",
    }
    nothing = RecordingLoader(missing={"libcuda.so.1", "libcudart.so.13", "libcudnn.so.9"})
    assert ort_gpu.reported_versions(13, nothing) == {}


def test_installed_versions_list_only_what_is_installed():
    known = {"nvidia-cudnn-cu13": "9.28.1.4", "nvidia-cuda-runtime": "13.5.37"}

    def version(name: str) -> str:
        if name not in known:
            raise ort_gpu.importlib.metadata.PackageNotFoundError(name)
        return known[name]

    assert ort_gpu.installed_versions(ort_gpu.CUDA_PACKAGES, version) == known


# -- the conformance class skips when the provider's libraries are missing ---------------------


def test_the_tensorrt_conformance_class_skips_with_the_adapters_reason():
    from harness.engine import Availability  # noqa: PLC0415
    from harness.engine.conformance import Subject  # noqa: PLC0415
    from tests.test_gpu_conformance import _skip_unless_it_loads  # noqa: PLC0415

    closed = []

    def factory(error: Exception):
        class Engine:
            @classmethod
            def probe(cls, device):
                return Availability(True)

            def __init__(self, config):
                pass

            def load(self):
                raise error

            def close(self):
                closed.append(True)

        return Engine

    missing = ProviderLoadError("links libnvinfer.so.10 (TensorRT 10); pip install ...")
    subject = Subject(factory(missing), model=Path("m.onnx"), device="cuda")
    with pytest.raises(pytest.skip.Exception, match=r"links libnvinfer\.so\.10"):
        _skip_unless_it_loads(subject)
    broken = Subject(factory(EngineError("a bug")), model=Path("m.onnx"), device="cuda")
    with pytest.raises(EngineError, match="a bug"):
        _skip_unless_it_loads(broken)
    assert closed == [True, True]
