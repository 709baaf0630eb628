"""The documentation cannot rot: the engine example in docs/writing-an-engine.md passes the
conformance suite and runs through the registry, its entry point names it, every relative
link in README.md and docs/*.md points to a file that exists, and the README keeps the two
set-up command lines that CI and users depend on."""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from harness.engine import EngineConfig, registry
from harness.results.records import MIGRATIONS, SCHEMA_VERSION

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
ENGINE_DOC = DOCS / "writing-an-engine.md"

SET_UP_LINES = (
    "python -m pip install tox && tox -e bench",
    "python -m pip install tox && tox -e lint,tests",
)

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_REFERENCE = re.compile(r"^\[[^\]]+\]:\s*(\S+)", re.MULTILINE)


def example(doc: Path, name: str, language: str = "python") -> str:
    """The fenced block right after ``<!-- docs-example: NAME ... -->`` in ``doc``."""
    text = doc.read_text()
    marker = re.search(rf"<!-- docs-example: {re.escape(name)}\b[^>]*-->\n", text)
    assert marker, f"{doc.name} has no '<!-- docs-example: {name} -->' marker"
    block = _FENCE.match(text, marker.end())
    assert block, f"the docs-example {name!r} marker in {doc.name} is not followed by a block"
    assert block.group(1) == language, f"docs-example {name!r} is not a {language} block"
    return block.group(2)


def entry_point() -> tuple[str, str]:
    """(engine name, "module:Class") from the doc's ``harness.engines`` TOML block."""
    blocks = [b for lang, b in _FENCE.findall(ENGINE_DOC.read_text()) if lang == "toml"]
    assert len(blocks) == 1, "writing-an-engine.md should show one entry-point table"
    table = tomllib.loads(blocks[0])["project"]["entry-points"]["harness.engines"]
    [(name, target)] = table.items()
    return name, target


@pytest.fixture
def engine_package(tmp_path: Path) -> Iterator[tuple[str, type]]:
    """The doc's engine written where its entry point says, importable; (name, class)."""
    name, target = entry_point()
    module, _, attr = target.partition(":")
    path = tmp_path.joinpath(*module.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True)
    for parent in (path.parent, *path.parent.parents):
        if parent == tmp_path:
            break
        (parent / "__init__.py").touch()
    path.write_text(example(ENGINE_DOC, "engine"))
    sys.path.insert(0, str(tmp_path))
    top = module.split(".")[0]
    try:
        yield name, getattr(importlib.import_module(module), attr)
    finally:
        sys.path.remove(str(tmp_path))
        for loaded in [m for m in sys.modules if m == top or m.startswith(f"{top}.")]:
            del sys.modules[loaded]


def test_the_engine_example_runs_through_the_registry(engine_package, tmp_path):
    name, factory = engine_package
    assert factory.name == name, "the entry point's name is the adapter's name"
    model = tmp_path / "weights.npy"
    np.save(model, np.eye(3, dtype=np.float32))
    with registry.registered(name, factory):
        assert name in registry.names()
        status = registry.status(name, "cpu")
        assert status.availability.available, status.availability.reason
        assert not registry.status(name, "cuda").availability.available
        adapter = registry.load(name)
        adapter.validate_options({"scale": "2"})
        with pytest.raises(ValueError, match="no_such_option"):
            adapter.validate_options({"no_such_option": "1"})
        engine = adapter(EngineConfig(model=model, options={"scale": "2"}))
        engine.load()
        try:
            x = np.arange(6, dtype=np.float32).reshape(2, 3)
            engine.warmup({"x": x}, 2)
            np.testing.assert_array_equal(engine.infer({"x": x})["y"], 2 * x)
            assert engine.describe()["effective"]["scale"] == 2.0
        finally:
            engine.close()
            engine.close()


def test_the_engine_example_passes_the_conformance_suite(pytester):
    _, target = entry_point()
    module = target.partition(":")[0]
    package, _, leaf = module.rpartition(".")
    root = pytester.path
    if package:
        pytester.mkpydir(package.replace(".", "/"))
        root = root / package.replace(".", "/")
    (root / f"{leaf}.py").write_text(example(ENGINE_DOC, "engine"))
    pytester.makepyfile(test_my_engine=example(ENGINE_DOC, "conformance"))
    pytester.syspathinsert()
    result = pytester.runpytest("-p", "no:cacheprovider", "-q", "-rfEs")
    outcomes = result.parseoutcomes()
    output = result.stdout.str()
    assert outcomes.get("failed", 0) == 0, output[-4000:]
    assert outcomes.get("errors", 0) == 0, output[-4000:]
    assert outcomes["passed"] >= 11, outcomes
    # the one check it may skip: it does not time a device (ReportsDeviceTimes)
    assert outcomes.get("skipped", 0) <= 1, output[-4000:]
    if outcomes.get("skipped"):
        assert "ReportsDeviceTimes" in output, output[-4000:]


def _documents() -> list[Path]:
    return [README, REPO / "results" / "README.md", *sorted(DOCS.glob("*.md"))]


def _links(doc: Path) -> Iterator[str]:
    text = _FENCE.sub("", doc.read_text())  # code blocks hold no links
    text = re.sub(r"`[^`]*`", "", text)  # nor inline code (which may span lines)
    yield from _LINK.findall(text)
    yield from _REFERENCE.findall(text)


def _relative(target: str) -> str | None:
    """The file part of a relative link; None for URLs, mail and in-page anchors."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
        return None
    return target.split("#", 1)[0] or None


def anchors(doc: Path) -> set[str]:
    """The heading anchors GitHub gives ``doc``: lower case, punctuation dropped, spaces
    to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in _FENCE.sub("", doc.read_text()).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def _resolves(doc: Path, target: str) -> bool:
    """A relative link names an existing file and, in a Markdown file, a real heading."""
    path, _, anchor = target.partition("#")
    if _relative(target) is None and not target.startswith("#"):
        return True  # a URL: not checked here
    file = doc.parent / path if path else doc
    if not file.exists():
        return False
    return not anchor or file.suffix != ".md" or anchor in anchors(file)


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_to_files_that_exist(doc: Path):
    broken = [target for target in _links(doc) if not _resolves(doc, target)]
    assert not broken, f"{doc.relative_to(REPO)} has broken links: {broken}"


def test_the_docs_are_linked_from_the_readme():
    linked = {_relative(t) for t in _links(README)}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if f"docs/{p.name}" not in linked]
    assert not unlinked, f"README.md's docs table does not link {unlinked}"


def test_the_readme_keeps_the_two_set_up_lines():
    lines = README.read_text().splitlines()
    for command in SET_UP_LINES:
        assert command in lines, f"README.md lost the set-up line {command!r}"
    assert "## Set-up: two command lines" in lines


def test_the_readme_stays_short():
    assert len(README.read_text().splitlines()) < 200, "README.md: move detail into docs/"


def test_no_document_points_at_a_design_file_the_repository_lacks():
    for doc in _documents():
        assert "DESIGN.md" not in doc.read_text(), f"{doc.name} cites DESIGN.md; cite docs/"


def test_results_doc_lists_every_schema_version():
    text = (DOCS / "results.md").read_text()
    assert f"(currently {SCHEMA_VERSION})" in text, "docs/results.md: the current schema"
    history = text.split("## Schema versions", 1)[1].split("\n## ", 1)[0]
    listed = {int(v) for v in re.findall(r"^\| (\d+) \|", history, re.MULTILINE)}
    assert listed >= set(range(1, SCHEMA_VERSION + 1)), "docs/results.md: schema history"
    assert set(MIGRATIONS) == set(range(1, SCHEMA_VERSION))
