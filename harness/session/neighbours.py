"""Beside other pytest plugins: what each popular one would do to a measurement, and the
rules that keep a harness run sound under them (docs/usage.md, "Beside other pytest
plugins").

The harness is loaded into every pytest session of an environment it is installed in, so
its rules apply to sessions that collect cells only: a project's own test suite run with
``-n 4`` or ``--reruns 2`` is none of the harness's business.
"""

from __future__ import annotations

import os
import shlex
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

XDIST_REFUSED = (
    "pytest-xdist's -n/--numprocesses (or --dist/--tx) would run cells side by side on the"
    " same cores, each measuring the others, and start one run per xdist worker. The harness"
    " already runs each engine's cells in a worker process of its own; for more offered load"
    " use --clients N (client processes), for more machines --cells-on=ray. Run without -n"
    " (or with -n 0, or -p no:xdist)"
)
RERUNS_REFUSED = (
    "pytest-rerunfailures would run a failed cell again and keep only the last try, hiding"
    " the failure the record must show. Finish failed cells with --resume RUN_DIR (the failed"
    " record stays beside the rerun), or measure each cell N times with --repeats N; drop"
    " --reruns (or -p no:rerunfailures) for a harness run"
)
REPEAT_REFUSED = (
    "pytest-repeat's --count/@pytest.mark.repeat would make copies of a cell under other ids"
    " that measure in the same worker, one after another. Use the harness's --repeats N: each"
    " repeat in a fresh worker process, recorded as <cell-id>@N and judged by compare"
)
TRACING = (
    "measured under a Python tracer ({what}): every Python line of the harness and the engine"
    " ran slower, so this latency is not the engine's alone; measure without coverage"
    " (--no-cov, or without --cov) to publish it"
)


def distributing(config: pytest.Config) -> bool:
    """True where pytest-xdist would spread this session's tests over processes."""
    numprocesses = config.getoption("numprocesses", None)
    if numprocesses not in (None, 0, "0"):
        return True
    return bool(config.getoption("tx", None)) and config.getoption("dist", "no") != "no"


def is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def names_harness_options(config: pytest.Config, names: Iterable[str]) -> bool:
    """Whether the command line (or PYTEST_ADDOPTS) gives any of the harness's options."""
    wanted = frozenset(names)
    args: list[str] = [*config.invocation_params.args]
    args += shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    return any(a.partition("=")[0] in wanted for a in args)


def check_configure(config: pytest.Config, harness_options: Iterable[str]) -> None:
    """At configuration: ``-n`` with a harness option on the command line is refused at
    once (before any xdist worker starts); without one, each xdist worker refuses the
    cells it collects (``check_cells``)."""
    if distributing(config) and names_harness_options(config, harness_options):
        raise pytest.UsageError(XDIST_REFUSED)


REFUSED_KEY = "harness_refused"


def drop_cells_in_xdist_worker(
    config: pytest.Config, items: list[pytest.Item], cells: Sequence[pytest.Item]
) -> bool:
    """In an xdist worker, leave the cells out and tell the xdist controller why
    (``XdistController``): a usage error raised in a worker is lost in xdist's internal
    error. Every worker leaves out the same cells, so their collections still agree, and
    no worker starts a run. True where the cells were dropped."""
    if not is_xdist_worker(config):
        return False
    dropped = set(map(id, cells))
    config.hook.pytest_deselected(items=list(cells))
    items[:] = [i for i in items if id(i) not in dropped]
    config.workeroutput[REFUSED_KEY] = XDIST_REFUSED  # type: ignore[attr-defined]
    return True


class XdistController:
    """On pytest-xdist's controller: a worker's refusal of the cells becomes the session's
    usage error (exit status 4, the reason at the end of the output)."""

    def __init__(self) -> None:
        self.refused: str | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        output = getattr(node, "workeroutput", None) or {}
        self.refused = self.refused or output.get(REFUSED_KEY)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.refused:
            session.exitstatus = pytest.ExitCode.USAGE_ERROR

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.refused:
            terminalreporter.write_line(f"ERROR: {self.refused}", red=True)


