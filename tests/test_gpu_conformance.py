"""The conformance suite on a GPU, for every tensor engine and mode that can run there:
torch (eager, CUDA graphs), ONNX Runtime (CUDA provider with IOBinding, with CUDA graphs,
TensorRT provider) and TensorRT; and the generative suite for the in-process generative
engine that GPU images carry (transformers, on the embedded tiny Llama). Each class skips
with its engine's own reason where it cannot run (no GPU, package missing).
``HARNESS_CONFORMANCE_DEVICE`` picks the device (default cuda); scripts/gpu-check runs
this module."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.engine.conformance import GenerativeConformance, Subject, TensorConformance

DEVICE = os.environ.get("HARNESS_CONFORMANCE_DEVICE", "cuda")
ON_GPU = DEVICE.startswith("cuda")


def _cnn() -> Path:
    pytest.importorskip("onnx")
    from workloads.lib.models import embedded  # noqa: PLC0415

    return embedded("tiny-cnn").path


def _subject(factory: str, **options: str) -> Subject:
    from harness.engine import registry  # noqa: PLC0415

    engine = registry.load(factory)
    if not engine.capabilities.supports_device(DEVICE):
        pytest.skip(f"{factory} does not support device {DEVICE!r}")
    return Subject(engine, model=_cnn(), device=DEVICE, options=options, memory_slack_mib=256.0)


class TestTorchEager(TensorConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        return _subject("torch")


class TestTorchCudaGraphs(TensorConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        if not ON_GPU:
            pytest.skip("CUDA graphs need a cuda device")
        return _subject("torch", mode="cudagraphs")


class TestOnnxRuntime(TensorConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        return _subject("onnxruntime")


class TestOnnxRuntimeCudaGraphs(TensorConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        if not ON_GPU:
            pytest.skip("CUDA graphs need a cuda device")
        return _subject("onnxruntime", cuda_graph="1")


def _skip_unless_it_loads(subject: Subject) -> Subject:
    """get_available_providers() lists the providers compiled in, not the ones whose
    libraries load (onnxruntime-gpu lists TensorRT's without TensorRT installed): load
    once, and skip with the adapter's reason, which names what to install, when the
    provider's libraries are missing. Any other load failure stays an error."""
    from engines.ort_gpu import ProviderLoadError  # noqa: PLC0415

    status = subject.factory.probe(subject.device)
    if not status.available:
        pytest.skip(status.reason)
    engine = subject.factory(subject.config())
    try:
        engine.load()
    except ProviderLoadError as exc:
        pytest.skip(str(exc))
    finally:
        engine.close()
    return subject


class TestOnnxRuntimeTensorRT(TensorConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        if not ON_GPU:
            pytest.skip("the TensorRT provider needs a cuda device")
        ort = pytest.importorskip("onnxruntime")
        if "TensorrtExecutionProvider" not in ort.get_available_providers():
            pytest.skip(f"onnxruntime {ort.__version__} has no TensorrtExecutionProvider")
        return _skip_unless_it_loads(_subject("onnxruntime", provider="tensorrt"))


class TestTensorRT(TensorConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        return _subject("tensorrt", profiles="batch=1:4:8")


# loading a model and its continuous-batching manager takes seconds where it runs
@pytest.mark.slow
class TestTransformers(GenerativeConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        from harness.engine import registry  # noqa: PLC0415

        engine = registry.load("transformers")
        status = engine.probe(DEVICE)
        if not status.available:
            pytest.skip(status.reason)
        from workloads.lib.llm import embedded_llm  # noqa: PLC0415

        context = 2048  # the embedded tiny Llama's max_position_embeddings
        return Subject(
            engine,
            model=embedded_llm(0),
            device=DEVICE,
            # on a CPU the manager would size its KV cache from the machine's memory (14 GB
            # and more): a few blocks do for these requests; on a GPU it sizes from the GPU's
            options={"max_num_seqs": "4"} | ({} if ON_GPU else {"num_blocks": "64"}),
            prompt=tuple(range(10, 26)),
            too_long=tuple(10 + i % 200 for i in range(context)),
            memory_slack_mib=256.0,  # torch's allocators keep their arenas
        )
