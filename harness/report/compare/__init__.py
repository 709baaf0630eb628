"""``python -m harness compare BASE NEW``: did a change make an engine faster or slower?

The two run directories are matched cell by cell (the cell id encodes workload, engine
and parameters), and every headline figure of a cell that is ok on both sides is compared.

Method, for a headline figure whose raw samples both records keep (``e2e.p50`` reads
``samples["e2e"]``; ``.pNN`` is the nearest-rank percentile of harness.metrics.stats, the
definition the records use, and ``.mean`` the mean):

- change: NEW / BASE - 1 of that statistic, recomputed from the samples. Samples that do
  not reproduce the recorded figure are not used: they measured something else.
- 95% confidence interval of the change: a percentile bootstrap resampling both sides
  independently, seeded by cell and metric so that the same runs always give the same
  interval. For a percentile the order statistic of a resample is drawn from its exact
  binomial law rather than by sorting every resample, so thousands of resamples of
  thousands of samples stay cheap.
  A percentile is tested only where both runs hold enough samples to bound it (its
  distribution-free interval, harness.metrics.stats.quantile_ci, stays inside the samples: p99
  needs 368): a bootstrap never draws beyond the largest sample and would understate the
  uncertainty of a tail percentile.
- p-value: for a percentile, the two-sided Mann-Whitney U test. It tests whether one
  distribution is shifted against the other, not the percentile itself; the bootstrap
  interval is what speaks for the percentile, and a percentile that moved against the
  shift the test found is not called. For a mean, Welch's t-test. The p-values are
  Holm-Bonferroni adjusted across every test of the comparison, so that an A/A
  comparison of many cells calls a change with probability at most alpha.
- significant: adjusted p < alpha, the interval excludes no change, and |change| is at
  least the threshold (5 % by default). Over thousands of samples a test detects drifts of
  1-2 % that are run-to-run noise of a shared machine (other tenants, frequency scaling,
  cache and memory placement), not an effect of the change under test; the threshold is
  the smallest change worth acting on.

Direction comes from the unit: time (ns, us, ms, s, and per-item times such as ms/img) is
better lower, rates (req/s, tok/s, img/s) better higher; other units (avg, %, x) are shown
and never tested. Figures without raw samples on both sides (throughput) are reported,
never tested.

- resolution floor: a latency change smaller than the load generator's own timing error
  (the larger generator-lag p99 of the two records, at the path each declares as its
  ``timing_floor``, harness.results.reportspec) is not called.
  The samples of one run share that run's machine state and the tests see only the spread
  within a run; two runs of the same code on a busy machine differ in how late the OS
  wakes the generator, which moves sub-millisecond latencies by more than their spread
  (seen in an A/A of the null engine here: p50 0.14 -> 0.20 ms, lag p99 1.4-2.9 ms). A
  change below the lag the run itself measured cannot be attributed to the engine; on a
  quiet machine the lag, and so the floor, is microseconds.

It fails closed (exit 2) rather than compare unlike things: a run it cannot read (a
damaged or foreign record included, unless ``--skip-damaged`` leaves it out and lists
it; its cell then has no counterpart), no shared cells, cells on one side only (unless
``--allow-missing``), environment fingerprints that differ (unless each difference is
accepted with ``--allow-env-diff``). A cell ok in BASE
that is failed, invalid, timed out or crashed in NEW is a regression (exit 1), as is a
significant change for the worse.

Modules by job: ``model`` (what a comparison says, as data), ``evidence`` (the runs read,
cells paired, figures measured from raw samples), ``verdict`` (adjusted p-values, the
calls, the comparison assembled) and ``render`` (text and JSON). The command line is in
harness.cli, the bootstrap and Holm's correction in harness.metrics.stats.
"""

from __future__ import annotations

from harness.metrics.stats import RESAMPLES, holm, statistic
from harness.report.compare.comparetext import render, to_json
from harness.report.compare.comparison import (
    DEFAULT_ALPHA,
    DEFAULT_THRESHOLD,
    EXIT_CANNOT_COMPARE,
    EXIT_OK,
    EXIT_REGRESSION,
    CellComparison,
    CompareError,
    Comparison,
    Direction,
    MetricComparison,
    Outcome,
    SkippedFile,
    direction,
)
from harness.report.compare.verdict import compare_runs

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_THRESHOLD",
    "EXIT_CANNOT_COMPARE",
    "EXIT_OK",
    "EXIT_REGRESSION",
    "RESAMPLES",
    "CellComparison",
    "CompareError",
    "Comparison",
    "Direction",
    "MetricComparison",
    "Outcome",
    "SkippedFile",
    "compare_runs",
    "direction",
    "holm",
    "render",
    "statistic",
    "to_json",
]
