"""Every headline figure a record stores is what its stored raw samples give.

``compare`` recomputes each headline statistic (``e2e.p99``: the nearest-rank p99 of
``samples["e2e"]``) from the samples and refuses a figure they do not reproduce, so a
workload that computes a figure from other values than it stores makes the figure
untestable. ``Cell.finish`` refuses such a result while it is measured
(harness.session.cell.check_reproduced, with harness.metrics.stats.reproduces); here:
that check, the committed golden runs, and one run of every workload file.
"""

from __future__ import annotations

import math
import tarfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.metrics import stats
from harness.metrics.validity import Evidence, Policy
from harness.results import reading
from harness.results.records import CellRecord, Headline, Status
from harness.session.cell import Cell
from tests.support.imagefiles import write_small_corpus
from tests.support.runner import run_workloads

GOLDEN = Path(__file__).parent / "data" / "golden-runs.tar.xz"


def latencies(n: int, seed: int = 0) -> np.ndarray[Any, np.dtype[np.float64]]:
    """Service-time-like seconds with many digits (so rounding them matters)."""
    return np.random.default_rng(seed).lognormal(np.log(0.002), 0.5, n)


def make_cell() -> Cell:
    return Cell(
        run_id="run-1",
        cell_id="w.e",
        workload="w",
        engine="e",
        params={},
        policy=Policy(min_window_s=0.0, min_samples=1),
        environment={},
    )


def finish(
    cell: Cell,
    metrics: dict[str, Any],
    headline: Sequence[Headline],
    samples: dict[str, list[float]],
) -> None:
    cell.finish(
        metrics=metrics,
        evidence=Evidence(samples=200, failed=0, window_s=2.0),
        headline=headline,
        samples=samples,
    )


P50 = Headline(label="p50", metric="e2e.p50", unit="ms", scale=1e3)
P99 = Headline(label="p99", metric="e2e.p99", unit="ms", scale=1e3)
MEAN = Headline(label="mean", metric="e2e.mean", unit="ms", scale=1e3)


# --- stats.reproduces -------------------------------------------------------------------


def test_rounded_samples_reproduce_the_figures_computed_before_rounding():
    raw = latencies(1000)
    stored = stats.as_samples(raw)
    assert stored != raw.tolist()  # rounding changed the values
    summary = stats.summarize(raw)
    for metric, recorded in (
        ("e2e.p50", summary.percentiles["p50"]),
        ("e2e.p99", summary.percentiles["p99"]),
        ("e2e.p99.9", summary.percentiles["p99.9"]),
        ("e2e.mean", summary.mean),
    ):
        stat = stats.statistic(metric)
        assert stat is not None
        assert recorded is not None
        assert stats.reproduces(stat, stored, recorded), metric


def test_the_tolerance_is_rounding_not_a_different_figure():
    p50 = stats.Statistic("e2e", 50.0)
    values = [0.001, 0.002, 0.003]  # p50: 0.002
    assert stats.reproduces(p50, values, 0.002 + 5e-8)  # half a rounding step
    assert not stats.reproduces(p50, values, 0.002 + 2e-7)
    assert not stats.reproduces(p50, values, 0.0025)  # an interpolated median
    # large figures: relative 1e-9
    big = [1e4, 2e4, 3e4]
    assert stats.reproduces(p50, big, 2e4 * (1 + 5e-10))
    assert not stats.reproduces(p50, big, 2e4 * (1 + 5e-9))
    mean = stats.Statistic("e2e", None)
    assert stats.reproduces(mean, values, 0.002)
    assert not stats.reproduces(mean, values, 0.003)


