"""The null engines: options are checked, outputs follow the batch, the stall fires once."""

from pathlib import Path

import numpy as np
import pytest

from engines.null import NullEngine
from harness.engine import EngineConfig, registry


def test_null_engines_are_registered_like_any_other():
    assert registry.load("null") is NullEngine
    assert registry.status("null-gen", "cpu").availability.available


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"service_time_s": "-1"}, "service_time_s must be >= 0"),
        ({"stall_at": "0"}, "stall_at must be an integer >= 1"),
        ({"speed": "1"}, "unknown option"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        NullEngine.validate_options(options)


def test_outputs_follow_the_batch_and_the_stall_counts_measured_calls_only():
    engine = NullEngine(EngineConfig(model=Path("-"), options={"stall_at": "2", "stall_s": "0"}))
    engine.load()
    engine.warmup({"x": np.zeros((1, 4), np.float32)}, 5)
    assert engine.calls == 0
    out = engine.infer({"x": np.zeros((3, 4), np.float32)})
    assert out["y"].shape == (3, 1)
    assert engine.describe()["stall"] == {"at": 2, "seconds": 0.0}


def _send(engine, prompt):
    import asyncio  # noqa: PLC0415

    from harness.engine import GenerationRequest  # noqa: PLC0415

    async def drain():
        return [c async for c in engine.generate(GenerationRequest(prompt, 1))]

    return asyncio.run(drain())


def test_null_gen_prefix_cache_finds_whole_blocks_seen_before():
    from engines.null import PREFIX_BLOCK, NullGenerativeEngine  # noqa: PLC0415

    on = NullGenerativeEngine(EngineConfig(Path("m"), options={"prefix_cache": "1"}))
    shared = tuple(range(4, 4 + 40))  # two whole blocks and 8 tokens
    _send(on, (*shared, 100))
    assert on.counters() == {
        "null_gen:prefix_cache_queries_total": 41.0,
        "null_gen:prefix_cache_hits_total": 0.0,  # cold
    }
    _send(on, (*shared, 200, 201))
    assert on.counters()["null_gen:prefix_cache_hits_total"] == 2 * PREFIX_BLOCK
    _send(on, (5, *shared))  # a different first token: no prefix found
    assert on.counters()["null_gen:prefix_cache_hits_total"] == 2 * PREFIX_BLOCK
    assert on.counters()["null_gen:prefix_cache_queries_total"] == 41 + 42 + 41
    off = NullGenerativeEngine(EngineConfig(Path("m")))
    _send(off, shared)
    _send(off, shared)
    assert set(off.counters().values()) == {0.0}  # off: nothing looked up, as vLLM counts
    assert off.describe()["effective"]["prefix_cache"] is False


def test_null_gen_prefill_time_is_for_tokens_not_found(monkeypatch):
    import asyncio  # noqa: PLC0415

    import engines.null  # noqa: PLC0415
    from engines.null import NullGenerativeEngine  # noqa: PLC0415

    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def fake_sleep(seconds: float) -> None:  # records what the engine waits
        slept.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(engines.null.asyncio, "sleep", fake_sleep)
    opts = {"prefix_cache": "1", "prefill_token_s": "0.0005", "token_time_s": "0"}
    engine = NullGenerativeEngine(EngineConfig(Path("m"), options=opts))
    prompt = tuple(range(4, 4 + 170))  # 10 whole blocks and 10 tokens
    _send(engine, prompt)
    _send(engine, prompt)
    # what is left of each prefill when its sleep starts (it sleeps to a due time)
    expected = [pytest.approx(170 * 0.0005, abs=1e-3), pytest.approx(10 * 0.0005, abs=1e-3)]
    assert slept == expected


def test_null_gen_takes_max_num_seqs_and_generates_no_more_at_once():
    """pytest --engine=null-gen -k continuous_batching failed: unknown option max_num_seqs,
    although null-gen declares continuous batching (issue 35)."""
    import asyncio  # noqa: PLC0415

    from engines.null import NullGenerativeEngine  # noqa: PLC0415
    from harness.engine import GenerationRequest  # noqa: PLC0415

    NullGenerativeEngine.validate_options({"max_num_seqs": "4"})
    with pytest.raises(ValueError, match="max_num_seqs must be an integer >= 1"):
        NullGenerativeEngine.validate_options({"max_num_seqs": "0"})
    opts = {"max_num_seqs": "2", "token_time_s": "0.001"}
    engine = NullGenerativeEngine(EngineConfig(Path("m"), options=opts))
    assert engine.describe()["effective"]["max_num_seqs"] == 2
    live, most = 0, 0

    async def one(i: int) -> int:
        nonlocal live, most
        n = 0
        async for chunk in engine.generate(GenerationRequest((4, 5), 5, request_id=str(i))):
            if chunk.completion_tokens == 1:
                live += 1
                most = max(most, live)
            n += chunk.n_tokens
        live -= 1
        return n

    async def five() -> list[int]:
        return list(await asyncio.gather(*(one(i) for i in range(5))))

    for _ in range(2):  # a second event loop (the next cell's) gets slots of its own
        assert asyncio.run(five()) == [5] * 5
        assert most == 2
    unlimited = NullGenerativeEngine(EngineConfig(Path("m"), options={"token_time_s": "0.001"}))
    engine, most = unlimited, 0
    asyncio.run(five())
    assert most == 5
