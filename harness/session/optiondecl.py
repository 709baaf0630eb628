"""What one harness option declares (``Option``), and the block of docs/usage.md that a
table of them renders to (``markdown``; ``rewrite_usage`` writes it between the block's
markers). The table itself is harness.session.optiontable."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENGINES = "Engines and models"
MEASUREMENT = "Measurement"
INPUTS = "Workload inputs"
CLIENTS = "Client processes"
RELIABILITY = "Reliability and resuming"
RAY = "Ray cluster"
OUTPUT = "Results and progress"
SECTIONS = (ENGINES, MEASUREMENT, INPUTS, CLIENTS, RELIABILITY, RAY, OUTPUT)
"""docs/usage.md's option sections, in its order."""
INTERNAL = ""
"""The section of the options the harness gives itself (a worker's, a Ray node's): none,
they are not documented."""


@dataclass(frozen=True)
class Option:
    """One option of the pytest group "harness"."""

    flag: str
    help: str
    """``pytest --help``'s text (argparse's: ``%%`` is a percent sign)."""
    section: str
    field: str | None
    """The ``RunSettings`` field it fills (with others where ``config.COMPOSED`` builds
    that field); None: it steers the session only."""
    default: object = None
    metavar: str | None = None
    value_type: type[int] | type[float] | None = None
    action: str = "store"
    convert: Callable[[Any], object] | None = None
    """Its own check and conversion of the raw value; None: taken as it is."""
    doc: str = ""
    """docs/usage.md's text, where it says more than the help."""
    dest: str = ""

    @property
    def name(self) -> str:
        """Its dest: the ``config.getoption`` name and the ``parse_settings`` keyword."""
        return self.dest or self.flag.removeprefix("--").replace("-", "_")

    @property
    def takes_value(self) -> bool:
        return self.action in ("store", "append")

    def addoption_kwargs(self) -> dict[str, Any]:
        """``group.addoption``'s keywords (argparse's)."""
        kwargs: dict[str, Any] = {"action": self.action, "dest": self.name}
        kwargs |= {"default": self.default, "help": self.help}
        if self.metavar is not None:
            kwargs["metavar"] = self.metavar
        if self.value_type is not None:
            kwargs["type"] = self.value_type
        return kwargs

    def converted(self, raw: object) -> object:
        return raw if self.convert is None else self.convert(raw)

    def usage(self) -> str:
        """How it is written: the flag and, if it takes one, its value's metavar."""
        if not self.takes_value:
            return self.flag
        return f"{self.flag} {self.metavar or self.name.upper()}"

    def doc_row(self) -> str:
        text = self.doc or self.help.replace("%%", "%")
        return f"| `{_cell(self.usage())}` | {_cell(text)} |\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a bar would end the table cell


def markdown(options: Iterable[Option]) -> str:
    """One table per section, in ``SECTIONS``' order, its options in table order."""
    listed = list(options)
    parts = []
    for section in SECTIONS:
        rows = "".join(o.doc_row() for o in listed if o.section == section)
        if rows:
            parts.append(f"### {section}\n\n| option | meaning |\n|---|---|\n{rows}")
    return "\n".join(parts)


BLOCK = re.compile(r"(<!-- options:begin[^\n]*-->\n)(.*?)(<!-- options:end -->)", re.S)
"""docs/usage.md's rendered block, between its markers."""


def rendered_block(text: str) -> str:
    """The block of ``text`` between the markers."""
    found = BLOCK.search(text)
    if found is None:
        raise ValueError("no <!-- options:begin --> ... <!-- options:end --> markers")
    return found.group(2)


def with_block(text: str, block: str) -> str:
    """``text`` with ``block`` between its markers."""
    found = BLOCK.search(text)
    if found is None:
        raise ValueError("no <!-- options:begin --> ... <!-- options:end --> markers")
    return text[: found.start(2)] + block + text[found.end(2) :]


USAGE = Path(__file__).resolve().parents[2] / "docs" / "usage.md"


def rewrite_usage(options: Iterable[Option]) -> str:
    """Rewrite docs/usage.md's option reference from ``options``; what was done."""
    text = USAGE.read_text()
    updated = with_block(text, markdown(options))
    if updated == text:
        return f"{USAGE}: the option reference is current"
    USAGE.write_text(updated)
    return f"{USAGE}: rewrote the option reference"
