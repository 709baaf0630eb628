"""ONNX Runtime's GPU builds: the driver they need, the CUDA, cuDNN and TensorRT libraries
their providers link, and which of them this process loaded.

A GPU build of ORT that cannot load a library its provider needs logs it and falls back
to the CPU; these functions find that out before a session exists, name what is missing
and what to install, and record what was loaded (for ``describe()``). They take the
``onnxruntime`` module and a library loader as arguments (the tests pass recording fakes)
and import nothing of ORT themselves.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import importlib.util
import io
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.engine import EngineError

CUDA_PROVIDER = "CUDAExecutionProvider"
TENSORRT_PROVIDER = "TensorrtExecutionProvider"

# NVIDIA's minimum driver per CUDA major (minor version compatibility: any 12.x runtime runs
# on a >= 525 driver, any 13.x runtime on a >= 580 driver).
DRIVER_FLOOR = {12: "525", 13: "580"}
# PyPI's onnxruntime-gpu per CUDA major, from the wheels' [cuda] extra: 1.21-1.26 require
# nvidia-cuda-runtime-cu12, 1.27 and newer CUDA 13 packages.
PYPI_BUILDS = {
    12: "onnxruntime-gpu[cuda,cudnn]>=1.21,<1.27",
    13: "onnxruntime-gpu[cuda,cudnn]>=1.27",
}
# cuDNN major of every onnxruntime-gpu with a [cudnn] extra (nvidia-cudnn-cu1x~=9.0). 1.31
# opens it lazily (dlopen at the first cuDNN op, so a missing one fails the run, not the
# load), older builds link it: either way a CNN needs it, so the load checks it.
CUDNN_MAJOR = 9
# cuRAND keeps major 10 in CUDA 12 and 13 (the [cuda] extras require nvidia-curand~=10.0)
CURAND_MAJOR = 10
TRT_PROVIDER_LIB = "libonnxruntime_providers_tensorrt.so"
INSTALL_GPU = "pip install 'inference-harness[onnxruntime-gpu]'"
INSTALL_TRT = "pip install 'inference-harness[onnxruntime-trt]'"
# what describe() reports as loaded: the file names in /proc/self/maps carry the versions
# (libcuda.so.580.65.06, libcudart.so.13.0.96) where the installer kept them
WATCHED_LIBS = ("libcuda.so", "libcudart.so", "libcublasLt.so", "libcublas.so", "libcudnn.so")
WATCHED_LIBS_TRT = ("libnvinfer.so", "libnvonnxparser.so")
CUDA_PACKAGES = (
    "onnxruntime-gpu",
    "nvidia-cuda-runtime",
    "nvidia-cuda-runtime-cu12",
    "nvidia-cuda-runtime-cu13",
    "nvidia-cublas",
    "nvidia-cublas-cu12",
    "nvidia-cublas-cu13",
    "nvidia-cudnn-cu12",
    "nvidia-cudnn-cu13",
    "tensorrt-cu12-libs",
    "tensorrt-cu13-libs",
)

Loader = Callable[[str], Any]


def open_library(name: str) -> Any:
    """dlopen through ctypes; the functions below take another ``load`` in its place (the
    tests' recording fakes) and look this one up at call time."""
    return ctypes.CDLL(name)


class ProviderLoadError(EngineError):
    """The requested execution provider's native libraries cannot be loaded here: the
    environment lacks them (the message says what to install), the model is not at fault."""


def cuda_build_major(build: str) -> int | None:
    """The CUDA major of ORT's build string ('13.0' -> 13); None for CPU builds ('')."""
    head = build.partition(".")[0]
    return int(head) if head.isdigit() else None


def _cuda_text(version: int) -> str:
    """CUDA's integer versions (cudaRuntimeGetVersion, cuDriverGetVersion): 13000 -> 13.0."""
    return f"{version // 1000}.{version % 1000 // 10}"


def driver_cuda_version(load: Loader | None = None) -> int | None:
    """The CUDA version the NVIDIA driver supports (cuDriverGetVersion, 13000 for 13.0), None
    without a driver. It needs no GPU context, so the probe can ask it."""
    try:
        lib = (load or open_library)("libcuda.so.1")
    except OSError:
        return None
    value = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(value)) != 0:
        return None
    return int(value.value)


