"""Hugging Face transformers' continuous batching for real (the CPU build of torch, the
embedded tiny Llama): the generative conformance suite, requests as users send them on
its engine, and the generative workloads on ``--engine=transformers`` (quick profile),
checked record by record. Needs ``tox -e transformers``; skipped with the reason
elsewhere."""

from __future__ import annotations

import pytest

from harness.engine.conformance import GenerativeConformance, Subject
from harness.results.records import Status
from tests.support.llmrequests import takes_text_chat_and_natural_end
from tests.support.runner import Run, run_workloads

pytestmark = pytest.mark.slow

pytest.importorskip("transformers", reason="transformers is not installed (tox -e transformers)")
pytest.importorskip("torch", reason="torch is not installed (tox -e transformers)")

CONTEXT = 2048  # the embedded tiny Llama's max_position_embeddings


class TestTransformers(GenerativeConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        from engines.transformers import TransformersEngine  # noqa: PLC0415
        from workloads.lib.llm import embedded_llm  # noqa: PLC0415

        return Subject(
            TransformersEngine,
            model=embedded_llm(0),
            options={"max_num_seqs": "4"},
            prompt=tuple(range(10, 26)),
            too_long=tuple(10 + i % 200 for i in range(CONTEXT)),
            memory_slack_mib=256.0,  # torch's CPU allocator keeps its arenas
        )

    def test_takes_text_chat_and_natural_end(self, engine, subject, loop):
        takes_text_chat_and_natural_end(engine, subject.model, loop.run_until_complete)

    def test_describes_what_the_manager_resolved(self, engine):
        effective = engine.describe()["effective"]
        assert effective["max_num_seqs"] == 4
        assert effective["enable_prefix_caching"] is False
        assert effective["dtype"] == "float32"
        assert effective["num_blocks"] > 0
        assert effective["max_batch_tokens"] > 0
        assert effective["device"] == "cpu"


# every generative workload, one load level of those that sweep them (each cell costs CI
# time); the bare `pytest --engine=transformers` runs them all
GENERATIVE = (
    "(test_streaming and closed-4) or test_continuous_batching"
    " or (test_dataset and closed-4) or test_sessions or test_shared_prefix or test_trace"
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    result = run_workloads(
        tmp_path_factory.mktemp("transformers"),
        "--engine=transformers",
        # half the fewest with a p99: the cells come out invalid (too few samples), which
        # is what CI's time allows; the bare `pytest --engine=transformers` measures in full
        "--requests=50",
        "-k",
        GENERATIVE,
    )
    print(result.stdout[-6000:])  # the matrix, for the log
    assert result.returncode in (0, 10), result.stdout[-6000:]
    return result


def test_every_generative_cell_is_ok_or_says_why_not(run: Run):
    workloads = {r.workload for r in run.records.values()}
    assert {"streaming", "continuous_batching", "sessions", "shared_prefix"} <= workloads
    for rec in run.records.values():
        assert rec.engine == "transformers"
        if rec.status is Status.SKIPPED:
            assert rec.reasons, rec.cell_id
            continue
        assert rec.status in (Status.OK, Status.INVALID), (rec.cell_id, rec.reasons)
        m = rec.metrics
        if "ttft" in m:
            assert 0 < m["ttft"]["p50"] <= m["e2e"]["p50"], rec.cell_id
            assert m["requests"]["failed"] == 0, rec.cell_id


def test_streaming_cells_count_exactly_what_was_asked(run: Run):
    streaming = [r for r in run.records.values() if r.workload == "streaming"]
    assert streaming
    for rec in streaming:
        tokens = rec.metrics["tokens"]
        assert tokens["output"] == tokens["asked"] > 0  # ignore_eos: exactly what was asked
        assert rec.metrics["itl"]["count"] > 0
        assert rec.engine_info["effective"]["attn_implementation"]


def test_prefix_sharing_is_what_the_cell_asked_for(run: Run):
    cells = [r for r in run.records.values() if "prefix_cache" in r.params]
    assert {r.params["prefix_cache"] for r in cells} == {"off", "on"}
    for rec in cells:
        if rec.status is Status.SKIPPED:
            continue
        on = rec.params["prefix_cache"] == "on"
        assert rec.engine_info["effective"]["enable_prefix_caching"] is on, rec.cell_id


def test_continuous_batching_runs_each_width_on_its_own_engine(run: Run):
    cells = [r for r in run.records.values() if r.workload == "continuous_batching"]
    assert {(r.params["mode"], r.params["max_num_seqs"]) for r in cells} == {
        ("continuous", 16),
        ("static", 16),
        ("continuous", 4),
        ("static", 4),
    }
    for rec in cells:
        assert rec.status is not Status.FAILED, rec.reasons
        if rec.status is Status.OK:
            effective = rec.engine_info["effective"]["max_num_seqs"]
            assert effective == rec.params["max_num_seqs"]
