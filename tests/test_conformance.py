"""The conformance suite run on the built-in engines that run here (ONNX Runtime on the
embedded models, the null engines), and shown to catch a non-conforming engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.null import NullEngine, NullGenerativeEngine
from harness.engine.conformance import GenerativeConformance, Subject, TensorConformance


class TestNull(TensorConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        return Subject(NullEngine, model=Path("none"))


class TestNullGen(GenerativeConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        return Subject(NullGenerativeEngine, model=Path("none"), options={"token_time_s": "0.001"})


def _embedded(name: str) -> Path:
    pytest.importorskip("onnx")
    from workloads.lib.models import embedded  # noqa: PLC0415

    return embedded(name).path


class TestOnnxRuntimeCnn(TensorConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        from engines.onnxruntime import OnnxRuntimeEngine  # noqa: PLC0415

        return Subject(OnnxRuntimeEngine, model=_embedded("tiny-cnn"))


class TestOnnxRuntimeEncoder(TensorConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        from engines.onnxruntime import OnnxRuntimeEngine  # noqa: PLC0415

        return Subject(
            OnnxRuntimeEngine,
            model=_embedded("tiny-encoder"),
            dims={"sequence": 16},
            options={"intra_op_threads": "1"},
        )
