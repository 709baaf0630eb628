"""NVIDIA DALI preprocessing: the same contract as ``workloads.lib.preprocess``, as a DALI graph.

``dali-cpu`` runs every operator on the CPU (``device_id=None``); ``dali-gpu`` decodes
with ``device="mixed"`` (nvJPEG) and resizes and normalizes on the GPU, then copies the
batch back to the host for a CPU engine (``d2h`` is part of its time).

Each batch is fed with ``feed_input`` right before ``run()``: with the default prefetch
depth of 2 the executor would ask for a second batch that was never fed, so pipelines
are built with ``prefetch_queue_depth=1`` (one batch in flight, what a request-serving
path sees).

DALI's fused graph has no per-operator clock, so ``staged`` runs decode, resize and
crop+normalize as three pipelines, each fed the previous one's output; their sum is
above the fused time by the hand-over between pipelines. On the GPU the stages run
asynchronously on one stream, so ``staged`` times the fused graph there (see ``STAGES_ON_GPU``).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from workloads.lib.preprocess import Batch, Transform, Unavailable

INTERPOLATION = "DALI INTERP_LINEAR, antialias=True, subpixel_scale=False"
STAGES_ON_GPU = "not split: DALI's GPU operators run asynchronously on one stream"


def _dali() -> Any:
    try:
        dali = importlib.import_module("nvidia.dali")
        for sub in ("fn", "types", "math", "backend"):
            importlib.import_module(f"nvidia.dali.{sub}")
        return dali
    except ImportError as exc:
        raise Unavailable(
            f"nvidia.dali is not installed ({exc}); pip install nvidia-dali-cuda120"
            " (the harness's 'dali' extra; tox -e dali)"
        ) from None


class DaliPreprocessor:
    """A DALI pipeline per (graph, batch size), built on first use and kept."""

    def __init__(
        self, transform: Transform | None = None, threads: int = 1, device: str = "cpu"
    ) -> None:
        if device not in ("cpu", "gpu"):
            raise ValueError(f"device must be cpu or gpu, got {device!r}")
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self._dali = _dali()
        if device == "gpu" and self._dali.backend.GetCUDADeviceCount() < 1:
            raise Unavailable(
                "dali-gpu needs an NVIDIA GPU and DALI sees none: mixed (nvJPEG) decode and"
                " GPU operators cannot run here"
            )
        self.transform = transform or Transform()
        self.threads = threads
        self.device = device
        self.name = f"dali-{device}"
        self._pipes: dict[tuple[str, int], Any] = {}

    def describe(self) -> dict[str, Any]:
        from dataclasses import asdict  # noqa: PLC0415

        return {
            "backend": self.name,
            "threads": self.threads,
            "device": self.device,
            "decoder": "mixed (nvJPEG)" if self.device == "gpu" else "cpu",
            "interpolation": INTERPOLATION,
            "prefetch_queue_depth": 1,
            "transform": asdict(self.transform),
            "versions": {"dali": str(self._dali.__version__), "numpy": np.__version__},
        }

    def close(self) -> None:
        self._pipes.clear()  # DALI frees a pipeline's threads and buffers with the object

    # -- graphs ---------------------------------------------------------------------------

    def _pipe(self, graph: str, batch: int) -> Any:
        key = (graph, batch)
        if key not in self._pipes:
            dali = self._dali
            pipe = dali.Pipeline(
                batch_size=batch,
                num_threads=self.threads,
                device_id=0 if self.device == "gpu" else None,
                prefetch_queue_depth=1,
            )
            with pipe:
                pipe.set_outputs(getattr(self, f"_graph_{graph}")())
            pipe.build()
            self._pipes[key] = pipe
        return self._pipes[key]

    def _source(self, name: str, ndim: int) -> Any:
        fn, types = self._dali.fn, self._dali.types
        layout = "HWC" if ndim == 3 else None
        return fn.external_source(name=name, dtype=types.UINT8, ndim=ndim, layout=layout)

    def _decode(self, raw: Any) -> Any:
        fn, types = self._dali.fn, self._dali.types
        where = "mixed" if self.device == "gpu" else "cpu"
        return fn.decoders.image(raw, device=where, output_type=types.RGB)

    def _resize(self, image: Any) -> Any:
        fn, types = self._dali.fn, self._dali.types
        return fn.resize(
            image,
            resize_shorter=self.transform.shorter,
            interp_type=types.INTERP_LINEAR,
            antialias=True,
            subpixel_scale=False,
        )

    def _normalize(self, image: Any) -> Any:
        fn, types = self._dali.fn, self._dali.types
        t = self.transform
        shape = image.shape()
        return fn.crop_mirror_normalize(
            image,
            crop=(t.crop, t.crop),
            crop_pos_x=self._center(shape[1]),
            crop_pos_y=self._center(shape[0]),
            mean=list(t.mean),
            std=list(t.std),
            output_layout="CHW",
            dtype=types.FLOAT,
        )

    def _center(self, extent: Any) -> Any:
        """Crop position giving the contract's corner, floor(spare / 2): DALI rounds
        pos * spare to the nearest pixel, which moves odd margins by one."""
        fn, types = self._dali.fn, self._dali.types
        spare = fn.cast(extent - self.transform.crop, dtype=types.INT32)
        half = fn.cast(spare // 2, dtype=types.FLOAT)
        return half / fn.cast(self._dali.math.max(spare, 1), dtype=types.FLOAT)

    def _graph_fused(self) -> Any:
        return self._normalize(self._resize(self._decode(self._source("raw", 1))))

    def _graph_decode(self) -> Any:
        return self._decode(self._source("raw", 1))

    def _graph_resize(self) -> Any:
        return self._resize(self._source("decoded", 3))

    def _graph_normalize(self) -> Any:
        return self._normalize(self._source("resized", 3))

    # -- running --------------------------------------------------------------------------

    def _step(self, pipe: Any, source: str, data: Any) -> Any:
        pipe.feed_input(source, data)
        (out,) = pipe.run()
        return out

    def _host(self, out: Any) -> Batch:
        host = out.as_cpu() if self.device == "gpu" else out
        return np.asarray(host.as_array(), dtype=np.float32)

    def run(self, images: Sequence[bytes]) -> tuple[Batch, dict[str, float]]:
        pipe = self._pipe("fused", len(images))  # built outside the clock
        raw = [np.frombuffer(data, dtype=np.uint8) for data in images]
        t0 = time.perf_counter()
        batch = self._host(self._step(pipe, "raw", raw))
        return batch, {"pipeline": time.perf_counter() - t0}

    def staged(self, images: Sequence[bytes]) -> tuple[Batch, dict[str, float]]:
        if self.device == "gpu":
            return self.run(images)
        n = len(images)
        decode, resize, normalize = (self._pipe(g, n) for g in ("decode", "resize", "normalize"))
        raw = [np.frombuffer(data, dtype=np.uint8) for data in images]
        clock = time.perf_counter
        t0 = clock()
        decoded = self._step(decode, "raw", raw)
        t1 = clock()
        resized = self._step(resize, "decoded", decoded)
        t2 = clock()
        batch = self._host(self._step(normalize, "resized", resized))
        t3 = clock()
        return batch, {"decode": t1 - t0, "resize": t2 - t1, "normalize": t3 - t2}
