"""The transformers adapter's logic that needs no model: options, the continuous-batching
configuration it asks for on either field layout, precisions, the probe's reasons."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from engines.transformers import TransformersEngine
from harness.engine import EngineConfig


@dataclasses.dataclass
class Since517:
    """The fields of transformers 5.17's and later ContinuousBatchingConfig that matter."""

    page_size: int = 256
    num_blocks: int | None = None
    max_batch_tokens: int | None = None
    max_requests_per_batch: int | None = None
    allow_block_sharing: bool = True
    use_cuda_graph: bool | None = None
    default_compile_level: int = 0
    seed: int | None = None
    auto_switch_to_flash: bool = True
    max_memory_percent: float | None = None


@dataclasses.dataclass
class Before517:
    """Before 5.17 the page size was ``block_size``, and there was no seed."""

    block_size: int = 256
    max_requests_per_batch: int | None = None
    allow_block_sharing: bool = True
    use_cuda_graph: bool | None = None
    default_compile_level: int = 0
    auto_switch_to_flash: bool = True


def engine(**options: str) -> TransformersEngine:
    return TransformersEngine(EngineConfig(Path("/m"), options=options))


def test_defaults_are_explicit_with_prefix_sharing_off_and_the_rest_left_to_the_manager():
    assert engine().batching_config(Since517) == {
        "max_requests_per_batch": 16,
        "allow_block_sharing": False,
        "default_compile_level": 0,
        "seed": 0,
        "auto_switch_to_flash": True,
        "max_memory_percent": 0.1,  # on a CPU: the manager's 0.6 of free memory was killed
    }


def test_the_kv_cache_is_bounded_on_a_cpu_only_when_no_size_is_given():
    on_gpu = TransformersEngine(EngineConfig(Path("/m"), device="cuda")).batching_config(Since517)
    assert "max_memory_percent" not in on_gpu  # the manager's default on a GPU
    sized = engine(num_blocks="64").batching_config(Since517)
    assert sized["num_blocks"] == 64
    assert "max_memory_percent" not in sized


def test_every_option_reaches_its_field_on_either_layout():
    chosen = engine(
        max_num_seqs="4",
        block_size="32",
        num_blocks="64",
        max_batch_tokens="512",
        cuda_graphs="0",
        enable_prefix_caching="1",
        attn_implementation="sdpa",
    )
    new = chosen.batching_config(Since517)
    assert new["page_size"] == 32
    assert (new["num_blocks"], new["max_batch_tokens"]) == (64, 512)
    assert (new["max_requests_per_batch"], new["use_cuda_graph"]) == (4, False)
    assert new["allow_block_sharing"] is True
    # a kernel the user named is measured as named, not switched to flash attention
    assert new["auto_switch_to_flash"] is False
    old = chosen.batching_config(Before517)
    assert old["block_size"] == 32
    assert "page_size" not in old
    assert "seed" not in old  # a field this version lacks is not passed


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_num_seqs": "0"}, "positive integer"),
        ({"cuda_graphs": "yes"}, "0 or 1"),
        ({"dtype": "int4"}, "dtype must be"),
        ({"attn_implementation": "paged"}, "attn_implementation must be"),
        ({"compile_level": "4"}, "compile_level"),
        ({"tp": "2"}, "unknown option"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        TransformersEngine.validate_options(options)


def test_precisions_name_the_dtype_and_fp16_is_measured_on_cuda_only():
    assert TransformersEngine.precision_options("bf16", "cpu") == {"dtype": "bfloat16"}
    assert TransformersEngine.precision_options("fp16", "cuda:0") == {"dtype": "float16"}
    with pytest.raises(ValueError, match="fp16 is measured on cuda"):
        TransformersEngine.precision_options("fp16", "cpu")
    with pytest.raises(ValueError, match="not int8"):
        TransformersEngine.precision_options("int8", "cuda")


def test_the_probe_says_what_to_install_where_transformers_is_missing():
    avail = TransformersEngine.probe("cpu")
    if not all(importlib.util.find_spec(m) for m in ("transformers", "torch")):
        assert not avail.available
        assert "pip install -e '.[transformers]'" in avail.reason
    else:
        assert avail.available, avail.reason
