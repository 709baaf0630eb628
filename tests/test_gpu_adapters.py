"""The GPU-only adapters without a GPU: they import without their engines, say precisely
why they cannot run, and their logic that needs no GPU is right: optimization profiles
from shapes, engine-cache keys, builder plans per TensorRT version, provider options,
engine and sampling arguments, and the accounting of streamed deltas."""

from __future__ import annotations

import importlib
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from engines import lmdeploy as lmd
from engines import tensorrt_llm as trtllm
from engines import trt_profiles
from engines.onnxruntime import provider_list
from engines.tensorrt import TensorRTEngine, build_plan
from harness.engine import EngineError, GenerationRequest, TensorSpec, registry
from harness.session.outcome import RunExit
from tests.support.runner import run_workloads

GPU_ONLY = {
    "tensorrt": "tensorrt",
    "tensorrt-llm": "tensorrt_llm",
    "lmdeploy": "lmdeploy",
}
F32 = np.dtype(np.float32)
IMAGE = TensorSpec("image", F32, ("batch", 3, 64, 64))
TOKENS = TensorSpec("input_ids", np.dtype(np.int64), ("batch", "sequence"))


@pytest.mark.parametrize("name", sorted(GPU_ONLY))
def test_adapters_import_without_their_engine_and_say_why(name):
    module = GPU_ONLY[name]
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    registry.load(name)  # the adapter class imports cleanly
    assert module not in sys.modules
    cpu = registry.status(name, "cpu").availability
    assert (cpu.available, cpu.reason) == (False, f"{name} does not support device 'cpu'")
    cuda = registry.status(name, "cuda").availability
    assert not cuda.available
    assert cuda.reason.startswith(f"{module} is not installed (pip install ")
    assert "NVIDIA GPU" in cuda.reason


# -- optimization profiles and cache keys ------------------------------------------------------


def test_profiles_fix_static_dims_and_range_the_batch():
    (profile,) = trt_profiles.derive_all((IMAGE,), None, {})
    assert profile.shapes == {"image": ((1, 3, 64, 64), (8, 3, 64, 64), (32, 3, 64, 64))}
    assert profile.ort_options() == {
        "trt_profile_min_shapes": "image:1x3x64x64",
        "trt_profile_opt_shapes": "image:8x3x64x64",
        "trt_profile_max_shapes": "image:32x3x64x64",
    }


def test_named_dims_come_from_the_spec_string_or_dims():
    mask = TensorSpec("attention_mask", np.dtype(np.int64), ("batch", "sequence"))
    first, second = trt_profiles.derive_all(
        (TOKENS, mask), "batch=1:4:8,sequence=16:128:512;batch=16:32:64", {"sequence": 256}
    )
    assert first.shapes["input_ids"] == ((1, 16), (4, 128), (8, 512))
    assert first.shapes["attention_mask"] == first.shapes["input_ids"]
    # the second profile names no sequence range: --dim gives 1:256:256
    assert second.shapes["input_ids"] == ((16, 1), (32, 256), (64, 256))


def test_a_dynamic_dim_without_a_range_is_an_error_saying_what_to_give():
    with pytest.raises(
        ValueError, match=r"input_ids dim 1 \('sequence'\) is dynamic.*--dim sequence=MAX"
    ):
        trt_profiles.derive_all((TOKENS,), None, {})
    unnamed = TensorSpec("x", F32, (None, None))
    with pytest.raises(ValueError, match=r"dim 1 \(unnamed\)"):
        trt_profiles.derive_all((unnamed,), None, {})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("batch=1:8", "expected NAME=MIN:OPT:MAX"),
        ("batch=8:4:16", "1 <= min <= opt <= max"),
        ("batch", "expected NAME=MIN:OPT:MAX"),
        (";", "empty profile"),
    ],
)
def test_bad_profile_strings_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        trt_profiles.parse_ranges(text)


def test_the_first_profile_that_holds_the_shapes_is_chosen():
    profiles = trt_profiles.derive_all((IMAGE,), "batch=1:1:4;batch=5:16:64", {})
    assert trt_profiles.select_profile(profiles, {"image": (4, 3, 64, 64)}) == 0
    assert trt_profiles.select_profile(profiles, {"image": (5, 3, 64, 64)}) == 1
    with pytest.raises(ValueError, match="no optimization profile holds"):
        trt_profiles.select_profile(profiles, {"image": (65, 3, 64, 64)})
    with pytest.raises(ValueError, match="no optimization profile holds"):
        trt_profiles.select_profile(profiles, {"image": (2, 3, 64, 65)})