def _driver_need(version: str, build: str) -> str:
    major = cuda_build_major(build)
    if major is None:
        return f"onnxruntime-gpu {version} needs an NVIDIA driver"
    floor = f">= {DRIVER_FLOOR[major]}" if major in DRIVER_FLOOR else f"for CUDA {major}"
    return f"onnxruntime-gpu {version} is built with CUDA {build}, needs an NVIDIA driver {floor}"


def driver_problem(version: str, build: str, driver: int | None) -> str | None:
    """Why the driver cannot run this ORT build (None: it can, or the build does not say)."""
    need = _driver_need(version, build)
    if driver is None:
        return f"no NVIDIA driver here (libcuda.so.1 not found): {need}"
    major = cuda_build_major(build)
    if major is None or driver // 1000 >= major:
        return None
    other = PYPI_BUILDS.get(driver // 1000)
    alt = f", or install {other} (CUDA {driver // 1000} builds)" if other else ""
    return f"the NVIDIA driver supports CUDA {_cuda_text(driver)}, but {need}: upgrade it{alt}"


def preload_cuda_libraries(ort: Any) -> list[str] | None:
    """ORT's own preload of the CUDA and cuDNN libraries of its [cuda,cudnn] extras (the
    nvidia-* wheels, off the loader's path). It returns None and prints what it could not
    load; those lines are returned. None: this ORT (< 1.21) has no preload_dlls."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return None
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        preload()
    return [line for line in said.getvalue().splitlines() if line.strip()]


def linked_tensorrt_major(capi: Path) -> int | None:
    """The libnvinfer major ORT's TensorRT provider links (its NEEDED entry, found in the
    library's bytes: 1 MB). None where the provider library is absent."""
    try:
        data = (capi / TRT_PROVIDER_LIB).read_bytes()
    except OSError:
        return None
    found = re.search(rb"libnvinfer\.so\.(\d+)", data)
    return int(found.group(1)) if found else None


def tensorrt_wheel_dir() -> Path | None:
    """Where the tensorrt-cuXX-libs wheel keeps its libraries (off the loader's path)."""
    spec = importlib.util.find_spec("tensorrt_libs")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def load_tensorrt_wheel(major: int, lib_dir: Path | None, load: Loader | None = None) -> None:
    """Load the wheel's TensorRT ``major`` libraries by path, libnvinfer first, so that ORT's
    provider finds them by soname (ORT's preload_dlls does not know TensorRT). The ones
    the provider needs are checked afterwards by name."""
    if lib_dir is None:
        return
    first = f"libnvinfer.so.{major}"
    ours = re.compile(rf"lib\w+\.so\.{major}(\.[\d.]+)?")
    paths = [p for p in lib_dir.iterdir() if ours.fullmatch(p.name)]
    for path in sorted(paths, key=lambda p: (p.name != first, p.name)):
        with contextlib.suppress(OSError):  # optional parts (lean, dispatch) may not load
            (load or open_library)(str(path))


def required_libraries(cuda_major: int, trt_major: int | None) -> list[str]:
    """The sonames the provider needs: readelf -d of onnxruntime-gpu 1.31.1's providers
    (cuda: libcudart/libcublasLt/libcublas.so.13, libcurand.so.10; tensorrt: also
    libcudnn.so.9, libnvinfer/libnvonnxparser.so.10), and cuDNN, which the CUDA provider
    opens lazily. libcuda.so.1, the driver, is the probe's."""
    libs = [f"lib{n}.so.{cuda_major}" for n in ("cudart", "cublasLt", "cublas")]
    libs += [f"libcurand.so.{CURAND_MAJOR}", f"libcudnn.so.{CUDNN_MAJOR}"]
    if trt_major is not None:
        libs += [f"libnvinfer.so.{trt_major}", f"libnvonnxparser.so.{trt_major}"]
    return libs


def unloadable(names: Iterable[str], load: Loader | None = None) -> dict[str, str]:
    """The libraries of ``names`` the dynamic loader cannot open, with its reason."""
    missing: dict[str, str] = {}
    for name in names:
        try:
            (load or open_library)(name)
        except OSError as exc:
            missing[name] = str(exc)
    return missing


@dataclass(frozen=True)
class GpuBuild:
    """What the installed ORT is built against, for the load's checks and messages."""

    version: str
    cuda: str  # ORT's build string, '13.0'; '' for CPU builds
    trt_major: int | None = None

    @classmethod
    def of(cls, ort: Any, tensorrt: bool) -> GpuBuild:
        cuda = str(getattr(ort, "cuda_version", "") or "")
        trt = linked_tensorrt_major(Path(ort.__file__).parent / "capi") if tensorrt else None
        return cls(ort.__version__, cuda, trt)


def missing_message(
    build: GpuBuild, missing: Mapping[str, str], said: list[str] | None, wheel: list[str]
) -> str:
    """What cannot be loaded and what to install: the CUDA stack, TensorRT by its major
    (``wheel``: the libnvinfer files the tensorrt_libs package here has)."""
    parts = []
    cuda = {n: why for n, why in missing.items() if not n.startswith("libnv")}
    if cuda:
        news = [line for line in said or () if not any(name in line for name in cuda)]
        preload = " (preload_dlls: " + " | ".join(news) + ")" if news else ""
        parts.append(
            f"onnxruntime-gpu {build.version} (built with CUDA {build.cuda}) cannot load"
            f" {', '.join(cuda)}: {next(iter(cuda.values()))}{preload}; {INSTALL_GPU}"
            " installs them (onnxruntime-gpu[cuda,cudnn])"
        )
    trt = {n: why for n, why in missing.items() if n.startswith("libnv")}
    if trt:
        found = f"; tensorrt_libs here has {', '.join(wheel)}" if wheel else ""
        parts.append(
            f"onnxruntime {build.version}'s TensorRT provider links libnvinfer.so."
            f"{build.trt_major} (TensorRT {build.trt_major}), and {', '.join(trt)} cannot be"
            f" loaded here: {next(iter(trt.values()))}{found}; {INSTALL_TRT} installs"
            f" TensorRT {build.trt_major} (tensorrt-cu{cuda_build_major(build.cuda)}-libs)"
        )
    return "; ".join(parts)


def _nvinfer_files(lib_dir: Path | None) -> list[str]:
    return sorted(p.name for p in lib_dir.glob("libnvinfer.so.*")) if lib_dir else []


def prepare_gpu_libraries(ort: Any, wanted: str, load: Loader | None = None) -> list[str] | None:
    """Make the libraries ``wanted`` links loadable before the session exists, or raise
    ProviderLoadError saying what is missing: ORT itself only logs a missing CUDA library
    and falls back to the CPU. Returns what preload_dlls printed (None: not available)."""
    if CUDA_PROVIDER not in ort.get_available_providers():
        return None  # a CPU build: the load's check of the activated providers says so
    said = preload_cuda_libraries(ort)
    build = GpuBuild.of(ort, tensorrt=wanted == TENSORRT_PROVIDER)
    major = cuda_build_major(build.cuda)
    if major is None:
        return said
    wheel = tensorrt_wheel_dir() if build.trt_major is not None else None
    if build.trt_major is not None:
        load_tensorrt_wheel(build.trt_major, wheel, load)
    missing = unloadable(required_libraries(major, build.trt_major), load)
    if missing:
        raise ProviderLoadError(missing_message(build, missing, said, _nvinfer_files(wheel)))
    return said


def mapped_libraries(maps: str, prefixes: tuple[str, ...]) -> dict[str, str]:
    """Shared libraries mapped into this process (``/proc/self/maps`` text) whose file names
    start with one of ``prefixes``: file name -> path."""
    found: dict[str, str] = {}
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            name = os.path.basename(fields[5])
            if name.startswith(prefixes):
                found.setdefault(name, fields[5])
    return found


def _loaded_only(name: str) -> Any:
    """A handle to ``name`` if it is already loaded: describe() must not load anything."""
    return ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)


