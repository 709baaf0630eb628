"""The shape of the code, checked: harness/ grouped by job into a few subpackages whose
dependencies run one way, no import cycle anywhere in harness/, engines/ and workloads/
(imports inside functions included), and no module too long to read."""

from __future__ import annotations

import ast
import graphlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("harness", "engines", "workloads")
# harness's subpackages, lowest first: each may import only from its own rank or below
RANKS = {
    "exceptions": 0,
    "engine": 1,
    "metrics": 1,
    "results": 1,
    "load": 2,
    "session": 3,
    "report": 3,
    "dist": 4,
    "plugin": 5,
    "cli": 5,
    "api": 6,
    "__main__": 7,
}
MAX_LINES = 600
MAX_TOP_LEVEL = 13


def _name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def _targets(node: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = module.split(".")
            keep = len(parts) - node.level + (1 if is_package else 0)
            base = ".".join([*parts[:keep], *([node.module] if node.module else [])])
        yield base
        yield from (f"{base}.{a.name}" for a in node.names)


def imports(module: str) -> set[str]:
    """Every project module ``module`` imports, at any depth of its code."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        found.update(_targets(node, module, path.name == "__init__.py"))
    return {m for m in found if m in MODULES and m != module}


GRAPH = {m: imports(m) for m in MODULES}


def _cycle() -> list[str]:
    """One import cycle of the project's modules, [] if there is none."""
    try:
        graphlib.TopologicalSorter(GRAPH).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return []


def test_no_import_cycle_in_harness_engines_or_workloads():
    assert _cycle() == []


def test_the_cycle_finder_finds_a_cycle(monkeypatch):
    # the serving loop imports the contract: the contract importing it back closes a loop
    monkeypatch.setitem(GRAPH, "harness.engine.contract", {"harness.load.serving"})
    assert {"harness.load.serving", "harness.engine.contract"} <= set(_cycle())


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "harness" and len(parts) > 1 else None


def test_harness_dependencies_run_one_way():
    upward = []
    for module, deps in GRAPH.items():
        low = _part(module)
        for dep in deps:
            high = _part(dep)
            if low and high and low != high and RANKS[high] > RANKS[low]:
                upward.append(f"{module} imports {dep}")
    assert upward == []


def test_harness_has_a_dozen_top_level_modules_and_every_one_is_ranked():
    entries = sorted(
        p.stem for p in (REPO / "harness").iterdir() if p.suffix == ".py" or p.is_dir()
    )
    entries = [e for e in entries if e not in ("__init__", "templates", "__pycache__")]
    assert len(entries) <= MAX_TOP_LEVEL, entries
    assert set(entries) <= set(RANKS), set(entries) - set(RANKS)


# every module the project owns outside tests/ is held to MAX_LINES: the packages (workload
# tests and workloads/lib included), benchmarks/, scripts/ and the top-level conftest.py
CAPPED_DIRS = (*PACKAGES, "benchmarks", "scripts")
CAPPED = sorted([*(p for d in CAPPED_DIRS for p in (REPO / d).rglob("*.py")), REPO / "conftest.py"])


def _too_long(path: Path) -> str | None:
    """What is wrong with ``path``'s length, None if it is within MAX_LINES."""
    lines = len(path.read_text().splitlines())
    if lines <= MAX_LINES:
        return None
    return f"{path.relative_to(REPO)}: {lines} lines, over {MAX_LINES}: split it by job"


@pytest.mark.parametrize("path", CAPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_is_longer_than_it_can_be_read(path):
    assert _too_long(path) is None


def test_the_length_cap_covers_every_owned_folder_and_names_a_long_module(tmp_path, monkeypatch):
    assert {p.relative_to(REPO).parts[0] for p in CAPPED} == {*CAPPED_DIRS, "conftest.py"}
    assert REPO / "workloads" / "lib" / "datasets.py" in CAPPED
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    long = tmp_path / "long.py"
    long.write_text("x = 1\n" * (MAX_LINES + 1))
    assert _too_long(long) == f"long.py: {MAX_LINES + 1} lines, over {MAX_LINES}: split it by job"
    long.write_text("x = 1\n" * MAX_LINES)
    assert _too_long(long) is None


# names a package gives its parts by convention, or that pytest looks for
SHARED_NAMES = {"__init__", "conftest"}


def test_no_two_modules_share_a_name():
    """``progress`` twice or ``model`` three times makes a reader open the wrong one: a
    module's own name says what it holds, wherever it lives."""
    by_name: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if path.stem not in SHARED_NAMES:
            by_name.setdefault(path.stem, []).append(module)
    assert {name: sorted(ms) for name, ms in by_name.items() if len(ms) > 1} == {}


CONTROL_FLOW = {"NewEngineInstance", "Terminated"}  # signals, not errors


def test_every_harness_error_derives_from_one_base():
    import importlib  # noqa: PLC0415
    import inspect  # noqa: PLC0415

    from harness.exceptions import HarnessError  # noqa: PLC0415

    strays = []
    # __main__ runs the CLI when imported
    for module in sorted(m for m in MODULES if m.startswith("harness") and "__main__" not in m):
        namespace = importlib.import_module(module)
        for name, obj in vars(namespace).items():
            ours = inspect.isclass(obj) and obj.__module__ == module and name not in CONTROL_FLOW
            if ours and issubclass(obj, BaseException) and not issubclass(obj, HarnessError):
                strays.append(f"{module}.{name}")
    assert strays == []


# the project's own workload library: it may import harness's modules directly
WORKLOAD_LIBRARY = "workloads.lib"


def _workload_test(module: str) -> bool:
    """A workload test module (or workloads/conftest.py): anything in workloads/ but its library."""
    in_library = module == WORKLOAD_LIBRARY or module.startswith(f"{WORKLOAD_LIBRARY}.")
    return module.startswith("workloads") and not in_library


def test_workloads_import_the_harness_through_its_one_entry_point():
    """Workload tests see ``harness.api`` (and ``workloads.lib``), as a user's workload
    does; the modules behind it may move. ``workloads.lib`` may use them."""
    assert _workload_test("workloads.test_load")
    assert _workload_test("workloads.conftest")
    assert not _workload_test("workloads.lib.load")
    stray = sorted(
        f"{module} imports {dep}"
        for module, deps in GRAPH.items()
        if _workload_test(module)
        for dep in deps
        if dep.startswith("harness") and dep not in ("harness", "harness.api")
    )
    assert stray == []


SOURCE_DIRS = (*PACKAGES, "benchmarks", "scripts", "tests")


def test_no_source_file_is_hidden_by_gitignore():
    """A pattern in .gitignore that matches a source folder (an unanchored ``dist/`` matched
    harness/dist/) would leave a new module there untracked, silently."""
    import shutil  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    sources = [str(p.relative_to(REPO)) for d in SOURCE_DIRS for p in (REPO / d).rglob("*.py")]
    probes = [*sources, *(f"{d}/new_module.py" for d in {str(Path(s).parent) for s in sources})]
    proc = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=REPO,
        input="\n".join(probes),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr  # 1: nothing ignored
    assert proc.stdout.split() == []
