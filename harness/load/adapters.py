"""A weighted mix of LoRA adapters over a workload's requests (``--lora``).

``--lora NAME=DIR[@WEIGHT]`` (repeated, or comma-separated) names an adapter, the PEFT
directory it is loaded from and its share of the requests (weight 1 unless given);
``base[@WEIGHT]`` is the base model's share (no adapter). Checked once, when the run is
configured: a directory without ``adapter_config.json``, a weight that is not a positive
number or a name given twice is a usage error naming it.

Each request gets its adapter from a hash of the run's seed and its request id (its
position where it has none): the same request runs on the same adapter in every cell
and every client process, whatever the order it is sent in, and the shares approach the
weights as requests grow. Warm-up requests go round the adapters instead, so that each is
loaded before the measured window (an engine loads an adapter on its first request).

A cell's records are split per adapter afterwards (``by_adapter``): the driver returns one
record per request in the order given (``Driver.open_loop``/``closed_loop``), so record i
ran on request i's adapter.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.engine import GenerationRequest
from harness.exceptions import UsageError
from harness.metrics.streamtiming import RequestRecord, StreamMetrics

BASE = "base"
"""The name that stands for the base model (requests with no adapter)."""
SAMPLES_KEY = "lora"
"""The record's samples key: each completed request's adapter, as its index in the
cell's ``metrics.lora.adapters`` (samples are numbers)."""
FIGURES = ("ttft", "itl", "tpot", "e2e")
NAME = re.compile(r"[A-Za-z0-9_-]+")
"""An adapter's name: a model name on the wire, a key of a metrics path (no dots)."""


@dataclass(frozen=True)
class Adapter:
    """One adapter of the mix; ``path`` None: the base model."""

    name: str
    path: Path | None
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ValueError(f"adapter name {self.name!r}: letters, digits, '-' or '_' only")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"adapter {self.name}: weight must be a positive number")
        if (self.path is None) != (self.name == BASE):
            raise ValueError(f"{BASE!r} names the base model, every other adapter a directory")

    @property
    def rank(self) -> int:
        """The adapter's LoRA rank (``r`` of its ``adapter_config.json``)."""
        if self.path is None:
            return 0
        config = json.loads((self.path / "adapter_config.json").read_text())
        return int(config.get("r", 0))


@dataclass(frozen=True)
class AdapterMix:
    adapters: tuple[Adapter, ...]

    def __post_init__(self) -> None:
        names = [a.name for a in self.adapters]
        if len(set(names)) != len(names):
            raise ValueError("each adapter is named once")
        if not any(a.path is not None for a in self.adapters):
            raise ValueError("a mix names at least one adapter directory")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.adapters)

    @property
    def modules(self) -> dict[str, Path]:
        """The adapters an engine loads, by name (the base model is none of them)."""
        return {a.name: a.path for a in self.adapters if a.path is not None}

    @property
    def max_rank(self) -> int:
        return max(a.rank for a in self.adapters)

    def pick(self, key: str) -> str:
        """The adapter of the request keyed ``key``, by the weights (deterministic)."""
        digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "big") / 2**64 * sum(a.weight for a in self.adapters)
        for adapter in self.adapters:
            u -= adapter.weight
            if u < 0:
                return adapter.name
        return self.adapters[-1].name

    def assign(self, requests: Sequence[GenerationRequest], seed: int) -> list[GenerationRequest]:
        """Each request on its adapter (``GenerationRequest.lora``; the base model: "")."""
        out = []
        for i, r in enumerate(requests):
            name = self.pick(f"{seed}:{r.request_id or i}")
            out.append(replace(r, lora="" if name == BASE else name))
        return out

    def cycle(self, requests: Sequence[GenerationRequest]) -> list[GenerationRequest]:
        """Warm-up: the requests round the adapters in turn, so each is loaded once."""
        names = self.names
        return [
            replace(r, lora="" if (n := names[i % len(names)]) == BASE else n)
            for i, r in enumerate(requests)
        ]

    def to_json(self) -> list[dict[str, Any]]:
        return [
            {"name": a.name, "path": str(a.path) if a.path else None, "weight": a.weight}
            for a in self.adapters
        ]


def parse(values: Iterable[str] | None) -> AdapterMix | None:
    """``--lora`` values into a mix (None: none given); a usage error naming what is wrong."""
    items = [p.strip() for v in values or () for p in v.split(",") if p.strip()]
    if not items:
        return None
    adapters = [_adapter(item) for item in items]
    try:
        return AdapterMix(tuple(adapters))
    except ValueError as exc:
        raise UsageError(f"--lora: {exc}") from None


def _adapter(item: str) -> Adapter:
    spec, at, weight_text = item.rpartition("@") if "@" in item else (item, "", "")
    name, eq, where = spec.partition("=")
    try:
        weight = float(weight_text) if at else 1.0
    except ValueError:
        raise UsageError(f"--lora {item}: weight {weight_text!r} is not a number") from None
    path = Path(where).expanduser() if eq else None
    if path is not None and not (path / "adapter_config.json").is_file():
        raise UsageError(
            f"--lora {item}: {path} is not a LoRA adapter directory (no adapter_config.json)"
        )
    if path is None and name != BASE:
        raise UsageError(f"--lora {item}: give NAME=DIR[@WEIGHT], or {BASE}[@WEIGHT]")
    try:
        return Adapter(name, path.resolve() if path else None, weight)
    except ValueError as exc:
        raise UsageError(f"--lora {item}: {exc}") from None


def adapter_of(request: GenerationRequest) -> str:
    return request.lora or BASE


def by_adapter(
    mix: AdapterMix, requests: Sequence[GenerationRequest], records: Sequence[RequestRecord]
) -> dict[str, Any]:
    """The cell's figures per adapter (``metrics.lora``), and each completed request's
    adapter index for the samples (``per_request``, lifted out by ``lift_samples``)."""
    if len(records) > len(requests):
        raise ValueError("more records than requests")
    names = list(mix.names)
    which = [adapter_of(r) for r in requests[: len(records)]]
    pairs = list(zip(records, which, strict=True))
    figures = {n: _figures([rec for rec, w in pairs if w == n]) for n in names}
    ok = [names.index(w) for rec, w in pairs if rec.ok]
    return {
        "adapters": names,
        "mix": mix.to_json(),
        "by_adapter": figures,
        "per_request": [float(i) for i in ok],
    }


def _figures(records: Sequence[RequestRecord]) -> dict[str, Any]:
    if not records:
        return {"requests": 0}
    summary = StreamMetrics(records, ()).to_json()
    out: dict[str, Any] = {"requests": len(records)}
    for name in FIGURES:
        got = summary.get(name)
        if isinstance(got, dict):
            out[name] = {k: got[k] for k in ("count", "mean", "p50", "p90", "p99") if k in got}
    throughput = summary["throughput"]
    assert isinstance(throughput, dict)
    out["output_tokens_per_s"] = throughput["output_tokens_per_s"]
    out["requests_per_s"] = throughput["requests_per_s"]
    out["failed"] = len([r for r in records if not r.ok])
    return out


def lift_samples(extra: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """A cell's metrics without the per-request adapter indices (``by_adapter``'s
    ``per_request``), and those indices as its samples; unchanged when it ran no mix."""
    lora = extra.get(SAMPLES_KEY)
    if not isinstance(lora, dict) or "per_request" not in lora:
        return extra, {}
    kept = {k: v for k, v in lora.items() if k != "per_request"}
    return extra | {SAMPLES_KEY: kept}, {SAMPLES_KEY: list(lora["per_request"])}
