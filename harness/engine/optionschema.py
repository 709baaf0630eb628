"""Declarative adapter options: each option is declared once, with its name, type, default
and help, and one schema validates the options, fills in defaults and lists them (for
``python -m harness engines`` and the docs).

An adapter declares ``OPTIONS = OptionSchema(...)``, points ``option_schema`` at it and
lets ``validate_options`` delegate to it::

    OPTIONS = OptionSchema(
        integer("threads", "worker threads", default="4"),
        choice("dtype", "compute dtype", ("float32", "float16"), default="float32"),
        flag("cuda_graph", "capture and replay a CUDA graph per input shape"),
    )

    class MyEngine:
        option_schema: ClassVar[OptionSchema] = OPTIONS

        @classmethod
        def validate_options(cls, options: Mapping[str, str]) -> None:
            OPTIONS.validate(options)

Option values stay strings, as the command line gives them: the schema says which strings
are valid, the adapter converts them where it uses them. Engine-neutral: nothing here
knows any engine.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from harness.engine.contract import reject_unknown_options

Number = int | float


class Kind(enum.StrEnum):
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    CHOICE = "choice"
    STR = "str"
    CUSTOM = "custom"


_INT = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class Option:
    """One adapter option. Build it with ``integer``, ``number``, ``flag``, ``choice``,
    ``text`` or ``custom``, which fill in the fields each kind uses."""

    name: str
    kind: Kind
    help: str
    default: str | None = None
    """The value used when the option is absent; None: the adapter (or the engine) decides,
    and ``help`` says how."""
    low: Number | None = None
    high: Number | None = None
    exclusive: bool = False
    """Numbers only: the bounds given are excluded, as in (0, 1)."""
    choices: tuple[str, ...] = ()
    parse: Callable[[str], object] | None = None
    """A custom option's parser: raises ``ValueError`` with its own message."""
    syntax: str = ""
    """How a custom option's value is written (shown as its values)."""
    must: str = ""
    """Overrides the phrase that says what is valid, in errors ("NAME must be ...") and
    listings; the derived one is used when empty."""

    def __post_init__(self) -> None:
        if self.kind is Kind.CUSTOM and self.parse is None:
            raise ValueError(f"option {self.name}: a custom option needs a parser")
        if self.kind is Kind.CHOICE and not self.choices:
            raise ValueError(f"option {self.name}: a choice needs choices")

    @property
    def expects(self) -> str:
        """What a valid value is, as a phrase: "a positive integer", "0 or 1", ..."""
        return self.must or _DESCRIBE[self.kind](self)

    def check(self, value: str) -> None:
        """Raise ``ValueError`` if ``value`` is not valid for this option."""
        if self.parse is not None:
            self.parse(value)  # its own message says what is wrong
        elif not _ACCEPTS[self.kind](self, value):
            raise ValueError(f"{self.name} must be {self.expects}, got {value!r}")

    def summary(self) -> str:
        """One line: help, valid values and default (what an unknown-option error lists)."""
        default = f"; default {self.default}" if self.default is not None else ""
        return f"{self.help} ({self.expects}{default})"


def integer(
    name: str,
    help: str,
    *,
    default: str | None = None,
    low: int | None = 1,
    high: int | None = None,
    must: str = "",
) -> Option:
    """A whole number in [low, high] (either bound None: unbounded)."""
    return Option(name, Kind.INT, help, default, low=low, high=high, must=must)


def number(
    name: str,
    help: str,
    *,
    default: str | None = None,
    low: float | None = None,
    high: float | None = None,
    exclusive: bool = False,
    must: str = "",
) -> Option:
    """A finite real number within the bounds (excluded when ``exclusive``)."""
    return Option(
        name, Kind.FLOAT, help, default, low=low, high=high, exclusive=exclusive, must=must
    )


def flag(name: str, help: str, *, default: str | None = "0") -> Option:
    """0 or 1."""
    return Option(name, Kind.BOOL, help, default)


def choice(
    name: str,
    help: str,
    choices: tuple[str, ...],
    *,
    default: str | None = None,
) -> Option:
    """One of ``choices``."""
    return Option(name, Kind.CHOICE, help, default, choices=tuple(choices))


def text(name: str, help: str, *, default: str | None = None) -> Option:
    """Any string (a path, a model name, an environment variable's name)."""
    return Option(name, Kind.STR, help, default)


def custom(
    name: str,
    help: str,
    parse: Callable[[str], object],
    syntax: str,
    *,
    default: str | None = None,
) -> Option:
    """A structured value (profiles, dims, a URL) that ``parse`` checks."""
    return Option(name, Kind.CUSTOM, help, default, parse=parse, syntax=syntax)