def test_the_cache_key_changes_with_everything_an_engine_depends_on():
    profiles = trt_profiles.derive_all((IMAGE,), None, {})
    build = {"builder_flags": ["FP16"], "optimization_level": 3}
    base = trt_profiles.cache_key("abc", "10.13.0", "NVIDIA H200 sm_90", profiles, build)
    assert base == trt_profiles.cache_key("abc", "10.13.0", "NVIDIA H200 sm_90", profiles, build)
    other_profiles = trt_profiles.derive_all((IMAGE,), "batch=1:4:16", {})
    variants = [
        ("abd", "10.13.0", "NVIDIA H200 sm_90", profiles, build),
        ("abc", "10.14.0", "NVIDIA H200 sm_90", profiles, build),
        ("abc", "10.13.0", "NVIDIA H100 sm_90", profiles, build),
        ("abc", "10.13.0", "NVIDIA H200 sm_90", other_profiles, build),
        ("abc", "10.13.0", "NVIDIA H200 sm_90", profiles, {**build, "builder_flags": []}),
    ]
    keys = {trt_profiles.cache_key(*v) for v in variants}
    assert base not in keys
    assert len(keys) == len(variants)


# -- TensorRT builder plans and options --------------------------------------------------------


def test_fp16_is_a_builder_flag_on_tensorrt_10_and_refused_on_11():
    plan = build_plan({"precision": "fp16", "workspace_mib": "512"}, 10)
    assert plan.builder_flags == ("FP16",)
    assert not plan.strongly_typed
    assert plan.workspace_bytes == 512 * 2**20
    assert build_plan({}, 11).strongly_typed
    assert build_plan({}, 11).builder_flags == ()
    assert build_plan({}, 11).cleared_flags == ("TF32",)  # fp32 is fp32, not TF32
    with pytest.raises(ValueError, match="TensorRT 11 has no FP16 builder flag"):
        build_plan({"precision": "fp16"}, 11)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"precision": "int8"}, "precision must be fp32 or fp16"),
        ({"cuda_graph": "yes"}, "cuda_graph must be 0 or 1"),
        ({"tf32": "on"}, "tf32 must be 0 or 1"),
        ({"optimization_level": "6"}, r"optimization_level must be an integer in \[0, 5\]"),
        ({"profiles": "batch=2:1:4"}, "min <= opt <= max"),
        ({"dims": "sequence=0"}, "NAME=N with N >= 1"),
        ({"fp16": "1"}, "unknown option"),
    ],
)
def test_tensorrt_options_are_checked_at_configuration(options, message):
    with pytest.raises(ValueError, match=message):
        TensorRTEngine.validate_options(options)


# -- ONNX Runtime's GPU providers -----------------------------------------------------------


def test_onnxruntime_providers_per_device(tmp_path):
    assert provider_list("cpu", {}, tmp_path) == [("CPUExecutionProvider", {})]
    ((name, cuda),) = provider_list("cuda:1", {"cuda_graph": "1"}, tmp_path)
    assert name == "CUDAExecutionProvider"
    assert cuda == {
        "device_id": "1",
        "enable_cuda_graph": "1",
        "use_tf32": "0",
        "cudnn_conv_algo_search": "EXHAUSTIVE",
    }
    options = {"provider": "tensorrt", "trt_fp16": "1", "trt_profiles": "batch=1:2:4"}
    (trt_name, trt), (fallback, cuda) = provider_list("cuda", options, tmp_path, (IMAGE,))
    assert (trt_name, fallback) == ("TensorrtExecutionProvider", "CUDAExecutionProvider")
    assert trt["trt_fp16_enable"] == "1"
    assert trt["trt_engine_cache_path"] == trt["trt_timing_cache_path"] == str(tmp_path)
    assert trt["trt_profile_max_shapes"] == "image:4x3x64x64"
    assert cuda["enable_cuda_graph"] == "0"


# -- TensorRT-LLM ----------------------------------------------------------------------------