def watch_xdist(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist") and not is_xdist_worker(config):
        config.pluginmanager.register(XdistController(), "harness-xdist-controller")


def check_cells(config: pytest.Config, cells: Sequence[pytest.Item]) -> None:
    """Refuse what would double, hide or mix a cell's record; ``cells`` is not empty."""
    if distributing(config):
        raise pytest.UsageError(XDIST_REFUSED)
    if _reruns(config) or any(c.get_closest_marker("flaky") for c in cells):
        raise pytest.UsageError(RERUNS_REFUSED)
    count = config.getoption("count", 1)
    if (isinstance(count, int) and count > 1) or any(c.get_closest_marker("repeat") for c in cells):
        raise pytest.UsageError(REPEAT_REFUSED)


def _reruns(config: pytest.Config) -> bool:
    option = config.getoption("reruns", None)
    if option:
        return True
    if not config.pluginmanager.hasplugin("rerunfailures"):
        return False
    try:
        ini = config.getini("reruns")
    except ValueError:  # an older rerunfailures has no ini option
        return False
    return bool(ini) and str(ini).strip() not in ("", "0")


def unbind_timeouts(config: pytest.Config, cells: Sequence[pytest.Item]) -> None:
    """Where the harness bounds a cell itself (a worker under process isolation: the
    controller's ``--cell-timeout`` and ``--load-timeout`` record ``timeout``), pytest-timeout
    must not kill it first: its cells get ``timeout(0)``, pytest-timeout's "no limit"."""
    if not config.pluginmanager.hasplugin("timeout"):
        return
    for item in cells:
        item.add_marker(pytest.mark.timeout(0))


def tracing() -> str | None:
    """What traces this process's Python lines (coverage, a debugger, a profiler), if any.

    Asked in the process that measures, when the cell's verdict is made: pytest-cov starts
    coverage in a worker through the worker's own ``--cov``, and ``coverage run`` or a
    ``patch = subprocess`` configuration reaches any process."""
    tracer = sys.gettrace() or threading.gettrace()
    if tracer is not None:
        return _name(tracer)
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:  # Python 3.12+: coverage's sysmon core, debuggers
        for tool in (monitoring.COVERAGE_ID, monitoring.DEBUGGER_ID, monitoring.PROFILER_ID):
            name = monitoring.get_tool(tool)
            if name:
                return f"sys.monitoring tool {name!r}"
    profiler = sys.getprofile() or threading.getprofile()
    return _name(profiler) if profiler is not None else None


def tracing_warning() -> str | None:
    what = tracing()
    return TRACING.format(what=what) if what else None


def _name(hook: Any) -> str:
    kind = type(hook)
    module = kind.__module__ if kind.__module__ != "builtins" else ""
    owner = getattr(hook, "__self__", None)
    if owner is not None:  # a bound method, e.g. a pure-Python tracer's _trace
        kind = type(owner)
        module = kind.__module__
    return f"{module}.{kind.__qualname__}" if module else kind.__qualname__


SETTINGS_READ = {
    "randomly": ("randomly_seed", "randomly_reorganize", "randomly_reset_seed"),
    "_cov": ("cov_source", "no_cov"),
    "timeout": ("timeout", "timeout_method"),
    "xdist": ("numprocesses", "dist"),
    "rerunfailures": ("reruns",),
    "repeat": ("count",),
    "asyncio": ("asyncio_mode",),
    "benchmark": ("benchmark_disable", "benchmark_json"),
}
"""Per plugin (its pytest plugin name): the options that say what it did to this run."""


def active(config: pytest.Config) -> dict[str, Any]:
    """The pytest plugins of this session and what they were set to, for the manifest:
    a run under coverage or in random order can be told apart later."""
    manager = config.pluginmanager
    distributions = sorted(
        {(dist.project_name, dist.version) for _, dist in manager.list_plugin_distinfo()}
    )
    settings: dict[str, dict[str, Any]] = {}
    for plugin, options in SETTINGS_READ.items():
        if manager.hasplugin(plugin):
            settings[plugin] = {o: _plain(config.getoption(o, None)) for o in options}
    return {
        "pytest": pytest.__version__,
        "plugins": [{"name": name, "version": version} for name, version in distributions],
        "settings": settings,
    }


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)
