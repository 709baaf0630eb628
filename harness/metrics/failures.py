"""Failed requests grouped by what went wrong, for the record's ``errors`` table.

Messages often carry what differs per request (ids, addresses, counters); counted raw,
one bad run would fill a record with thousands of one-off keys. Long numbers, hex ids
and UUIDs become ``#``; short numbers stay, so ``HTTP 429`` and ``HTTP 500`` remain
apart. Past ``limit`` distinct kinds the rarest are folded into one line that says
how many kinds and requests it holds: every failed request is still counted.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping

LIMIT = 20
_VARIABLE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"  # UUID
    r"|0x[0-9a-f]+"  # address
    r"|\b[0-9a-f]*\d[0-9a-f]*[a-f][0-9a-f]*\b(?<=\w{8})"  # hex id of 8+ characters
    r"|\d{4,}",  # long number (timestamps, ports, byte counts)
    re.IGNORECASE,
)


def kind(message: str) -> str:
    return _VARIABLE.sub("#", message)


def tally(counts: Mapping[str, int] | Iterable[str], limit: int = LIMIT) -> dict[str, int]:
    """Counts per error kind, most frequent first (ties by text), at most ``limit`` + 1."""
    kinds: Counter[str] = Counter()
    for message, n in Counter(counts).items():  # a mapping's values are its counts
        kinds[kind(message)] += n
    ranked = sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))
    out = dict(ranked[:limit])
    rest = ranked[limit:]
    if rest:
        out[f"(other: {len(rest)} more kinds of error)"] = sum(n for _, n in rest)
    return out
