"""Image preprocessing measured batch by batch: alone, and followed by inference either
serially (preprocess, then infer) or pipelined (a producer thread preprocesses into a
bounded queue while the caller infers).

Batches take ``size`` images round-robin from the corpus, so every measured batch is
full and the image mix repeats. A window runs until it has lasted ``window_s`` *and*
holds ``min_batches`` batches, or until ``budget_s`` runs out (then it is short, and the
validity verdict says so).
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from workloads.lib import images
from workloads.lib.backends import make
from workloads.lib.preprocess import (
    Batch,
    DecodeError,
    PilPreprocessor,
    Preprocessor,
    Transform,
    Unavailable,
    decode_reason,
    parity,
)

Classify = Callable[[Batch], np.ndarray]  # batch -> logits (n, classes)
NAMES_IN_NOTE = 8


class ImageError(ValueError):
    """A corpus image a backend could not decode, named."""


@dataclass(frozen=True)
class Corpus:
    names: tuple[str, ...]
    data: tuple[bytes, ...]
    source: str

    def __post_init__(self) -> None:
        if not self.data or len(self.names) != len(self.data):
            raise ValueError("a corpus needs one name per image and at least one image")

    def batch(self, k: int, size: int) -> list[bytes]:
        """The ``k``-th batch of ``size`` images, round-robin over the corpus."""
        n = len(self.data)
        return [self.data[(k * size + i) % n] for i in range(size)]

    def names_of(self, k: int, size: int) -> list[str]:
        """The file names of ``batch(k, size)``."""
        n = len(self.names)
        return [self.names[(k * size + i) % n] for i in range(size)]

    @contextlib.contextmanager
    def naming(self, names: Sequence[str]) -> Iterator[None]:
        """A backend's error on a batch of these images says which file (or files) it was:
        the backends only see bytes."""
        try:
            yield
        except DecodeError as exc:
            name = names[exc.position]
            raise ImageError(f"cannot decode {name} ({self.source}): {exc.reason}") from exc
        except Exception as exc:  # a batch-level backend (DALI) cannot point at one image
            shown = ", ".join(dict.fromkeys(names[:NAMES_IN_NOTE]))
            more = ", ..." if len(names) > NAMES_IN_NOTE else ""
            exc.add_note(f"preprocessing images {shown}{more} ({self.source})")
            raise

    def chunks(self, size: int) -> Iterator[tuple[int, list[bytes]]]:
        """Every image once, in order, in chunks of at most ``size``."""
        for start in range(0, len(self.data), size):
            yield start, list(self.data[start : start + size])

    def describe(self) -> dict[str, Any]:
        formats: dict[str, int] = {}
        for name in self.names:
            ext = name.rsplit(".", 1)[-1].lower().replace("jpeg", "jpg")
            formats[ext] = formats.get(ext, 0) + 1
        return {
            "source": self.source,
            "images": len(self.data),
            "formats": dict(sorted(formats.items())),
            "bytes": sum(len(d) for d in self.data),
        }


def load_corpus(directory: Path | None, seed: int) -> Corpus:
    """The user's ``--images`` folder, or the seeded synthetic corpus (cached)."""
    if directory is not None:
        files, source = images.load(directory), str(directory)
    else:
        spec = images.CorpusSpec(seed=seed)
        files, source = images.load(images.corpus_dir(spec)), f"synthetic {spec.key()}"
    return Corpus(tuple(n for n, _ in files), tuple(d for _, d in files), source)


def verify_images(directory: Path) -> list[str]:
    """Decode every image of ``directory`` in full with the reference backend: one line
    per file it cannot decode, naming it and why (empty: every file decodes)."""
    try:
        backend = PilPreprocessor()  # preprocess.REFERENCE: PIL decodes for the reference
    except Unavailable:
        return []  # no reference decoder here: the preprocessing cells skip saying why
    files = images.load(directory)

    def problem(item: tuple[str, bytes]) -> str | None:
        name, data = item
        try:
            backend.decode(data)  # the reference's own decode (it forces the full decode)
        except MemoryError:
            raise
        except Exception as exc:  # each decoder raises its own types
            return f"{name}: {decode_reason(exc)}"
        return None

    try:
        # decoders release the GIL: a large corpus is checked on every core
        with ThreadPoolExecutor(max(1, len(os.sched_getaffinity(0)))) as pool:
            return [p for p in pool.map(problem, files) if p]
    finally:
        backend.close()