def test_no_value_reproduces_only_no_value():
    p50, mean = stats.Statistic("x", 50.0), stats.Statistic("x", None)
    for stat in (p50, mean):
        assert stats.reproduces(stat, [], math.nan)  # nothing measured, nothing recorded
        assert not stats.reproduces(stat, [], 0.0)  # a figure from values not stored
    assert stats.reproduces(mean, [1.0, math.nan], math.nan)
    assert not stats.reproduces(mean, [1.0, math.nan], 1.0)
    assert not stats.reproduces(mean, [1.0, 2.0], math.nan)
    p99 = stats.Statistic("x", 99.0)
    with_failures = [0.001] * 99 + [math.inf, math.inf]
    assert stats.reproduces(p99, with_failures, math.inf)
    assert not stats.reproduces(p99, with_failures, 0.001)


# --- Cell.finish ------------------------------------------------------------------------


def test_the_shapes_defect_fails_the_cell_naming_both_values():
    # What workloads/test_shapes.py stored before: the first-seen figure summarized the
    # latencies of first requests of new shapes; the samples were the 0/1 flags of which
    # requests those were.
    latency = latencies(200)
    flags = np.zeros(200, dtype=bool)
    flags[::10] = True
    metrics = {
        "latency": stats.to_json(stats.summarize(latency)),
        "first_seen": stats.to_json(stats.summarize(latency[flags])),
    }
    recorded = metrics["first_seen"]["p50"]
    headline = [
        Headline(label="p50", metric="latency.p50", unit="ms", scale=1e3),
        Headline(label="first-seen p50", metric="first_seen.p50", unit="ms", scale=1e3),
    ]
    samples = {
        "latency": stats.as_samples(latency),
        "first_seen": [float(x) for x in flags],
    }
    cell = make_cell()
    with pytest.raises(ValueError, match="samples the cell stores") as err:
        finish(cell, metrics, headline, samples)
    message = str(err.value)
    assert "headline 'first-seen p50'" in message
    assert "'first_seen.p50'" in message
    assert repr(recorded) in message
    assert "give 0.0" in message  # the nearest-rank p50 of the flags (10 of 200 set)
    assert "200 values in samples['first_seen']" in message
    assert cell.result is None  # nothing kept: the record says the cell failed
    assert cell.record().status is Status.FAILED

    # the fixed workload stores the latencies the figure summarizes
    fixed = make_cell()
    finish(fixed, metrics, headline, samples | {"first_seen": stats.as_samples(latency[flags])})
    rec = fixed.record()
    assert rec.status is Status.OK
    assert rec.samples["first_seen"] == stats.as_samples(latency[flags])


def test_an_interpolated_median_and_a_mean_of_other_values_are_refused():
    latency = latencies(120)  # an even count: np.median averages two samples
    samples = {"e2e": stats.as_samples(latency)}
    median = float(np.median(latency))
    with pytest.raises(ValueError, match=r"headline 'p50' \(metrics path 'e2e.p50'\)"):
        finish(make_cell(), {"e2e": {"p50": median}}, [P50], samples)
    nearest = stats.nearest_rank(latency, 50.0)
    finish(make_cell(), {"e2e": {"p50": nearest}}, [P50], samples)

    with pytest.raises(ValueError, match="headline 'mean'"):
        finish(make_cell(), {"e2e": {"mean": float(latency[1:].mean())}}, [MEAN], samples)
    finish(make_cell(), {"e2e": {"mean": float(latency.mean())}}, [MEAN], samples)


def test_only_the_first_disagreeing_headline_needs_to_be_wrong():
    latency = latencies(200)
    metrics = {"e2e": stats.to_json(stats.summarize(latency))}
    metrics["e2e"]["p99"] = float(latency.max())  # p50 right, p99 wrong
    with pytest.raises(ValueError, match="headline 'p99'"):
        finish(make_cell(), metrics, [P50, P99], {"e2e": stats.as_samples(latency)})