def _int_out(load: Loader, name: str, symbol: str) -> int | None:
    try:
        lib = load(name)
    except OSError:
        return None
    value = ctypes.c_int(0)
    return int(value.value) if getattr(lib, symbol)(ctypes.byref(value)) == 0 else None


def reported_versions(cuda_major: int, load: Loader = _loaded_only) -> dict[str, str]:
    """The versions the loaded libraries report themselves (not loaded: absent)."""
    out: dict[str, str] = {}
    for key, name, symbol in (
        ("driver_supports_cuda", "libcuda.so.1", "cuDriverGetVersion"),
        ("cuda_runtime", f"libcudart.so.{cuda_major}", "cudaRuntimeGetVersion"),
    ):
        version = _int_out(load, name, symbol)
        if version:
            out[key] = _cuda_text(version)
    try:
        cudnn = load(f"libcudnn.so.{CUDNN_MAJOR}")
    except OSError:
        return out
    cudnn.cudnnGetVersion.restype = ctypes.c_size_t
    number = int(cudnn.cudnnGetVersion())  # cuDNN 9: major * 10000 + minor * 100 + patch
    out["cudnn"] = f"{number // 10000}.{number // 100 % 100}.{number % 100}"
    return out


def installed_versions(
    names: Iterable[str], version: Callable[[str], str] = importlib.metadata.version
) -> dict[str, str]:
    """Installed versions of the packages that ship ORT's CUDA libraries (what pip put
    there; ``mapped`` says which files the process actually uses)."""
    out: dict[str, str] = {}
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = version(name)
    return out


