"""The order cells run in: by engine and configuration, then cells that set the engine
alike together (``@pytest.mark.engine_setting``), else in collection order."""

from harness.engine import registry
from harness.results import store
from tests.support.fakes import FakeTensorEngine

pytest_plugins = ["pytester"]

CELLS = """
from pathlib import Path
import pytest
from harness.results.records import Headline
from harness.metrics.validity import Evidence


def measure(cell, open_engine, options):
    open_engine(Path("model"), options=options, shared=True)
    cell.finish(
        metrics={"x": {"p50": 0.001}},
        evidence=Evidence(samples=100, failed=0, window_s=2.0),
        headline=[Headline(label="p50", metric="x.p50", unit="ms", scale=1e3)],
    )


@pytest.mark.requires(family="tensor")
def test_plain(cell, open_engine):
    measure(cell, open_engine, {})


@pytest.mark.requires(family="tensor")
@pytest.mark.engine_setting("fail")
@pytest.mark.parametrize("fail", ["no", "never"])
def test_first(cell, open_engine, fail):
    measure(cell, open_engine, {"fail": fail})


@pytest.mark.requires(family="tensor")
@pytest.mark.engine_setting("fail")
@pytest.mark.parametrize("size", [1, 2])
@pytest.mark.parametrize("fail", ["no", "never"])
def test_second(cell, open_engine, fail, size):
    measure(cell, open_engine, {"fail": fail})


@pytest.mark.requires(family="tensor")
def test_plain_again(cell, open_engine):
    measure(cell, open_engine, {})
"""


def test_cells_that_set_the_engine_alike_run_together_and_share_one_engine(pytester):
    pytester.makepyfile(test_wl=CELLS)
    results = pytester.path / "runs"
    with registry.registered("fake-tensor", FakeTensorEngine):
        result = pytester.runpytest(
            "--engine=fake-tensor", f"--results-dir={results}", "--isolation=none"
        )
    result.assert_outcomes(passed=8)
    (run_dir,) = list(results.iterdir())
    planned = [c.cell_id for c in store.read_manifest(run_dir).planned]
    assert planned == [
        "plain.fake-tensor",
        "first.fake-tensor.fail=no",
        "second.fake-tensor.fail=no.size=1",
        "second.fake-tensor.fail=no.size=2",
        "first.fake-tensor.fail=never",
        "second.fake-tensor.fail=never.size=1",
        "second.fake-tensor.fail=never.size=2",
        "plain_again.fake-tensor",  # a cell that sets nothing keeps its place
    ]
    records = sorted(store.read_records(run_dir), key=lambda r: r.started_at)
    assert [r.cell_id for r in records] == planned
    started = [r.cell_id for r in records if r.engine_info["start"]["in_this_cell"]]
    # one engine per setting: none, fail=no, fail=never, none again (collection order: six)
    assert started == [planned[0], planned[1], planned[4], planned[7]]
