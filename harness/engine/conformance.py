"""The engine conformance suite: what every adapter must do, as pytest test classes.

A built-in or third-party engine passes it by subclassing one class and saying how to
build the engine under test::

    import pytest
    from harness.engine.conformance import Subject, TensorConformance

    class TestMyEngine(TensorConformance):
        @pytest.fixture(scope="class")
        @classmethod
        def subject(cls) -> Subject:
            return Subject(MyEngine, model=Path("model.onnx"), dims={"sequence": 16})

The checks: it declares a name and capabilities and validates options; ``probe`` says
why it cannot run (the class skips with that reason); it loads, warms up and runs;
``describe()`` is JSON with the engine, its version, the device and the settings in
effect; inputs are honoured (shapes, dtypes) and outputs have the declared names, dtypes
and batch dim; a bad input or request is an error the caller sees while the engine keeps
serving; ``close`` is safe twice and gives back what ``load`` took.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psutil
import pytest

from harness.engine import (
    DEVICE_STAGES,
    Arrays,
    Capabilities,
    Chunk,
    EngineConfig,
    EngineFactory,
    Family,
    GenerationRequest,
    GenerativeEngine,
    ReportsDeviceTimes,
    TensorEngine,
    TensorSpec,
    device_spans,
    eventloop,
    is_fatal,
)

DEFAULT_DIM = 8
MIB = 2**20


@dataclass(frozen=True)
class Subject:
    """An engine under test: its adapter class and what to load.

    ``dims`` sizes dynamic input dims (batch excluded); ``prompt`` is a generative
    request's prompt; ``too_long`` a prompt the engine must refuse (longer than its
    context), None where it has no such limit; ``memory_slack_mib`` how much resident
    memory a load/close cycle may leave behind (allocator caches, imported modules).
    """

    factory: EngineFactory
    model: Path
    device: str = "cpu"
    options: Mapping[str, str] = field(default_factory=dict)
    dims: Mapping[str, int] = field(default_factory=dict)
    prompt: str | tuple[int, ...] = (11, 12, 13, 14, 15, 16, 17, 18)
    too_long: str | tuple[int, ...] | None = None
    max_tokens: int = 8
    memory_slack_mib: float = 64.0

    def config(self) -> EngineConfig:
        return EngineConfig(model=self.model, device=self.device, options=dict(self.options))


def tree_rss(proc: psutil.Process | None = None) -> int:
    """Resident bytes of this process and every process it started (engine cores)."""
    root = proc or psutil.Process()
    total = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def synthesize(
    specs: tuple[TensorSpec, ...], dims: Mapping[str, int], batch: int, seed: int = 0
) -> dict[str, npt.NDArray[Any]]:
    """Inputs of the declared dtypes: dim 0 is ``batch``, other dynamic dims from ``dims``
    by name (``DEFAULT_DIM`` when unnamed), integers small, masks all ones."""
    rng = np.random.default_rng(seed)
    out: dict[str, npt.NDArray[Any]] = {}
    for spec in specs:
        shape = [batch]
        for d in spec.shape[1:]:
            shape.append(d if isinstance(d, int) and d > 0 else dims.get(str(d), DEFAULT_DIM))
        if "mask" in spec.name.lower():
            out[spec.name] = np.ones(shape, dtype=spec.dtype)
        elif np.issubdtype(spec.dtype, np.integer):
            out[spec.name] = rng.integers(0, 32, size=shape).astype(spec.dtype)
        elif spec.dtype == np.bool_:
            out[spec.name] = np.ones(shape, dtype=np.bool_)
        else:
            out[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
    return out


def _json_round_trip(info: Mapping[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(info))
    return loaded


def _loaded(subject: Subject, close: Callable[[Any], None] | None = None) -> Iterator[Any]:
    status = subject.factory.probe(subject.device)
    if not status.available:
        pytest.skip(status.reason)
    engine = subject.factory(subject.config())
    engine.load()
    try:
        yield engine
    finally:
        (close or (lambda e: e.close()))(engine)


class _Lifecycle:
    """Checks both families share. Subclasses provide the ``subject`` fixture."""

    family: Family

    @pytest.fixture(scope="class")
    @classmethod
    def subject(cls) -> Subject:
        raise NotImplementedError("a conformance class needs a `subject` fixture")

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls, subject: Subject) -> Iterator[Any]:
        yield from _loaded(subject)

    def test_declares_name_family_and_devices(self, subject: Subject) -> None:
        factory = subject.factory
        assert isinstance(factory.name, str)
        assert factory.name
        assert isinstance(factory.capabilities, Capabilities)
        assert factory.capabilities.family is self.family
        assert factory.capabilities.supports_device(subject.device)

    def test_prefix_cache_option_is_a_flag_it_takes(self, subject: Subject) -> None:
        name = subject.factory.capabilities.prefix_cache_option
        if name is None:
            return  # declares no prefix cache: nothing to check
        for value in ("0", "1"):  # a flag: both settings taken, anything else refused
            subject.factory.validate_options({name: value})
        with pytest.raises(ValueError, match=name):
            subject.factory.validate_options({name: "sometimes"})

    def test_unknown_options_are_refused_by_name(self, subject: Subject) -> None:
        with pytest.raises(ValueError, match="no_such_option"):
            subject.factory.validate_options({"no_such_option": "1"})
        subject.factory.validate_options(dict(subject.options))

    def test_probe_answers_for_every_device_kind(self, subject: Subject) -> None:
        for device in ("cpu", "cuda"):
            status = subject.factory.probe(device)
            assert status.available or status.reason

    def test_describe_names_engine_version_device_and_settings(
        self, subject: Subject, engine: Any
    ) -> None:
        info = _json_round_trip(engine.describe())
        assert info["engine"] == subject.factory.name
        assert isinstance(info["version"], str)
        assert info["version"]
        assert info["device"] == subject.device
        effective = info.get("effective")
        assert isinstance(effective, dict), "describe() needs the settings in effect"
        assert effective

    def test_close_twice_is_safe_and_returns_memory(self, subject: Subject) -> None:
        status = subject.factory.probe(subject.device)
        if not status.available:
            pytest.skip(status.reason)
        peaks = []
        for _ in range(3):
            engine = subject.factory(subject.config())
            engine.load()
            self.cycle(engine, subject)
            del engine
            gc.collect()
            peaks.append(tree_rss())
        # the first cycle pays for imports and caches; later ones must not keep growing
        grown = (peaks[-1] - peaks[0]) / MIB
        assert grown < subject.memory_slack_mib, f"resident memory grew {grown:.0f} MiB"

    def cycle(self, engine: Any, subject: Subject) -> None:
        """Serve one request, then close the engine twice."""
        raise NotImplementedError


class TensorConformance(_Lifecycle):
    """The checks for a tensor engine (``infer`` on batches of named arrays)."""

    family = Family.TENSOR

    def cycle(self, engine: TensorEngine, subject: Subject) -> None:
        engine.infer(synthesize(engine.input_specs(), subject.dims, 2))
        engine.close()
        engine.close()

    def test_is_a_tensor_engine(self, engine: Any) -> None:
        assert isinstance(engine, TensorEngine)

    def test_specs_have_names_dtypes_and_a_batch_dim(self, engine: TensorEngine) -> None:
        for spec in (*engine.input_specs(), *engine.output_specs()):
            assert spec.name
            assert isinstance(spec.dtype, np.dtype)
            assert len(spec.shape) >= 1

    @pytest.mark.parametrize("batch", [1, 3])
    def test_outputs_match_the_declared_specs(
        self, engine: TensorEngine, subject: Subject, batch: int
    ) -> None:
        inputs = synthesize(engine.input_specs(), subject.dims, batch)
        engine.warmup(inputs, 2)
        outputs = engine.infer(inputs)
        declared = {s.name: s for s in engine.output_specs()}
        assert set(outputs) == set(declared)
        for name, array in outputs.items():
            spec = declared[name]
            assert array.dtype == spec.dtype, name
            assert array.shape[0] == batch, name
            assert len(array.shape) == len(spec.shape), name
            for got, want in zip(array.shape[1:], spec.shape[1:], strict=True):
                if isinstance(want, int) and want > 0:
                    assert got == want, name
            assert np.isfinite(array.astype(np.float64)).all(), name

    def test_same_inputs_give_the_same_outputs(
        self, engine: TensorEngine, subject: Subject
    ) -> None:
        inputs = synthesize(engine.input_specs(), subject.dims, 2, seed=7)
        first, again = engine.infer(inputs), engine.infer(inputs)
        for name in first:
            np.testing.assert_allclose(first[name], again[name], rtol=1e-5, atol=1e-6)

    def test_a_bad_input_is_an_error_and_the_engine_keeps_serving(
        self, engine: TensorEngine, subject: Subject
    ) -> None:
        good = synthesize(engine.input_specs(), subject.dims, 1)
        for bad in _bad_inputs(good):
            with pytest.raises(Exception) as caught:  # noqa: PT011  (any error, not a crash)
                engine.infer(bad)
            assert not is_fatal(caught.value), caught.value
        assert set(engine.infer(good)) == {s.name for s in engine.output_specs()}

    def test_device_times_are_parts_of_the_call(
        self, engine: TensorEngine, subject: Subject
    ) -> None:
        if not isinstance(engine, ReportsDeviceTimes):
            pytest.skip(f"{engine.name} does not time the device (ReportsDeviceTimes)")
        inputs = synthesize(engine.input_specs(), subject.dims, 2)
        t0 = time.perf_counter()
        engine.infer(inputs)
        host = time.perf_counter() - t0
        times = device_spans(engine)  # raises on stages it does not know
        if subject.device == "cpu":
            assert times == {}, "device times on a CPU run"
            return
        assert set(times) == {f"infer.{k}" for k in DEVICE_STAGES}
        assert all(v >= 0 for v in times.values()), times
        assert sum(times.values()) <= host, (times, host)


def _bad_inputs(good: Arrays) -> list[dict[str, npt.NDArray[Any]]]:
    """A missing input, and the first input with the wrong dtype and a wrong rank."""
    name = next(iter(good))
    wrong_dtype = np.int8 if good[name].dtype != np.int8 else np.float64
    return [
        {k: v for k, v in good.items() if k != name} | {"not_an_input": good[name]},
        {**good, name: good[name].astype(wrong_dtype)},
        {**good, name: good[name].reshape(-1)},
    ]


class GenerativeConformance(_Lifecycle):
    """The checks for a generative engine (``generate`` streams chunks)."""

    family = Family.GENERATIVE

    def cycle(self, engine: GenerativeEngine, subject: Subject) -> None:
        async def serve_then_close() -> None:
            await _collect(engine, GenerationRequest(subject.prompt, subject.max_tokens))
            _close_twice(engine)

        eventloop.run(serve_then_close())

    @pytest.fixture(scope="class")
    @classmethod
    def loop(cls) -> Iterator[asyncio.AbstractEventLoop]:
        # one loop for every request: an in-process engine stays bound to the first
        loop = eventloop.new_loop()
        yield loop
        loop.close()

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls, subject: Subject, loop: asyncio.AbstractEventLoop) -> Iterator[Any]:
        yield from _loaded(subject, lambda engine: loop.run_until_complete(_closing(engine)))

    def test_is_a_generative_engine(self, engine: Any) -> None:
        assert isinstance(engine, GenerativeEngine)
        assert engine.capabilities.streaming

    def test_streams_exactly_the_tokens_asked_for(
        self, engine: GenerativeEngine, subject: Subject, loop: asyncio.AbstractEventLoop
    ) -> None:
        request = GenerationRequest(subject.prompt, subject.max_tokens, ignore_eos=True)
        chunks = loop.run_until_complete(_collect(engine, request))
        carrying = [c for c in chunks if c.n_tokens > 0]
        assert sum(c.n_tokens for c in chunks) == subject.max_tokens
        assert len(carrying) >= 2, "one chunk for the whole output is not streaming"
        last = [c.completion_tokens for c in chunks if c.completion_tokens is not None]
        if last:
            assert last[-1] == subject.max_tokens

    def test_concurrent_requests_each_get_their_tokens(
        self, engine: GenerativeEngine, subject: Subject, loop: asyncio.AbstractEventLoop
    ) -> None:
        sizes = (3, subject.max_tokens, 5)

        async def all_of() -> list[list[Chunk]]:
            requests = [GenerationRequest(subject.prompt, n, request_id=f"c{n}") for n in sizes]
            return list(await asyncio.gather(*(_collect(engine, r) for r in requests)))

        got = loop.run_until_complete(all_of())
        assert [sum(c.n_tokens for c in chunks) for chunks in got] == list(sizes)

    def test_a_refused_request_fails_alone(
        self, engine: GenerativeEngine, subject: Subject, loop: asyncio.AbstractEventLoop
    ) -> None:
        if subject.too_long is None:
            pytest.skip("the subject names no prompt its engine must refuse")
        refused = GenerationRequest(subject.too_long, 4)
        with pytest.raises(Exception) as caught:  # noqa: PT011  (any error, not a crash)
            loop.run_until_complete(_collect(engine, refused))
        assert not is_fatal(caught.value), caught.value
        fine = loop.run_until_complete(_collect(engine, GenerationRequest(subject.prompt, 2)))
        assert sum(c.n_tokens for c in fine) == 2


def _close_twice(engine: Any) -> None:
    # Called inside the engine's running loop: an in-process engine (AsyncLLM) cancels
    # its own tasks on that loop as it shuts down; on a loop already gone they error.
    engine.close()
    engine.close()


async def _closing(engine: Any) -> None:
    _close_twice(engine)


async def _collect(engine: GenerativeEngine, request: GenerationRequest) -> list[Chunk]:
    return [chunk async for chunk in engine.generate(request)]