def test_figures_recorded_as_not_measured_are_not_refused():
    # no samples: the summary withholds every percentile (needs_samples)
    empty = {"e2e": stats.to_json(stats.summarize([]))}
    finish(make_cell(), empty, [P50, P99], {"e2e": []})
    # 50 samples: p50 is recorded and checked, p99 withheld (it would be the max)
    few = latencies(50)
    cell = make_cell()
    finish(cell, {"e2e": stats.to_json(stats.summarize(few))}, [P50, P99], {"e2e": list(few)})
    assert cell.record().status is Status.OK
    # a figure recorded as None (no knee found) or NaN over no samples
    finish(make_cell(), {"e2e": None}, [P50], {"e2e": stats.as_samples(few)})
    finish(make_cell(), {"e2e": {"p50": math.nan}}, [P50], {"e2e": []})
    # ... but a number over no samples was computed from values the cell did not store
    with pytest.raises(ValueError, match=r"records 0.002, but the 0 values .* are empty"):
        finish(make_cell(), {"e2e": {"p50": 0.002}}, [P50], {"e2e": []})


def test_headlines_without_samples_of_their_own_are_not_checked():
    latency = latencies(200)
    metrics = {
        "reference": {"p50": 1.0},  # samples under another key: compare cannot test it
        "throughput": {"requests_per_s": 123.0},  # not a statistic of samples
    }
    headline = [
        Headline(label="ref p50", metric="reference.p50", unit="ms", scale=1e3),
        Headline(label="tput", metric="throughput.requests_per_s", unit="req/s"),
    ]
    samples = {"reference_latency": stats.as_samples(latency), "throughput": [1.0, 2.0]}
    cell = make_cell()
    finish(cell, metrics, headline, samples)
    assert cell.record().status is Status.OK


# --- the committed golden runs ----------------------------------------------------------


def _old_first_seen_flags(rec: CellRecord, stat: stats.Statistic) -> bool:
    """The shapes records in the golden runs predate the fix: their samples["first_seen"]
    are the 0/1 flags of which requests were first of their shape, not latencies. Until
    the golden runs are regenerated those figures are left out, and only those."""
    values = rec.samples.get(stat.key, [])
    return rec.workload == "shapes" and stat.key == "first_seen" and set(values) <= {0.0, 1.0}


def reproduction(
    records: Sequence[CellRecord], golden: bool = False
) -> tuple[dict[str, set[str]], list[str], set[tuple[str, str]]]:
    """(workload -> headline metrics reproduced, figures that are not, figures left out:
    with ``golden``, the first-seen figures of shapes records that predate the fix)."""
    checked: dict[str, set[str]] = defaultdict(set)
    wrong: list[str] = []
    left_out: set[tuple[str, str]] = set()
    for rec in records:
        if rec.status not in (Status.OK, Status.INVALID):
            continue
        for h in rec.headline:
            stat = stats.statistic(h.metric)
            recorded = rec.metric(h.metric)
            if stat is None or stat.key not in rec.samples or not isinstance(recorded, float):
                continue
            if golden and _old_first_seen_flags(rec, stat):
                left_out.add((rec.workload, h.metric))
                continue
            if stats.reproduces(stat, rec.samples[stat.key], recorded):
                checked[rec.workload].add(h.metric)
            else:
                again = stat.of(np.asarray(rec.samples[stat.key], dtype=np.float64))
                wrong.append(f"{rec.cell_id} {h.metric}: recorded {recorded!r}, samples {again!r}")
    return checked, wrong, left_out


def test_the_golden_runs_reproduce_their_headline_figures(tmp_path):
    with tarfile.open(GOLDEN) as tar:
        tar.extractall(tmp_path, filter="data")
    runs = sorted((tmp_path / "golden").glob("*/*"))
    assert len(runs) == 4
    records = [r for run in runs for r in reading.read_run_dir(run).records]
    checked, wrong, left_out = reproduction(records, golden=True)
    assert wrong == []
    assert left_out <= {("shapes", "first_seen.p50")}
    assert checked["batching"] == {"e2e.p50", "e2e.p99", "queue.p50"}
    assert checked["shapes"] >= {"latency.p50", "latency.p99"}
    assert checked["load_shape"] == {"e2e.p99", "lag.p99"}
    assert checked["streaming"] == {"ttft.p50", "ttft.p99", "tpot.p50", "e2e.p99"}


# --- one run of every workload file ---------------------------------------------------

