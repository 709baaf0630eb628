"""pytest-benchmark interplay: single-stream cells feed the controller's benchmark session.

A cell whose record declares ``single_stream`` (one request in flight at a time; the
samples key holding each request's latency) becomes one pytest-benchmark benchmark: every
request is one round. So ``--benchmark-json``, ``--benchmark-save``/``--benchmark-autosave``,
``--benchmark-compare`` and ``--benchmark-compare-fail`` work on the harness's own
measurement; nothing is timed again.

* Only the controller's pytest session feeds and writes. Its benchmarks come from the
  records, read back from the run directory once a cell has finished (a worker wrote it,
  or this process did under ``--isolation none``), so both modes give the same numbers.
* A worker repeats the user's command line, ``--benchmark-*`` options included (``-p
  no:benchmark`` would make them unknown arguments there), so ``make_inert`` clears the
  options that write, save or compare before pytest-benchmark reads them.
* Only ``ok`` cells are fed: an invalid cell's figures are not to be reported (the matrix
  shows none either), and a failed one has none. Invalid single-stream cells are named
  in the terminal summary, so a regression check that could not see them is not mistaken
  for a pass.
* ``--benchmark-disable``: cells run and are recorded as always; nothing is fed.
  ``--benchmark-skip``: cells are benchmarks, so they are deselected. ``--benchmark-only``:
  cells run and other tests without the ``benchmark`` fixture are skipped.

pytest-benchmark has no public API for samples timed elsewhere (its fixture times a
callable itself), so this module, and only this one, uses its internals: the session's
``benchmarks`` list (the session is the plugin registered as ``pytest-benchmark``) and
``pytest_benchmark.stats.Metadata(fixture, iterations, options)`` with ``update(seconds)``,
checked against the 5.3.1 source and tests/test_benchbridge.py. Versions outside
``SUPPORTED`` (the project's pin) get a warning and are not fed. pytest-benchmark is
imported only here, and only once a cell is fed: never when it is absent or blocked
(``-p no:benchmark``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.engine import installed_version
from harness.exceptions import RecordError
from harness.results import store
from harness.results.records import CellRecord, Status, read
from harness.session.state import RunState, is_cell

PLUGIN = "benchmark"  # pytest-benchmark's pytest11 entry point
SESSION = "pytest-benchmark"  # the name its BenchmarkSession is registered under
SUPPORTED = SpecifierSet(">=5.1,<6")
BRIDGE = "harness-benchbridge"

# What a worker must not act on: only the controller writes, saves and compares. Disabled,
# its session also never times anything (the cells do not use the fixture anyway).
WORKER_OPTIONS: dict[str, Any] = {
    "benchmark_json": None,
    "benchmark_save": None,
    "benchmark_autosave": None,
    "benchmark_compare": [],
    "benchmark_compare_fail": None,
    "benchmark_histogram": [],
    "benchmark_only": False,  # would skip every cell: they do not use the fixture
    "benchmark_disable": True,
    "benchmark_enable": False,
}
NOT_BENCHMARK = "Skipping non-benchmark (--benchmark-only active)."


def active(config: pytest.Config) -> bool:
    """pytest-benchmark is installed and not blocked (``-p no:benchmark``)."""
    return config.pluginmanager.has_plugin(PLUGIN)


def make_inert(config: pytest.Config) -> None:
    """In a worker: runs before pytest-benchmark's (trylast) configure reads the options."""
    for dest, value in WORKER_OPTIONS.items():
        if hasattr(config.option, dest):
            setattr(config.option, dest, value)


def unsupported() -> str | None:
    """Why the installed pytest-benchmark cannot be fed (None: it can)."""
    found = installed_version("pytest-benchmark")
    try:
        ok = found is not None and Version(found) in SUPPORTED
    except InvalidVersion:
        ok = False
    if ok:
        return None
    return (
        f"pytest-benchmark {found} is not supported by the harness (needs {SUPPORTED}):"
        " single-stream cells will not reach --benchmark-json/--benchmark-compare"
    )


def register(config: pytest.Config, run_state: Callable[[], RunState | None]) -> None:
    """In the controller (or an in-process run), when pytest-benchmark is active."""
    problem = unsupported()
    if problem is not None:
        config.issue_config_time_warning(pytest.PytestConfigWarning(problem), stacklevel=2)
        return
    config.pluginmanager.register(Bridge(run_state, _take_over_only(config)), BRIDGE)


def _disabled(option: Any) -> bool:
    return bool(option.benchmark_disable and not option.benchmark_enable)


