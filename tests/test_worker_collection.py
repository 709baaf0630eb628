"""A worker runs exactly the cells it was given, whatever the command line looked like.

The controller starts each worker with its own options; the worker must collect the
same cells under the same node ids. These runs use the fault engines in a project laid
out like this one: ``testpaths = workloads`` beside a ``tests/`` folder that cannot even
be imported in the user's environment.
"""

from __future__ import annotations

import shutil

import pytest

from harness.results.records import Status
from tests.support.isolated import only_run_dir, records_of, run, write_project

pytestmark = pytest.mark.slow

pytest_plugins = ["pytester"]

CELLS = ("tensor.faulty.fault=none", "tensor.faulty.fault=none-again")


@pytest.fixture
def project(tmp_path):
    """A bare project: ``pytest`` alone must collect workloads/ only."""
    write_project(tmp_path, ["none", "none+again"])
    (tmp_path / "workloads").mkdir()
    shutil.move(tmp_path / "test_faults.py", tmp_path / "workloads" / "test_faults.py")
    (tmp_path / "tox.ini").write_text("[pytest]\ntestpaths = workloads\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_needs_extras.py").write_text(
        "import a_package_only_the_test_extras_install\n"
    )
    return tmp_path


def _statuses(run_dir):
    return {cell: record.status for cell, record in records_of(run_dir).items()}


@pytest.mark.parametrize("extra", [(), ("--lf", "--ff", "--lfnf", "all", "--sw")])
def test_bare_pytest_runs_every_cell_whatever_the_cache_options(project, extra):
    """Cache-driven options choose the controller's tests; a worker has no cache and must
    not be handed them (it refused to start: 'unrecognized arguments: --lf')."""
    proc = run(project, "--engine=faulty", "--window=1.5", *extra, cache=True)
    run_dir = only_run_dir(project / "results" / "runs")
    assert _statuses(run_dir) == dict.fromkeys(CELLS, Status.OK), proc.stdout[-3000:]
    assert proc.returncode == 0
    assert "test_needs_extras" not in proc.stdout


def test_a_path_option_outside_the_project_is_refused_before_anything_runs(project, tmp_path):
    """``--results-dir DIR`` (space form) is read by pytest as a test path before the
    harness's options exist: the session was rooted at DIR's ancestor and collected
    tests/ too. Now it is a usage error that gives the form pytest reads correctly."""
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    proc = run(
        project, "--engine=faulty", "--window=1.5", "--results-dir", str(elsewhere), cache=True
    )
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout[-3000:]
    assert f"write --results-dir={elsewhere}" in proc.stderr
    assert not list(elsewhere.iterdir())
    ok = run(project, "--engine=faulty", "--window=1.5", f"--results-dir={elsewhere}", cache=True)
    assert _statuses(only_run_dir(elsewhere)) == dict.fromkeys(CELLS, Status.OK)
    assert ok.returncode == 0


WORKER_ONLY_IMPORT_ERROR = """
import sys
if any(a.startswith("--harness-worker") for a in sys.argv):
    import a_module_missing_in_the_workers_environment
"""


def test_a_worker_that_cannot_collect_its_cells_puts_its_error_in_every_record(project):
    """Each record says what the worker said (the import error, its log), instead of
    'the worker failed 4 times ... see the crashed/timeout cells' with none to see."""
    source = project / "workloads" / "test_faults.py"
    source.write_text(WORKER_ONLY_IMPORT_ERROR + source.read_text())
    proc = run(project, "--engine=faulty", "--window=1.5", cache=True)
    records = records_of(only_run_dir(project / "results" / "runs"))
    assert set(records) == set(CELLS)
    for record in records.values():
        assert record.status is Status.FAILED
        (reason,) = record.reasons
        assert "the worker could not collect it" in reason
        assert "No module named 'a_module_missing_in_the_workers_environment'" in reason
        assert "logs/attempt1-worker1-faulty.log" in reason
    assert "over the restart cap" not in proc.stdout
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED


PROCESS_DEPENDENT_IDS = """
import os
import pytest

@pytest.mark.requires(family="tensor")
@pytest.mark.parametrize("stamp", [os.getpid()])
def test_unstable(cell, stamp):
    cell.finish(metrics={}, evidence=None, headline=[])
"""


def test_a_cell_whose_node_id_differs_in_the_worker_says_so(project):
    (project / "workloads" / "test_unstable.py").write_text(PROCESS_DEPENDENT_IDS)
    proc = run(project, "--engine=faulty", "--window=1.5", cache=True)
    records = records_of(only_run_dir(project / "results" / "runs"))
    (unstable,) = [r for c, r in records.items() if c.startswith("unstable.")]
    assert unstable.status is Status.FAILED
    assert "the worker collected no test with this node id" in unstable.reasons[0]
    assert all(records[c].status is Status.OK for c in CELLS), proc.stdout[-3000:]