@dataclass
class Window:
    """Per-batch figures of one measured window (seconds)."""

    batch: int
    latency: list[float] = field(default_factory=list)
    spans: dict[str, list[float]] = field(default_factory=dict)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    span: tuple[float, float] | None = None
    """The window's first and last instant on perf_counter: its energy's window."""

    def add(self, latency: float, spans: dict[str, float]) -> None:
        self.latency.append(latency)
        for stage, seconds in spans.items():
            self.spans.setdefault(stage, []).append(seconds)

    @property
    def images(self) -> int:
        return len(self.latency) * self.batch

    def cpu(self) -> dict[str, Any]:
        """This process's CPU use (all its threads: the backend's, the engine's) over the
        window, against the cores it may run on: near 1.0, preprocessing is CPU-bound."""
        cores = len(os.sched_getaffinity(0))
        busy = self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0
        return {"cores_busy": busy, "cores_available": cores, "utilization": busy / cores}


@dataclass(frozen=True)
class Limits:
    window_s: float
    min_batches: int
    budget_s: float

    def done(self, batches: int, elapsed: float) -> bool:
        enough = elapsed >= self.window_s and batches >= self.min_batches
        return enough or elapsed >= self.budget_s


def _cpu_seconds() -> float:
    t = psutil.Process().cpu_times()
    return float(t.user + t.system)


class _Meter:
    """Wall and CPU time of a window, and where it lies on perf_counter."""

    def __init__(self, window: Window) -> None:
        self.window = window

    def __enter__(self) -> _Meter:
        self._wall, self._cpu = time.perf_counter(), _cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        end = time.perf_counter()
        self.window.wall_s, self.window.span = end - self._wall, (self._wall, end)
        self.window.cpu_s = _cpu_seconds() - self._cpu


def preprocess_only(backend: Preprocessor, corpus: Corpus, size: int, limits: Limits) -> Window:
    """Back-to-back ``backend.run`` on batches of ``size``: images/s and batch latency."""
    window = Window(size)
    clock = time.perf_counter
    with _Meter(window):
        start = clock()
        k = 0
        while not limits.done(k, clock() - start):
            batch = corpus.batch(k, size)
            with corpus.naming(corpus.names_of(k, size)):
                t0 = clock()
                _, spans = backend.run(batch)
                window.add(clock() - t0, spans)
            k += 1
    return window