def test_tensorrt_llm_arguments_are_explicit_with_block_reuse_off():
    llm, kv = trtllm.llm_kwargs("/m", {"max_seq_len": "512"})
    assert llm == {
        "model": "/m",
        "max_batch_size": 64,
        "max_num_tokens": 8192,
        "tensor_parallel_size": 1,
        "dtype": "auto",
        "return_perf_metrics": True,
        "max_seq_len": 512,
    }
    assert kv == {"enable_block_reuse": False, "free_gpu_memory_fraction": 0.9}
    greedy = trtllm.sampling_kwargs(GenerationRequest((1, 2), 16))
    assert greedy == {"max_tokens": 16, "ignore_eos": True, "return_perf_metrics": True, "top_k": 1}
    sampled = trtllm.sampling_kwargs(GenerationRequest("hi", 4, ignore_eos=False, temperature=0.7))
    assert sampled["temperature"] == 0.7
    assert "top_k" not in sampled
    with pytest.raises(ValueError, match="kv_cache_free_gpu_memory_fraction"):
        trtllm.TensorRTLLMEngine.validate_options({"kv_cache_free_gpu_memory_fraction": "1.5"})


def test_cumulative_token_ids_become_deltas():
    deltas = trtllm.Deltas()
    # a version with token_ids_diff, then one without: both give the same deltas
    steps = [[5], [5, 6, 7], [5, 6, 7, 8]]
    with_diff = [
        SimpleNamespace(token_ids=s, token_ids_diff=s[len(p) :])
        for p, s in zip([[], *steps], steps, strict=False)
    ]
    assert [deltas.new_ids(c) for c in with_diff] == [(5,), (6, 7), (8,)]
    plain = trtllm.Deltas()
    assert [plain.new_ids(SimpleNamespace(token_ids=s)) for s in steps] == [(5,), (6, 7), (8,)]
    assert plain.seen == 4
    broken = trtllm.Deltas()
    broken.new_ids(SimpleNamespace(token_ids=[1, 2], token_ids_diff=[1, 2]))
    with pytest.raises(EngineError, match="stream accounting: 2 seen \\+ 2 new != 3 total"):
        broken.new_ids(SimpleNamespace(token_ids=[1, 2, 3], token_ids_diff=[2, 3]))


def test_engine_timings_come_from_steady_clock_deltas():
    timing = SimpleNamespace(
        arrival_time=timedelta(seconds=10.0),
        first_scheduled_time=timedelta(seconds=10.25),
        first_token_time=timedelta(seconds=10.5),
        last_token_time=timedelta(seconds=11.5),
    )
    stats = trtllm.perf_stats(SimpleNamespace(timing_metrics=timing))
    assert stats == {"queue_s": 0.25, "ttft_s": 0.5, "decode_s": 1.0}
    assert trtllm.perf_stats(None) is None


# -- LMDeploy ----------------------------------------------------------------------------------


def test_lmdeploy_configs_are_explicit_with_prefix_caching_off():
    assert lmd.engine_config({}) == (
        "TurbomindEngineConfig",
        {
            "max_batch_size": 64,
            "cache_max_entry_count": 0.8,
            "enable_prefix_caching": False,
            "tp": 1,
        },
    )
    name, kwargs = lmd.engine_config({"backend": "pytorch", "session_len": "2048"})
    assert name == "PytorchEngineConfig"
    assert kwargs["session_len"] == 2048
    assert lmd.generation_kwargs(GenerationRequest("x", 8)) == {
        "max_new_tokens": 8,
        "ignore_eos": True,
        "do_sample": False,
    }
    assert lmd.prompt_arguments((1, 2, 3)) == {"messages": None, "input_ids": [1, 2, 3]}
    assert lmd.prompt_arguments("hello") == {"messages": "hello", "input_ids": None}
    with pytest.raises(ValueError, match="cache_max_entry_count must be a share"):
        lmd.LMDeployEngine.validate_options({"cache_max_entry_count": "2"})


def test_lmdeploy_outputs_are_deltas_with_a_running_count():
    outs = [
        SimpleNamespace(
            token_ids=[7, 8],
            response="ab",
            generate_token_len=2,
            input_token_len=5,
            finish_reason=None,
        ),
        SimpleNamespace(
            token_ids=[9], response="c", generate_token_len=3, input_token_len=5, finish_reason=None
        ),
        SimpleNamespace(
            token_ids=[],
            response="",
            generate_token_len=3,
            input_token_len=5,
            finish_reason="length",
        ),
    ]
    chunks = [lmd.to_chunk(o) for o in outs]
    assert [c.n_tokens for c in chunks] == [2, 1, 0]
    assert sum(c.n_tokens for c in chunks) == chunks[-1].completion_tokens == 3
    assert chunks[-1].finish_reason == "length"
    assert chunks[0].prompt_tokens == 5


