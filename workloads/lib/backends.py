"""The preprocessing backends by name: the CPU baselines (``workloads.lib.preprocess``) and
NVIDIA DALI (``workloads.lib.dali``). Both build on ``workloads.lib.preprocess``; this module is
the one that knows all of them, so neither imports the other."""

from __future__ import annotations

from workloads.lib.dali import DaliPreprocessor
from workloads.lib.preprocess import OpenCvPreprocessor, PilPreprocessor, Preprocessor, Transform

BACKENDS = ("dali-cpu", "dali-gpu", "pil", "opencv")
REFERENCE = "pil"


def make(name: str, transform: Transform | None = None, threads: int = 1) -> Preprocessor:
    """The backend ``name``; raises ``Unavailable`` with the reason where it cannot run."""
    if name == "pil":
        return PilPreprocessor(transform, threads)
    if name == "opencv":
        return OpenCvPreprocessor(transform, threads)
    if name in ("dali-cpu", "dali-gpu"):
        return DaliPreprocessor(transform, threads, device=name.removeprefix("dali-"))
    raise ValueError(f"no preprocessing backend {name!r}; have {', '.join(BACKENDS)}")