# One cell per workload function of every workload file (two for shapes, whose modes
# differ in first-seen requests), at the shortest window the suite uses. Not run here:
# - the load searches (rate_sweep, capacity, generative_users_sweep, generative_capacity:
#   many points; no headline statistic of raw samples, knee.e2e_p99 is not a statistic
#   path), the soaks (12 s, fixed by the profile) and the generative shapes (20 s at
#   least): their headline statistics come from the same run.metrics and run.samples as
#   load_shape's (workloads/lib/load.py finish_soak, finish_shape);
# - continuous_batching, which finishes through streaming's workloads/lib/generative.py
#   finish (same headline, same summary), and precision_generative, which null-gen cannot
#   run (it has no precision options) and stores no samples (tests/test_vllm_precision.py);
# - streaming open loop (gen_requests at 4 req/s: 25 s); closed-1 has the same headline.
TENSOR_CELLS = " or ".join(
    (
        "rate100-dynamic",  # batching
        "tiny-encoder-dynamic",  # shapes: first-seen requests of many shapes
        "tiny-cnn-dynhw-bucketed",  # shapes: two dims
        "test_load_shape and burst",
        "tiny-cnn-int8",  # precision
        "pil-b8-t1",  # preprocessing
        "pil-b8-serial",  # preprocessing_e2e
    )
)
GENERATIVE_CELLS = "test_streaming and closed-1"

# The headline statistics each workload stores the samples of. precision, preprocessing
# and preprocessing_e2e keep theirs under other keys (reference_latency, batch_latency):
# compare cannot test those figures.
REPRODUCED = {
    "batching": {"e2e.p50", "e2e.p99", "queue.p50"},
    "shapes": {"latency.p50", "latency.p99", "first_seen.p50"},
    "load_shape": {"e2e.p99", "lag.p99"},
    "streaming": {"ttft.p50", "ttft.p99", "tpot.p50", "e2e.p99"},
}
MEASURED = {*REPRODUCED, "precision", "preprocessing", "preprocessing_e2e"}


@pytest.mark.slow  # two pytest runs of real workloads: about 26 s on two cores
def test_every_workload_stores_the_samples_of_its_headline_figures(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("PIL")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"vocab_size": 100}')
    tensor = run_workloads(
        tmp_path,
        "--engine=onnxruntime",
        "--profile=quick",
        "--window=1.2",
        "--requests=120",
        f"--images={write_small_corpus(tmp_path / 'images')}",
        "-k",
        TENSOR_CELLS,
    )
    generative = run_workloads(
        tmp_path,
        "--engine=null-gen",
        "--engine-opt=null-gen.token_time_s=0.0003",
        f"--model={model}",
        "--profile=quick",
        "--requests=100",  # the fewest with a p99
        "-k",
        GENERATIVE_CELLS,
    )
    records = [*tensor.records.values(), *generative.records.values()]
    # A headline its samples do not reproduce fails the cell in Cell.finish; every cell
    # here measured something (an invalid verdict keeps metrics and samples too).
    kept = (Status.OK, Status.INVALID, Status.SKIPPED)
    failed = {r.cell_id: r.reasons for r in records if r.status not in kept}
    assert failed == {}, tensor.stdout[-3000:] + generative.stdout[-3000:]
    measured = {r.workload for r in records if r.status in (Status.OK, Status.INVALID)}
    assert measured == MEASURED
    checked, wrong, _ = reproduction(records)
    assert wrong == []
    for workload, metrics in REPRODUCED.items():
        assert checked[workload] >= metrics, workload
    # the fixed defect: first-seen samples are latencies, one per first request of a shape
    (dynamic,) = [
        r for r in records if r.workload == "shapes" and r.params["model"] == "tiny-encoder"
    ]
    first_seen = dynamic.samples["first_seen"]
    assert len(first_seen) == dynamic.metrics["first_seen"]["count"] >= 2
    assert min(first_seen) > 0.0  # latencies, not 0/1 flags
