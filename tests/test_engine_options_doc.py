"""docs/engines.md's option tables are the adapters' option schemas, rendered: the same
declarations validate options, fill ``python -m harness engines`` and write the docs, so
the docs cannot drift from the code. After changing an adapter's options, rewrite the
section with ``HARNESS_DOCS_WRITE=1 pytest tests/test_engine_options_doc.py``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from harness.engine import registry
from harness.engine.optionschema import markdown_table, schema_of

DOC = Path(__file__).resolve().parent.parent / "docs" / "engines.md"
SECTION = re.compile(
    r"(<!-- engine-options:begin[^\n]*-->\n)(.*?)(<!-- engine-options:end -->)", re.S
)


def rendered() -> str:
    """One table per registered engine that declares a schema, in registry order."""
    parts = []
    for name in registry.names():
        schema = schema_of(registry.load(name))
        if schema is not None:
            parts.append(f"**`{name}`**\n\n{markdown_table(schema)}")
    return "\n".join(parts)


def test_the_docs_option_tables_are_the_schemas():
    text = DOC.read_text()
    found = SECTION.search(text)
    assert found, f"{DOC} has no engine-options:begin/end markers"
    if os.environ.get("HARNESS_DOCS_WRITE") == "1":
        DOC.write_text(text[: found.start(2)] + rendered() + text[found.end(2) :])
        pytest.skip(f"rewrote the option tables in {DOC}")
    assert found.group(2) == rendered()


def test_every_builtin_adapter_declares_its_options():
    missing = [n for n in registry.names() if schema_of(registry.load(n)) is None]
    assert missing == []
