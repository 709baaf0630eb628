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
    for name in XDIST_VARIABLES:
        os.environ.pop(name, None)
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) sums
        config.pluginmanager.register(UnmarkedSlow(), "unmarked-slow")
