"""``-k`` in the cells' own spelling: ``-k "batching and rate=3500"``.

Cell ids say ``rate=3500`` where pytest's test ids say ``rate3500``, and pytest's ``-k``
grammar has no ``=`` outside a call's keyword arguments. So each cell also answers to its
cell id with ``=`` read as ``:`` (a character ``-k`` allows), and an expression pytest
cannot parse (``=`` is valid in it only inside a call's parentheses) is read the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from harness.results.records import PlannedCell

SPELLING = pytest.StashKey[str]()


def _as_keyword(text: str) -> str:
    return text.replace("=", ":")


def accept_cell_id_spelling(config: pytest.Config) -> None:
    """Rewrite ``-k name=value`` into the form each cell answers to; says so in the header."""
    given = config.option.keyword or ""
    if "=" not in given or "(" in given:
        return  # nothing to read, or pytest's own keyword-argument syntax
    config.option.keyword = _as_keyword(given)
    config.stash[SPELLING] = (
        f"-k {given!r} read as {config.option.keyword!r}: a cell matches its cell id's"
        " name=value parts (pytest's own test ids spell them without '=')"
    )


def add_cell_ids(
    cells: Sequence[pytest.Item], planned: Callable[[pytest.Item], PlannedCell]
) -> None:
    for item in cells:
        item.extra_keyword_matches.add(_as_keyword(planned(item).cell_id))


def header(config: pytest.Config) -> list[str]:
    note = config.stash.get(SPELLING, None)
    return [note] if note else []