def _read_maps() -> str:
    try:
        return Path("/proc/self/maps").read_text()
    except OSError:
        return ""


def cuda_libraries_record(ort: Any, tensorrt: bool, preload: list[str] | None) -> dict[str, Any]:
    """describe()'s account of the CUDA stack: ORT's build, the files mapped now (cuDNN may
    appear only after its first op), the versions they report, the installed packages."""
    build = str(getattr(ort, "cuda_version", "") or "")
    major = cuda_build_major(build)
    prefixes = WATCHED_LIBS + (WATCHED_LIBS_TRT if tensorrt else ())
    return {
        "built_with_cuda": build,
        "mapped": mapped_libraries(_read_maps(), prefixes),
        "reported": reported_versions(major) if major is not None else {},
        "packages": installed_versions(CUDA_PACKAGES),
        "preload_dlls": "unavailable" if preload is None else (preload or "loaded"),
    }


def effective_tf32(provider: str, options: Mapping[str, Mapping[str, str]]) -> bool | None:
    """Whether fp32 matmuls and convolutions may run as TF32: the CUDA provider's own
    report of use_tf32; TensorRT's builder allows TF32 by default and ORT's TensorRT
    provider has no option to clear it; None on the CPU (no TF32)."""
    if provider == TENSORRT_PROVIDER:
        return True
    if provider != CUDA_PROVIDER:
        return None
    reported = options.get(provider, {}).get("use_tf32")
    return None if reported is None else reported == "1"


def cuda_unavailable(ort: Any, driver: int | None) -> str | None:
    """Why ``ort`` cannot run on an NVIDIA GPU here: no CUDA provider compiled in, no driver,
    or a driver older than the build's CUDA major needs; None when nothing is known wrong."""
    available = ort.get_available_providers()
    if CUDA_PROVIDER not in available:
        return (
            f"onnxruntime {ort.__version__} has no CUDAExecutionProvider"
            f" (providers: {', '.join(available)}); install onnxruntime-gpu"
            f" ({INSTALL_GPU}) on a machine with an NVIDIA GPU"
        )
    return driver_problem(ort.__version__, str(getattr(ort, "cuda_version", "") or ""), driver)
