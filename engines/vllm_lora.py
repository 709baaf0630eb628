"""vLLM's LoRA adapters: the option that names them, and what vLLM is given for them.

One option, ``lora_modules=NAME=DIR[,NAME=DIR...]`` (as vLLM's ``--lora-modules`` takes
them), configures the adapters an engine serves; ``max_lora_rank`` caps their rank (vLLM
allocates its LoRA buffers for it: 1, 8, 16, 32, 64, ...). In process a request names its
adapter (``GenerationRequest.lora``) and goes to ``AsyncLLM.generate`` with a
``LoRARequest`` of that name, its directory and a stable int id (its position in the
option, from 1: vLLM keys loaded adapters by it). Over HTTP the harness-started server
gets ``--enable-lora --lora-modules NAME=DIR ... --max-lora-rank R --max-loras N`` and a
request selects an adapter by sending its name as the ``model`` (engines/openai_http.py).
Nothing here imports vLLM at module level.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM allocates its LoRA buffers for (``MaxLoRARanks``, vLLM 0.32)."""


def parse_modules(text: str) -> dict[str, str]:
    """``a=/p,b=/q`` -> ``{"a": "/p", "b": "/q"}``; a ValueError naming the bad entry."""
    modules: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        name, eq, path = item.partition("=")
        if not (eq and name.strip() and path.strip()):
            raise ValueError(f"lora_modules entry {item!r} is not NAME=DIR")
        if name.strip() in modules:
            raise ValueError(f"lora_modules names {name.strip()!r} twice")
        modules[name.strip()] = path.strip()
    if not modules:
        raise ValueError("lora_modules names no adapter (NAME=DIR,...)")
    return modules


def check_modules(text: str) -> str:
    """The option's check (``OptionSchema`` custom): NAME=DIR pairs, each DIR an adapter."""
    for name, path in parse_modules(text).items():
        if not (Path(path) / "adapter_config.json").is_file():
            raise ValueError(f"lora_modules {name}={path}: no adapter_config.json there")
    return text


def check_rank(text: str) -> str:
    if not text.isdigit() or int(text) not in RANKS:
        raise ValueError(f"max_lora_rank must be one of {', '.join(map(str, RANKS))}")
    return text


def rank_for(rank: int) -> int:
    """The smallest rank vLLM allocates for that holds ``rank``."""
    for r in RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest, {RANKS[-1]}")


def modules_text(modules: Mapping[str, Path | str]) -> str:
    """The option's value for these adapters."""
    return ",".join(f"{name}={path}" for name, path in modules.items())


@dataclass(frozen=True)
class LoraSet:
    """The adapters one engine serves: name -> directory, ids from 1 in option order."""

    modules: tuple[tuple[str, str], ...]
    max_rank: int = 16

    def __post_init__(self) -> None:
        if not self.modules:
            raise ValueError("a LoRA set names at least one adapter")
        check_rank(str(self.max_rank))

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> LoraSet | None:
        text = options.get("lora_modules", "")
        if not text:
            return None
        return cls(tuple(parse_modules(text).items()), int(options.get("max_lora_rank") or 16))

    def engine_args(self) -> dict[str, Any]:
        """For ``AsyncEngineArgs``: LoRA on, every adapter resident at once."""
        n = len(self.modules)
        return {"enable_lora": True, "max_lora_rank": self.max_rank, "max_loras": n}

    def server_flags(self) -> list[str]:
        """For ``vllm.entrypoints.openai.api_server``."""
        pairs = [f"{name}={path}" for name, path in self.modules]
        sizes = ["--max-lora-rank", str(self.max_rank), "--max-loras", str(len(self.modules))]
        return ["--enable-lora", "--lora-modules", *pairs, *sizes]

    def request(self, name: str) -> Any:
        """The ``LoRARequest`` of adapter ``name`` (a ValueError for an unknown name)."""
        ids = {known: (i, path) for i, (known, path) in enumerate(self.modules, start=1)}
        if name not in ids:
            names = ", ".join(ids)
            raise ValueError(f"LoRA adapter {name!r} is not one this engine serves ({names})")
        from vllm.lora.request import LoRARequest  # noqa: PLC0415

        i, path = ids[name]
        return LoRARequest(lora_name=name, lora_int_id=i, lora_path=path)