# -- cells skip with the precise reason ----------------------------------------------------------


@pytest.mark.slow
def test_gpu_only_engines_cells_skip_with_the_reason(tmp_path):
    pytest.importorskip("onnx")
    result = run_workloads(
        tmp_path,
        "--engine=tensorrt,tensorrt-llm,lmdeploy",
        "--device=cuda",
        "-k",
        "rate100-none or (test_streaming.py and closed-1)",
    )
    # every cell skipped: nothing measured is not a pass (exit 12)
    assert result.returncode == RunExit.NOTHING_MEASURED, result.stdout[-3000:]
    by_engine: dict[str, list] = {}
    for rec in result.records.values():
        by_engine.setdefault(rec.engine, []).append(rec)
    assert set(by_engine) == set(GPU_ONLY)
    for engine, module in GPU_ONLY.items():
        for rec in by_engine[engine]:
            assert rec.status.value == "skipped"
            if importlib.util.find_spec(module) is None:
                assert rec.reasons[0].startswith(f"{module} is not installed")
    assert Path(result.run_dir, "matrix.md").read_text().count("SKIPPED") == len(result.records)


# -- precisions each engine declares ---------------------------------------------------------


def test_each_engine_says_how_it_runs_a_precision_or_why_not(monkeypatch):
    from engines.onnxruntime import OnnxRuntimeEngine  # noqa: PLC0415
    from engines.tensorrt_llm import TensorRTLLMEngine  # noqa: PLC0415
    from engines.torch import TorchEngine  # noqa: PLC0415
    from engines.vllm import VllmEngine  # noqa: PLC0415

    assert OnnxRuntimeEngine.precision_options("int8", "cpu") == {"quantize": "int8"}
    assert OnnxRuntimeEngine.precision_options("fp16", "cuda") == {"convert": "fp16"}
    assert OnnxRuntimeEngine.precision_options("fp32", "cpu") == {}
    assert TorchEngine.precision_options("bf16", "cpu") == {"dtype": "bfloat16"}
    # fp16 is TensorRT 10's builder flag; TensorRT 11 has none, read from package metadata
    monkeypatch.setattr("engines.tensorrt.installed_tensorrt", lambda: "10.16.1.11")
    assert TensorRTEngine.precision_options("fp16", "cuda") == {"precision": "fp16"}
    monkeypatch.setattr("engines.tensorrt.installed_tensorrt", lambda: "11.4.0.106")
    with pytest.raises(ValueError, match=r"TensorRT 11\.4\.0\.106 has no FP16 builder flag"):
        TensorRTEngine.precision_options("fp16", "cuda")
    assert TensorRTEngine.precision_options("fp32", "cuda") == {"precision": "fp32"}
    # not installed: the cell skips later with the probe's "tensorrt is not installed"
    monkeypatch.setattr("engines.tensorrt.installed_tensorrt", lambda: None)
    assert TensorRTEngine.precision_options("fp16", "cuda") == {"precision": "fp16"}
    assert VllmEngine.precision_options("bf16", "cpu") == {"dtype": "bfloat16"}
    assert TensorRTLLMEngine.precision_options("fp16", "cuda") == {"dtype": "float16"}
    refusals = [
        (OnnxRuntimeEngine, "int8", "cuda", "no CUDA kernels"),
        (OnnxRuntimeEngine, "fp16", "cpu", "few fp16 kernels"),
        (TorchEngine, "int8", "cpu", "torch.ao or torchao"),
        (TensorRTEngine, "int8", "cuda", "Q/DQ nodes"),
        (VllmEngine, "fp16", "cpu", "fp16 is measured on cuda"),
    ]
    for engine, precision, device, reason in refusals:
        with pytest.raises(ValueError, match=reason):
            engine.precision_options(precision, device)
    for bad in ({"quantize": "int4"}, {"quantize": "int8", "convert": "fp16"}):
        with pytest.raises(ValueError, match="quantize"):
            OnnxRuntimeEngine.validate_options(bad)