def stage_pass(
    backend: Preprocessor, corpus: Corpus, size: int, passes: int = 2, warmup: int = 1
) -> Window:
    """``backend.staged`` over the whole corpus ``passes`` times, after ``warmup`` passes
    (DALI's stage pipelines allocate on their first batches): seconds per stage."""
    per_pass = max(1, len(corpus.data) // size)
    for k in range(warmup * per_pass):
        with corpus.naming(corpus.names_of(k, size)):
            backend.staged(corpus.batch(k, size))
    window = Window(size)
    clock = time.perf_counter
    with _Meter(window):
        for k in range(passes * per_pass):
            batch = corpus.batch(k, size)
            with corpus.naming(corpus.names_of(k, size)):
                t0 = clock()
                _, spans = backend.staged(batch)
                window.add(clock() - t0, spans)
    return window


def serial(
    backend: Preprocessor, classify: Classify, corpus: Corpus, size: int, limits: Limits
) -> Window:
    """Preprocess a batch, then infer it; the next batch starts after."""
    window = Window(size)
    clock = time.perf_counter
    with _Meter(window):
        start = clock()
        k = 0
        while not limits.done(k, clock() - start):
            images_k, names = corpus.batch(k, size), corpus.names_of(k, size)
            with corpus.naming(names):
                t0 = clock()
                batch, _ = backend.run(images_k)
                t1 = clock()
            logits = classify(batch)
            t2 = clock()
            logits.argmax(axis=1)
            t3 = clock()
            window.add(t3 - t0, {"preprocess": t1 - t0, "infer": t2 - t1, "postprocess": t3 - t2})
            k += 1
    return window


@dataclass
class _Producer:
    """Preprocesses batches into a bounded queue until told to stop."""

    backend: Preprocessor
    corpus: Corpus
    size: int
    depth: int
    out: queue.Queue[tuple[float, float, Batch] | BaseException] = field(init=False)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.out = queue.Queue(maxsize=self.depth)

    def __call__(self) -> None:
        k = 0
        try:
            while not self.stop.is_set():
                images_k = self.corpus.batch(k, self.size)
                with self.corpus.naming(self.corpus.names_of(k, self.size)):
                    t0 = time.perf_counter()
                    batch, _ = self.backend.run(images_k)
                    t1 = time.perf_counter()
                self._put((t0, t1, batch))
                k += 1
        except BaseException as exc:  # handed to the consumer, which raises it
            self._put(exc)

    def _put(self, item: tuple[float, float, Batch] | BaseException) -> None:
        while not self.stop.is_set():
            try:
                self.out.put(item, timeout=0.05)
                return
            except queue.Full:
                continue


def pipelined(
    backend: Preprocessor,
    classify: Classify,
    corpus: Corpus,
    size: int,
    limits: Limits,
    *,
    depth: int = 2,
) -> Window:
    """A producer thread preprocesses up to ``depth`` batches ahead; this thread infers.
    A batch's latency runs from its preprocessing start, so time in the queue counts."""
    window = Window(size)
    producer = _Producer(backend, corpus, size, depth)
    thread = threading.Thread(target=producer, name="preprocess-producer", daemon=True)
    clock = time.perf_counter
    with _Meter(window):
        thread.start()
        try:
            start = clock()
            while not limits.done(len(window.latency), clock() - start):
                item = producer.out.get(timeout=max(limits.budget_s, 1.0))
                if isinstance(item, BaseException):
                    raise item
                t0, t1, batch = item
                t2 = clock()
                logits = classify(batch)
                t3 = clock()
                logits.argmax(axis=1)
                t4 = clock()
                spans = {"preprocess": t1 - t0, "queue": t2 - t1, "infer": t3 - t2}
                window.add(t4 - t0, spans | {"postprocess": t4 - t3})
        finally:
            producer.stop.set()
            thread.join(timeout=60)
    return window


# -- parity ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    """How far a backend may drift from the reference and still count as the same
    preprocessing. Normalized units: 1.0 is one channel standard deviation (about 57 of
    255 levels with ImageNet's std), so 0.1 is about 6 levels and 0.01 about half a level."""

    max_abs: float = 0.1
    mean_abs: float = 0.01
    top1_agreement: float = 0.99

    def breaches(self, found: dict[str, Any]) -> list[str]:
        out = []
        if found["max_abs"] > self.max_abs:
            out.append(f"max abs diff {found['max_abs']:.3g} > {self.max_abs:g}")
        if found["mean_abs"] > self.mean_abs:
            out.append(f"mean abs diff {found['mean_abs']:.3g} > {self.mean_abs:g}")
        agree = found.get("top1_agreement")
        if agree is not None and agree < self.top1_agreement:
            flips = len(found.get("top1_flips", ()))
            out.append(
                f"top-1 agreement {agree:.1%} < {self.top1_agreement:.0%}"
                f" ({flips} of {found['images']} images change class)"
            )
        return out


def run_over(backend: Preprocessor, corpus: Corpus, size: int) -> Batch:
    """Every corpus image once through ``backend.run``, in corpus order."""
    parts = []
    for start, chunk in corpus.chunks(size):
        with corpus.naming(corpus.names[start : start + size]):
            parts.append(backend.run(chunk)[0])
    return np.concatenate(parts)


@functools.lru_cache(maxsize=2)
def reference_outputs(corpus: Corpus, transform: Transform, reference: str) -> Batch:
    backend = make(reference, transform)
    try:
        out = run_over(backend, corpus, 16)
    finally:
        backend.close()
    out.setflags(write=False)
    return out


def compare(
    out: Batch,
    reference: Batch,
    names: Sequence[str],
    classify: Classify | None,
    tolerance: Tolerance,
) -> dict[str, Any]:
    """Parity of ``out`` with ``reference`` and, given a classifier, top-1 agreement."""
    found: dict[str, Any] = parity(out, reference) | {"images": len(names)}
    if classify is not None:
        ours, theirs = classify(out), classify(reference)
        picked, expected = ours.argmax(axis=1), theirs.argmax(axis=1)
        top2 = np.sort(theirs, axis=1)[:, -2:]
        found["top1_agreement"] = float((picked == expected).mean())
        found["top1_flips"] = [
            {
                "image": names[i],
                "reference_class": int(expected[i]),
                "class": int(picked[i]),
                "reference_margin": float(top2[i, 1] - top2[i, 0]),
            }
            for i in map(int, np.flatnonzero(picked != expected))
        ]
    breaches = tolerance.breaches(found)
    return found | {
        "tolerance": {
            "max_abs": tolerance.max_abs,
            "mean_abs": tolerance.mean_abs,
            "top1_agreement": tolerance.top1_agreement,
        },
        "within_tolerance": not breaches,
        "breaches": breaches,
    }