def _is_int(option: Option, value: str) -> bool:
    return bool(_INT.fullmatch(value)) and _within(option, int(value))


def _is_number(option: Option, value: str) -> bool:
    try:
        parsed = float(value)
    except ValueError:
        return False
    return math.isfinite(parsed) and _within(option, parsed)


def _within(option: Option, value: Number) -> bool:
    low, high = option.low, option.high
    if option.exclusive:
        return (low is None or value > low) and (high is None or value < high)
    return (low is None or value >= low) and (high is None or value <= high)


def _one_of(choices: tuple[str, ...]) -> str:
    if len(choices) <= 2:  # "a or b" reads better than "one of a, b"
        return " or ".join(choices)
    return f"one of {', '.join(choices)}"


def _interval(option: Option) -> str:
    low, high = option.low, option.high
    if low is not None and high is not None:
        if option.exclusive:
            return f"in ({low}, {high})"
        return f"in [{low}, {high}]"
    strict = ">" if option.exclusive else ">="
    if low is not None:
        return f"{strict} {low}"
    if high is not None:
        return f"{strict.replace('>', '<')} {high}"
    return ""


def _describe_int(option: Option) -> str:
    if option.low == 1 and option.high is None:
        return "a positive integer"
    return f"an integer {_interval(option)}".rstrip()


_DESCRIBE: dict[Kind, Callable[[Option], str]] = {
    Kind.INT: _describe_int,
    Kind.FLOAT: lambda o: f"a number {_interval(o)}".rstrip(),
    Kind.BOOL: lambda o: "0 or 1",
    Kind.CHOICE: lambda o: _one_of(o.choices),
    Kind.STR: lambda o: "a string",
    Kind.CUSTOM: lambda o: o.syntax,
}

_ACCEPTS: dict[Kind, Callable[[Option, str], bool]] = {
    Kind.INT: _is_int,
    Kind.FLOAT: _is_number,
    Kind.BOOL: lambda o, v: v in ("0", "1"),
    Kind.CHOICE: lambda o, v: v in o.choices,
    Kind.STR: lambda o, v: True,
}


class HelpRow(NamedTuple):
    """One option as listings show it."""

    name: str
    values: str
    default: str
    help: str


NO_DEFAULT = "-"
"""The default column of an option without a fixed default (its help says what applies)."""


class OptionSchema(Mapping[str, str]):
    """An adapter's options. As a mapping it is ``name -> summary`` (what
    ``reject_unknown_options`` and older code read); ``option(name)`` gives the Option."""

    def __init__(self, *options: Option) -> None:
        self._options = {o.name: o for o in options}
        if len(self._options) != len(options):
            raise ValueError("option names must be unique")

    def __getitem__(self, name: str) -> str:
        return self._options[name].summary()

    def __iter__(self) -> Iterator[str]:
        return iter(self._options)

    def __len__(self) -> int:
        return len(self._options)

    @property
    def options(self) -> tuple[Option, ...]:
        return tuple(self._options.values())

    def option(self, name: str) -> Option:
        return self._options[name]

    def validate(self, options: Mapping[str, str]) -> None:
        """Raise ``ValueError``: first for unknown names (listing every known option), then
        for the first given value its option does not accept."""
        reject_unknown_options(options, self)
        for option in self._options.values():
            if option.name in options:
                option.check(options[option.name])

    def defaults(self) -> dict[str, str]:
        """The options that have a fixed default, with it."""
        return {o.name: o.default for o in self._options.values() if o.default is not None}

    def resolve(self, options: Mapping[str, str]) -> dict[str, str]:
        """``options`` over the defaults."""
        return self.defaults() | dict(options)

    def help_rows(self) -> list[HelpRow]:
        return [
            HelpRow(
                o.name,
                o.expects,
                o.default if o.default is not None else NO_DEFAULT,
                o.help,
            )
            for o in self._options.values()
        ]


def schema_of(factory: object) -> OptionSchema | None:
    """The schema an adapter class declares as ``option_schema`` (None: it declares none,
    as a third-party adapter may not: its ``validate_options`` still checks)."""
    schema = getattr(factory, "option_schema", None)
    return schema if isinstance(schema, OptionSchema) else None


def markdown_table(schema: OptionSchema) -> str:
    """The options as a Markdown table (for docs/engines.md)."""
    lines = ["| option | values | default | description |", "| --- | --- | --- | --- |"]
    for row in schema.help_rows():
        cells = (f"`{row.name}`", row.values, _code(row.default), row.help)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _code(default: str) -> str:
    return default if default == NO_DEFAULT else f"`{default}`"


def _cell(text: str) -> str:
    # a pipe would end the cell; a newline would end the row
    return text.replace("|", "\\|").replace("\n", " ")