def _take_over_only(config: pytest.Config) -> bool:
    """pytest-benchmark's --benchmark-only skips every test without its fixture, cells
    included; the bridge applies it instead, to non-cell tests only. Like ``make_inert``
    this runs before pytest-benchmark's (trylast) configure reads the option. With
    --benchmark-disable the option is left alone, for pytest-benchmark to refuse the pair."""
    option = config.option
    if not option.benchmark_only or _disabled(option):
        return False
    option.benchmark_only = False
    return True


class _Session(Protocol):
    """The part of pytest-benchmark's BenchmarkSession this module uses."""

    benchmarks: list[Any]
    disabled: bool


@dataclass
class _Source:
    """What ``Metadata`` reads from the fixture that timed a benchmark (here: the harness),
    named as pytest-benchmark's own fixture names it: node name, node id, callspec."""

    name: str
    fullname: str
    group: str | None
    param: str | None
    params: dict[str, Any] | None
    extra_info: dict[str, Any]
    cprofile_stats: None = None
    has_error: bool = False


def benchmark_of(item: pytest.Item, record: CellRecord) -> Any:
    """The pytest-benchmark stats of a single-stream record: one round per request."""
    key = record.single_stream
    if key is None:
        raise ValueError(f"{record.cell_id} is not a single-stream cell")
    spec = getattr(item, "callspec", None)
    source = _Source(
        name=item.name,
        fullname=item.nodeid,
        group=record.workload,
        param=spec.id if spec is not None else None,
        params=dict(spec.params) if spec is not None else None,
        extra_info={
            "engine": record.engine,
            "engine_version": record.engine_info.get("version"),
            "workload": record.workload,
            "run_id": record.run_id,
            "cell_id": record.cell_id,
            "attempt": record.attempt,
            "samples": key,
            "unit": "s",
        },
    )
    metadata = importlib.import_module("pytest_benchmark.stats").Metadata
    bench = metadata(source, iterations=1, options={"measured_by": "inference-harness"})
    for seconds in record.samples[key]:
        bench.update(seconds)  # iterations=1: each round is one request, undivided
    return bench


@dataclass(eq=False)  # a registered plugin: pluggy keeps plugins in sets
class Bridge:
    """Controller-side hooks: feed each finished single-stream cell to pytest-benchmark."""

    run_state: Callable[[], RunState | None]
    only: bool
    items: dict[str, pytest.Item] = field(default_factory=dict)
    held_back: list[str] = field(default_factory=list)

    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if self.only:
            for item in items:
                if not is_cell(item) and PLUGIN not in getattr(item, "fixturenames", ()):
                    item.add_marker(pytest.mark.skip(reason=NOT_BENCHMARK))
        elif config.option.benchmark_skip:
            cells = [item for item in items if is_cell(item)]
            if cells:
                config.hook.pytest_deselected(items=cells)
                items[:] = [item for item in items if not is_cell(item)]

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.items = {item.nodeid: item for item in session.items if is_cell(item)}

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        """Called in the controller for every cell, after its record was written (by a
        worker, or by this process), whether it ran here or in a worker."""
        state = self.run_state()
        item = self.items.get(nodeid)
        if state is None or item is None or nodeid not in state.planned:
            return
        session = _session(item.config)
        if session.disabled:  # --benchmark-disable: the records are the only output
            return
        record = self._read(state, state.planned[nodeid].cell_id)
        if record is None or record.single_stream is None:
            return
        if record.status is not Status.OK:
            self.held_back.append(f"{nodeid}: {record.status.value}: {'; '.join(record.reasons)}")
        elif record.samples[record.single_stream]:
            session.benchmarks.append(benchmark_of(item, record))

    @staticmethod
    def _read(state: RunState, cell_id: str) -> CellRecord | None:
        path = store.cell_path(state.run_dir, cell_id, state.attempt)
        if not path.is_file():  # never written: the run's own report says so
            return None
        try:
            return read(CellRecord, path)
        except (RecordError, OSError) as exc:
            state.incident(f"pytest-benchmark: cannot read {path}: {exc}")
            return None

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.held_back:
            return
        terminalreporter.write_line(
            "pytest-benchmark: single-stream cells not ok, not fed (so not compared):",
            yellow=True,
        )
        for line in self.held_back:
            terminalreporter.write_line(f"  {line}", yellow=True)


def _session(config: pytest.Config) -> _Session:
    session = config.pluginmanager.get_plugin(SESSION)
    if session is None or not hasattr(session, "benchmarks"):
        raise RuntimeError(f"pytest-benchmark is active but no {SESSION!r} session is registered")
    return cast(_Session, session)
