"""LoRA adapters without an engine: ``--lora`` parsing and validation, the weighted,
seeded assignment of adapters to requests, the split of a cell's records per adapter,
vLLM's options and server flags for them, and the OpenAI payload naming an adapter."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from engines import vllm_server
from engines.openai_http import OpenAIEngine
from engines.vllm import VllmEngine
from engines.vllm_lora import LoraSet, parse_modules, rank_for
from harness.engine import EngineConfig, GenerationRequest
from harness.exceptions import UsageError
from harness.load import adapters
from harness.metrics.streamtiming import RequestRecord
from harness.session.config import RunSettings
from harness.session.pytestoptions import parse_settings
from workloads.lib import features


def adapter_dir(tmp: Path, name: str, rank: int = 8) -> Path:
    path = tmp / name
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    return path


def requests(n: int) -> list[GenerationRequest]:
    return [GenerationRequest((5, 6, 7), 4, request_id=f"r{i}") for i in range(n)]


def record(t: float, ok: bool = True) -> RequestRecord:
    times = (t + 0.01, t + 0.02, t + 0.03)
    return RequestRecord(
        t_sched=t,
        t_send=t,
        t_end=t + 0.03,
        chunk_times=times if ok else (),
        chunk_tokens=(1, 1, 1) if ok else (),
        n_in=3,
        n_asked=3,
        error=None if ok else "boom",
    )


def test_lora_values_parse_into_a_mix_with_weights_and_the_base_share(tmp_path: Path) -> None:
    a, b = adapter_dir(tmp_path, "a"), adapter_dir(tmp_path, "b", rank=16)
    mix = adapters.parse([f"sql={a}@3", f"chat={b},base@0.5"])
    assert mix is not None
    assert mix.names == ("sql", "chat", "base")
    assert [x.weight for x in mix.adapters] == [3.0, 1.0, 0.5]
    assert mix.modules == {"sql": a.resolve(), "chat": b.resolve()}
    assert mix.max_rank == 16
    assert adapters.parse(None) is None
    assert adapters.parse([]) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x={missing}", "is not a LoRA adapter directory (no adapter_config.json)"),
        ("x={dir}@-1", "weight must be a positive number"),
        ("x={dir}@lots", "weight 'lots' is not a number"),
        ("x={dir},x={dir}", "each adapter is named once"),
        ("base@1", "names at least one adapter directory"),
        ("x", "give NAME=DIR[@WEIGHT], or base[@WEIGHT]"),
        ("a.b={dir}", "letters, digits, '-' or '_' only"),
        ("base={dir}", "'base' names the base model"),
    ],
)
def test_a_bad_lora_value_is_a_usage_error_naming_it(
    tmp_path: Path, value: str, message: str
) -> None:
    good = adapter_dir(tmp_path, "good")
    text = value.format(missing=tmp_path / "nowhere", dir=good)
    with pytest.raises(UsageError, match="--lora") as info:
        adapters.parse([text])
    assert message in str(info.value)


def test_assignment_is_seeded_weighted_and_independent_of_order(tmp_path: Path) -> None:
    mix = adapters.parse([f"a={adapter_dir(tmp_path, 'a')}@3", "base@1"])
    assert mix is not None
    reqs = requests(2000)
    got = mix.assign(reqs, seed=0)
    shares = Counter(r.lora for r in got)
    assert set(shares) == {"a", ""}  # the base model is no adapter
    assert 0.70 < shares["a"] / len(got) < 0.80
    assert [r.lora for r in mix.assign(reqs, seed=0)] == [r.lora for r in got]
    assert [r.lora for r in mix.assign(reqs, seed=1)] != [r.lora for r in got]
    # the same request gets the same adapter wherever it stands
    backwards = {r.request_id: r.lora for r in mix.assign(reqs[::-1], seed=0)}
    assert backwards == {r.request_id: r.lora for r in got}
    assert [r.prompt for r in got] == [r.prompt for r in reqs]


def test_warm_up_goes_round_every_adapter(tmp_path: Path) -> None:
    mix = adapters.parse([f"a={adapter_dir(tmp_path, 'a')}", f"b={adapter_dir(tmp_path, 'b')}"])
    assert mix is not None
    assert [r.lora for r in mix.cycle(requests(5))] == ["a", "b", "a", "b", "a"]


def test_records_split_per_adapter_with_the_samples_lifted(tmp_path: Path) -> None:
    mix = adapters.parse([f"a={adapter_dir(tmp_path, 'a')}", "base"])
    assert mix is not None
    reqs = [GenerationRequest((5,), 3, lora=x) for x in ("a", "", "a", "a")]
    recs = [record(0.0), record(0.1), record(0.2, ok=False), record(0.3)]
    split = adapters.by_adapter(mix, reqs, recs)
    assert split["adapters"] == ["a", "base"]
    by = split["by_adapter"]
    assert (by["a"]["requests"], by["a"]["failed"], by["base"]["requests"]) == (3, 1, 1)
    assert by["a"]["ttft"]["count"] == 2
    assert by["a"]["ttft"]["p50"] == pytest.approx(0.01)
    assert by["a"]["itl"]["p50"] == pytest.approx(0.01)
    metrics, samples = adapters.lift_samples({"lora": split, "other": 1})
    assert samples == {"lora": [0.0, 1.0, 0.0]}  # the completed requests' adapters
    assert "per_request" not in metrics["lora"]
    assert metrics["other"] == 1
    assert "per_request" in split  # the caller's dict is left as it was
    assert adapters.lift_samples({"x": 1}) == ({"x": 1}, {})
    labels = [h.label for h in features.lora_headlines(metrics)]
    # one completed request has no TTFT p50 (too few samples): no headline for it
    assert labels == ["TTFT p50 a", "ITL p50 a", "ITL p50 base"]


def test_vllm_gets_lora_requests_by_name_with_stable_ids(tmp_path: Path) -> None:
    a, b = adapter_dir(tmp_path, "a"), adapter_dir(tmp_path, "b")
    options = {"lora_modules": f"a={a},b={b}", "max_lora_rank": "8"}
    engine = VllmEngine(EngineConfig(model=tmp_path, device="cpu", options=options))
    args = engine.engine_args()
    assert (args["enable_lora"], args["max_lora_rank"], args["max_loras"]) == (True, 8, 2)
    assert VllmEngine.capabilities.lora
    loras = LoraSet.from_options(options)
    assert loras is not None
    assert loras.modules == (("a", str(a)), ("b", str(b)))
    with pytest.raises(ValueError, match="'c' is not one this engine serves"):
        loras.request("c")
    assert "enable_lora" not in VllmEngine(EngineConfig(model=tmp_path)).engine_args()


def test_lora_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no adapter_config\.json"):
        VllmEngine.validate_options({"lora_modules": f"a={tmp_path}"})
    with pytest.raises(ValueError, match="max_lora_rank must be one of"):
        VllmEngine.validate_options({"max_lora_rank": "7"})
    with pytest.raises(ValueError, match="is not NAME=DIR"):
        parse_modules("a")
    assert (rank_for(4), rank_for(8), rank_for(17)) == (8, 8, 32)


def test_the_harness_started_server_serves_the_adapters(tmp_path: Path) -> None:
    a = adapter_dir(tmp_path, "a")
    settings = {"lora_modules": f"a={a}", "max_lora_rank": "8", "max_num_seqs": "4"}
    argv = vllm_server.command(tmp_path, 8000, settings=settings, cpu_build=True)
    tail = argv[argv.index("--enable-lora") :]
    assert tail[:3] == ["--enable-lora", "--lora-modules", f"a={a}"]
    assert "--max-lora-rank" in tail
    assert argv[argv.index("--max-num-seqs") + 1] == "4"
    assert "--enable-lora" not in vllm_server.command(tmp_path, 8000, cpu_build=True)


def test_an_openai_request_names_its_adapter_as_the_model() -> None:
    engine = OpenAIEngine(
        EngineConfig(model=Path("unused"), options={"base_url": "http://127.0.0.1:9"})
    )
    engine.served_model = "base-model"
    assert engine.payload(GenerationRequest((5,), 2, lora="sql"))["model"] == "sql"
    assert engine.payload(GenerationRequest((5,), 2))["model"] == "base-model"
    assert OpenAIEngine.capabilities.lora


def test_a_user_server_takes_no_adapter_flags(tmp_path: Path) -> None:
    why = OpenAIEngine.validate_options
    with pytest.raises(ValueError, match="lora_modules sets the server the harness starts"):
        why({"base_url": "http://127.0.0.1:9", "lora_modules": f"a={adapter_dir(tmp_path, 'a')}"})


def test_the_run_settings_carry_the_mix_and_only_then_record_it(tmp_path: Path) -> None:
    def settings(lora: list[str] | None = None) -> RunSettings:
        return parse_settings(
            engine=None,
            device="cpu",
            profile="quick",
            results_dir=str(tmp_path),
            seed=0,
            lora=lora,
        )

    plain = settings()
    assert plain.lora is None
    assert "lora" not in plain.to_json()  # runs made before --lora resume as equal
    a = adapter_dir(tmp_path, "a")
    mixed = settings([f"a={a}@2", "base"])
    assert mixed.lora is not None
    assert mixed.to_json()["lora"] == [
        {"name": "a", "path": str(a.resolve()), "weight": 2.0},
        {"name": "base", "path": None, "weight": 1.0},
    ]
    with pytest.raises(UsageError, match="--lora x=nowhere"):
        settings(["x=nowhere"])


@pytest.mark.slow
def test_the_users_dataset_and_trace_spread_over_adapters_end_to_end(tmp_path: Path) -> None:
    """Through the whole harness on null-gen (no model to load): the dataset and trace
    workloads' records split per adapter; real engines: tests/test_vllm_lora_spec.py."""
    from tests.support.runner import run_workloads  # noqa: PLC0415
    from tests.test_traffic_workloads import NULL_GEN, SLOW_TOKENS, chat_jsonl, fake_model  # noqa: PLC0415
    from workloads.lib.tracegen import default_trace  # noqa: PLC0415

    a, b = adapter_dir(tmp_path, "a"), adapter_dir(tmp_path, "b")
    run = run_workloads(
        tmp_path,
        *NULL_GEN,
        SLOW_TOKENS,  # the dataset cell's window long enough to judge
        f"--model={fake_model(tmp_path)}",
        f"--dataset={chat_jsonl(tmp_path / 'chats.jsonl')}",
        f"--trace-file={default_trace(0)}",
        "--trace-limit=100",
        "--requests=100",
        f"--lora=a={a}@2,b={b},base",
        "-k",
        "(test_dataset and closed-4) or test_trace",
    )
    assert run.returncode == 0, run.stdout[-3000:]
    records = {r.workload: r for r in run.records.values()}
    assert set(records) == {"dataset", "trace"}
    for record in records.values():
        assert record.status.value == "ok", record.reasons
        lora = record.metrics["lora"]
        counts = [lora["by_adapter"][n]["requests"] for n in ("a", "b", "base")]
        assert sum(counts) == record.metrics["requests"]["total"]
        assert counts[0] > counts[1] > 0
        assert counts[2] > 0
        assert len(record.samples["lora"]) == record.metrics["requests"]["ok"]
        assert "TTFT p50 a" in run.stdout
