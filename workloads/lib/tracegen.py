"""The trace the trace-replay workload uses without ``--trace-file``: a Mooncake-format JSONL
file generated locally and deterministically, so the default run goes through the same
parser, scaling and prompt synthesis as a user's trace.

What it imitates of production traffic (the Mooncake trace's shape, not its numbers):
bursty arrivals (gamma inter-arrival times, coefficient of variation 2), a few shared
prefixes (system prompts, documents) that many requests start with, each a run of
512-token blocks with the same ``hash_ids``, followed by blocks of their own, and
skewed output lengths. Sized for vLLM's default context here (1024 tokens): inputs of
at most two blocks (912 tokens), outputs up to 64.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from harness.api import cache_root
from workloads.lib.inputs import lengths

VERSION = 2
REQUESTS = 240
MEAN_RATE = 12.0  # requests/s over the whole trace
BURST_CV = 2.0
BLOCK = 512
SHARED_PREFIXES = 6  # distinct shared prefixes of one block
MAX_TAIL = 400  # tokens of the last, partial block: inputs stay under 912 tokens
SHARED_SHARE = 0.7  # of requests start with one of them


def default_trace(seed: int) -> Path:
    """The generated trace for ``seed``, written once under the harness cache."""
    path = cache_root() / "traces" / f"synthetic-mooncake-v{VERSION}-s{seed}.jsonl"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{np.random.default_rng().integers(1 << 30)}")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows(seed)))
    tmp.replace(path)  # atomic: a concurrent writer's file is identical
    return path


def rows(seed: int) -> list[dict[str, object]]:
    rng = np.random.default_rng([seed, VERSION])
    shape = 1.0 / BURST_CV**2  # gamma with this shape has the wanted CV
    gaps = rng.gamma(shape, 1.0 / (MEAN_RATE * shape), size=REQUESTS)
    times_ms = np.rint(np.cumsum(gaps) * 1e3 - gaps[0] * 1e3).astype(int)
    prefixes = [[1000 * (p + 1)] for p in range(SHARED_PREFIXES)]
    outputs = lengths(rng, REQUESTS, 24, 4, 64)
    next_id = 1
    out: list[dict[str, object]] = []
    for i in range(REQUESTS):
        shared = prefixes[int(rng.integers(SHARED_PREFIXES))] if rng.random() < SHARED_SHARE else []
        own = 1 if shared else int(rng.integers(1, 3))  # two blocks at most in all
        ids = [*shared, *range(next_id, next_id + own)]
        next_id += own
        # the last block is partial, as in Mooncake's trace
        tail = int(rng.integers(16, MAX_TAIL))
        length = (len(ids) - 1) * BLOCK + tail
        out.append(
            {
                "timestamp": int(times_ms[i]),
                "input_length": length,
                "output_length": int(outputs[i]),
                "hash_ids": ids,
            }
        )
    return out
