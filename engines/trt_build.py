"""What the TensorRT adapter asks TensorRT to build, and the build: its options, the build
plan derived from them (pure, without TensorRT), and the serialized engine made from the
ONNX model.

Build: the ONNX parser fills a network; every dynamic input gets (min, opt, max) shapes
from ``engines.trt_profiles`` (several profiles allowed); a persistent timing cache makes
rebuilds fast. The adapter caches the serialized engine under a key of ONNX hash,
TensorRT version, GPU, profiles and builder settings (``BuildPlan.settings``: flags set
and cleared, TF32 included).

Precision: ``BuilderFlag.TF32`` is on by default in TensorRT 10 and 11 and lets fp32
convolutions and matmuls round their inputs to 10-bit mantissas, so the plan clears it
unless ``tf32=1``: fp32 means fp32. TensorRT 10 still takes ``BuilderFlag.FP16`` on a
weakly typed network (deprecated since 10.12); TensorRT 11 has no FP16 flag (networks are
strongly typed: the ONNX model's types decide), so the adapter's
``precision_options("fp16")`` refuses there, from the installed version read in package
metadata, and the precision cell skips with the reason. At build, the flags are detected
from ``trt.BuilderFlag``, not assumed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines import trt_profiles
from harness.engine import EngineError
from harness.engine.optionschema import OptionSchema, choice, custom, flag, integer, text
from harness.results.store import replace

# The adapter's options (``TensorRTEngine.option_schema``): the build's and the run's.
OPTIONS = OptionSchema(
    custom(
        "profiles",
        "optimization profiles, ';'-separated (a named dim not given is 1:N:N from dims=NAME=N)",
        trt_profiles.parse_ranges,
        "NAME=MIN:OPT:MAX[,...][;...]",
        default=trt_profiles.DEFAULT_PROFILE,
    ),
    custom(
        "dims",
        "sizes of named dynamic dims (what --dim gives other engines)",
        trt_profiles.parse_dims,
        "NAME=N[,...]",
    ),
    choice(
        "precision",
        "fp16: TensorRT 10's FP16 builder flag (TensorRT 11: refused, give an fp16 ONNX model:"
        " networks are strongly typed)",
        ("fp32", "fp16"),
        default="fp32",
    ),
    flag(
        "tf32",
        "let fp32 layers use TF32 (BuilderFlag.TF32, on by TensorRT's default; off here, so"
        " fp32 is fp32)",
    ),
    flag("cuda_graph", "capture and replay a CUDA graph per input shape"),
    integer(
        "workspace_mib", "builder workspace memory pool limit in MiB", default="4096", high=2**20
    ),
    integer("optimization_level", "builder optimization level", default="3", low=0, high=5),
    text("cache_dir", "engine and timing caches (default $HARNESS_CACHE_DIR/tensorrt)"),
)
NO_FP16 = (
    "TensorRT {version} has no FP16 builder flag (networks are strongly typed): convert the"
    " ONNX model to fp16 and build it with precision=fp32"
)


def known_builder_flags(trt_major: int) -> frozenset[str]:
    """The precision flags of ``BuilderFlag`` per major, for plans made without TensorRT:
    TensorRT 11 dropped FP16 (its enum starts at kDEBUG); TF32 is in both."""
    return frozenset({"TF32"} if trt_major >= 11 else {"FP16", "TF32"})


@dataclass(frozen=True)
class BuildPlan:
    """What the builder is asked for, derived from the options and the TensorRT flags."""

    strongly_typed: bool
    builder_flags: tuple[str, ...]
    cleared_flags: tuple[str, ...]
    tf32: bool | None  # None: this TensorRT has no TF32 flag to decide with
    workspace_bytes: int
    optimization_level: int

    def settings(self) -> dict[str, Any]:
        """Everything an engine depends on: it keys the engine cache and is reported."""
        return {
            "strongly_typed": self.strongly_typed,
            "builder_flags": list(self.builder_flags),
            "cleared_flags": list(self.cleared_flags),
            "tf32": self.tf32,
            "workspace_bytes": self.workspace_bytes,
            "optimization_level": self.optimization_level,
        }


def build_plan(
    options: Mapping[str, str], trt_major: int, flags: Collection[str] | None = None
) -> BuildPlan:
    """Pure: the network and builder settings for ``options`` on TensorRT ``trt_major``
    whose ``BuilderFlag`` has the members ``flags`` (default: what that major has)."""
    names = frozenset(flags) if flags is not None else known_builder_flags(trt_major)
    o = OPTIONS.resolve(options)
    precision = o["precision"]
    if precision == "fp16" and "FP16" not in names:
        raise ValueError(NO_FP16.format(version=trt_major))
    tf32 = o["tf32"] == "1"
    wanted = (("FP16", precision == "fp16"), ("TF32", tf32))
    return BuildPlan(
        strongly_typed=trt_major >= 11,
        builder_flags=tuple(name for name, on in wanted if on and name in names),
        # TF32 is on by default: fp32 needs it cleared, not merely left unset
        cleared_flags=("TF32",) if "TF32" in names and not tf32 else (),
        tf32=tf32 if "TF32" in names else None,
        workspace_bytes=int(o["workspace_mib"]) * 2**20,
        optimization_level=int(o["optimization_level"]),
    )


def build_engine(
    trt: Any,
    logger: Any,
    onnx_bytes: bytes,
    plan: BuildPlan,
    *,
    model: Path,
    profiles: Sequence[trt_profiles.Profile],
    cache_dir: Path,
    gpu: str,
) -> bytes:
    """The serialized engine TensorRT builds from ``onnx_bytes`` (read from ``model``) for
    ``plan`` and ``profiles``, through the timing cache kept in ``cache_dir`` per TensorRT
    version and GPU."""
    builder = trt.Builder(logger)
    flags = 0
    if plan.strongly_typed and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes, str(model)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineError(f"TensorRT's ONNX parser refused {model}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, plan.workspace_bytes)
    config.builder_optimization_level = plan.optimization_level
    for member in plan.builder_flags:
        config.set_flag(getattr(trt.BuilderFlag, member))
    for member in plan.cleared_flags:
        config.clear_flag(getattr(trt.BuilderFlag, member))
    _add_profiles(builder, config, profiles)
    timing_file = cache_dir / f"timing-{trt.__version__}-{gpu.replace(' ', '_')}.cache"
    timing = config.create_timing_cache(timing_file.read_bytes() if timing_file.is_file() else b"")
    config.set_timing_cache(timing, False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineError(f"TensorRT could not build an engine from {model}")
    replace(timing_file, bytes(memoryview(config.get_timing_cache().serialize())))
    return bytes(memoryview(serialized))


def _add_profiles(builder: Any, config: Any, profiles: Sequence[trt_profiles.Profile]) -> None:
    for profile in profiles:
        trt_profile = builder.create_optimization_profile()
        for name, (low, opt, high) in profile.shapes.items():
            trt_profile.set_shape(name, low, opt, high)
        if config.add_optimization_profile(trt_profile) < 0:
            raise EngineError(f"TensorRT refused the optimization profile {profile.shapes}")
