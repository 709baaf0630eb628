"""The harness's own tests: keeping the ``slow`` marker honest.

``tox -e fast`` (``pytest tests -m "not slow"``) is the edit-and-test loop; ``tox -e tests``
and CI run every test. A test is marked ``slow`` (``pytestmark`` for a whole module, else
``@pytest.mark.slow``) when it starts processes (isolated workers, a pytest subprocess
through ``tests.support.runner``, a browser, network namespaces, Ray) or runs a real
engine's workloads, or takes over ~1.5 s on two cores. A test that uses a slow module
fixture is slow too: left alone, it would pay for the fixture itself.

The summary names each test not marked slow that took over ``UNMARKED_LIMIT_S``, so a
new slow test shows up in the fast loop's output rather than quietly making it slower.
It reads the reports, which reach pytest-xdist's controller too (``tox -e tests`` runs
the tests on two xdist workers).

Tests start pytest sessions of their own (pytester, ``pytest workloads`` subprocesses).
In an xdist worker they would inherit its ``PYTEST_XDIST_WORKER`` and look like xdist
workers themselves: pytest-benchmark then saves no JSON. The variables are dropped at
the start of the worker, which xdist itself no longer reads by then.

A module-scoped fixture (a whole pytest run whose records a module's tests check) runs
once per xdist worker that gets one of its tests. Those tests carry an ``xdist_group`` of
the module and fixture, and ``tox -e tests`` distributes with ``--dist loadgroup``, so
each such run happens once: on two workers, they ran twice (tests/test_isolation.py's
faults run, tests/test_workloads_onnxruntime.py's run, 30-50 s each).
"""

from __future__ import annotations

import os

import pytest

UNMARKED_LIMIT_S = 3.0
# shared checks that tests call keep pytest's assertion messages
pytest.register_assert_rewrite("tests.support.llmrequests")

XDIST_VARIABLES = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


class UnmarkedSlow:
    """Seconds per test not marked slow (setup, call and teardown), from the reports."""

    def __init__(self) -> None:
        self.took: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "slow" not in report.keywords:
            self.took[report.nodeid] = self.took.get(report.nodeid, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        over = sorted(((s, n) for n, s in self.took.items() if s > UNMARKED_LIMIT_S), reverse=True)
        if not over:
            return
        terminalreporter.section(f"tests not marked slow that took over {UNMARKED_LIMIT_S:g} s")
        for seconds, nodeid in over:
            terminalreporter.line(f"{seconds:6.1f} s  {nodeid}  (mark it @pytest.mark.slow?)")


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist declares it where it is installed; the tests run without it too
    config.addinivalue_line("markers", "xdist_group(name): run these tests on one worker")
    for name in XDIST_VARIABLES:
        os.environ.pop(name, None)
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) sums
        config.pluginmanager.register(UnmarkedSlow(), "unmarked-slow")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        shared = module_fixture(item)
        if shared is not None:
            item.add_marker(pytest.mark.xdist_group(shared))


def module_fixture(item: pytest.Item) -> str | None:
    """``module::fixture`` of the first module-scoped fixture that ``item``'s own module
    defines and ``item`` uses; None if it uses none."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    module = item.nodeid.split("::", 1)[0]
    names = sorted(
        name
        for name, defs in info.name2fixturedefs.items()
        if defs and defs[-1].scope == "module" and defs[-1].baseid == module
    )
    return f"{module}::{names[0]}" if names else None
