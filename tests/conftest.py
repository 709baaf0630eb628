"""The harness's own tests: keeping the ``slow`` marker honest.

``tox -e fast`` (``pytest tests -m "not slow"``) is the edit-and-test loop; ``tox -e tests``
and CI run every test. A test is marked ``slow`` (``pytestmark`` for a whole module, else
``@pytest.mark.slow``) when it starts processes (isolated workers, a pytest subprocess
through ``tests.support.runner``, a browser, network namespaces, Ray) or runs a real
engine's workloads, or takes over ~1.5 s on two cores. A test that uses a slow module
fixture is slow too: left alone, it would pay for the fixture itself.

The summary names each test not marked slow that took over ``UNMARKED_LIMIT_S``, so a
new slow test shows up in the fast loop's output rather than quietly making it slower.
"""

from __future__ import annotations

import pytest

UNMARKED_LIMIT_S = 3.0
_SLOW_UNMARKED = pytest.StashKey[dict[str, float]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SLOW_UNMARKED] = {}


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    if item.get_closest_marker("slow") is not None:
        return
    took = item.config.stash[_SLOW_UNMARKED]
    took[item.nodeid] = took.get(item.nodeid, 0.0) + call.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    took = terminalreporter.config.stash[_SLOW_UNMARKED]
    over = sorted(((s, n) for n, s in took.items() if s > UNMARKED_LIMIT_S), reverse=True)
    if not over:
        return
    terminalreporter.section(f"tests not marked slow that took over {UNMARKED_LIMIT_S:g} s")
    for seconds, nodeid in over:
        terminalreporter.line(f"{seconds:6.1f} s  {nodeid}  (mark it @pytest.mark.slow?)")
