"""``python -m harness recommend``: which engine and configuration to run, under an SLO.

A recommendation answers one question at a time: a workload, on one machine (cells
measured on different hardware are never mixed), for one scenario (the model, the
offered load or traffic shape: the parameters the workload declares as its
``scenario``, given rather than chosen). Its
answer is the valid configuration with the highest goodput that meets every SLO that
applies, or with ``--gpu-hour-cost`` the lowest cost per million output tokens
(generative) or per thousand requests / images / items (tensor), which on one machine
is the same order as throughput. ``--energy-price`` (per kWh) adds the GPU energy each
configuration used (the record's ``metrics.energy``, from NVML) to that cost and ranks
by the sum; where a configuration meeting the SLO has no energy figure, no cost of the
question includes energy and the output says why. It names the runner-up (the next
configuration in that ranking, any engine), the best configuration of every engine, and
why each other engine lost: the SLO it missed and by how much, or how much lower its
goodput was.

Rules the numbers follow (docs/methodology.md: metric definitions, validity). What is
workload-specific comes from what each workload declared in its records
(harness.results.reportspec: its throughput, scenario, load search, contenders):

* Only cells with status ok (verdict valid) are candidates. Invalid, failed, timed-out,
  crashed, skipped and missing cells are listed with their reasons, never recommended.
* An SLO applies to a cell that declares its latency (``ReportSpec.latencies``: tensor
  cells that serve requests ``e2e``, generative cells ``ttft``/``tpot``/``e2e``/``itl``,
  a workload's own) and measured it; cells with none are ranked by their declared
  throughput, "no SLO applied". An SLO naming a latency no cell of the runs declares is
  bad input; without SLOs every question is ranked by throughput.
* A cell meets an SLO when the error-adjusted percentile (a failed request counts as
  infinite latency) is within the threshold; a percentile the cell could not report
  (too few requests) does not meet it.
* Goodput is requests that met every SLO / window. It is recounted from the record's
  per-request samples where each latency declares them and they are aligned per request
  (``e2e``, ``ttft``, and ``tpot`` when every request has one), the throughput declares
  its count of completed requests, and the record's window is the one its rates were
  computed over; otherwise a cell that meets the SLO is credited its throughput.
* A declared load search (a sweep, a capacity search) holds several load points: the
  candidate is the point with the highest throughput that meets the SLO, and its load
  is part of the configuration. A saturated point or cell (completing clearly less than
  it was offered) is not an operating point: its latency grows with the window.
* A cell that measures two configurations side by side (a reduced precision and its
  fp32 reference): both are candidates, so a slower reduced precision is not
  recommended over its reference.
* What competes is the engine, and the values of the parameters the workload declares
  as contenders (a preprocessing library: ``engine/backend``).
* A configuration (engine, chosen parameters, path measured) that several runs measured
  is one candidate with several measurements: placed where its best one ranks, the
  others shown beside it, never ranked against itself; the runner-up is the best other
  configuration.
* Equal goodputs (or costs) are common: an open loop offers every configuration the
  same requests. The lower p99 TTFT, then E2E, wins the tie.
* Each question has Pareto fronts (harness.report.pareto) of goodput (throughput
  without an SLO) against p99 TTFT and against p99 E2E latency: a configuration no other
  beats on both is marked ``[Pareto: TTFT, E2E]``. One without a goodput figure, or
  blocked (saturated), or without that p99, is on no front, and the output says why.

Exit status: ``EXIT_OK`` (0) when every measured workload got a recommendation,
``EXIT_NO_RECOMMENDATION`` (3) when some question with cells that ran (not only skipped
ones) has no cell meeting the SLO, or nothing at all could be recommended, and
``EXIT_USAGE`` (2) for bad input: an unreadable run directory or a damaged or foreign
record in one (unless ``--skip-damaged`` leaves those out and lists them), a bad
``--slo``, cost or energy price, an unwritable ``--json`` path.

The text leads with the decisions (one line per question), then what has no answer
(no valid cell: one line per workload, each cause once), then each answered question's
details. Modules by job: ``model`` (what a recommendation says, as data), ``evidence``
(the records read and each cell judged against the SLO), ``ranking`` (the questions, the
figure each is ranked by, the verdicts, the Pareto fronts) and ``render`` (text and
JSON). The command line is in harness.cli; the HTML report's Decision
(harness.report.decision) lays the same answer out.
"""

from __future__ import annotations

from harness.report.recommend.ranking import Prices, recommend, recommend_cells
from harness.report.recommend.recommendtext import render, to_json
from harness.report.recommend.verdicts import (
    EXIT_NO_RECOMMENDATION,
    EXIT_OK,
    EXIT_USAGE,
    METHODS,
    Candidate,
    Check,
    Cost,
    EngineVerdict,
    Method,
    NotConsidered,
    Recommendation,
    RecommendError,
    RunInfo,
    WorkloadAdvice,
)

__all__ = [
    "EXIT_NO_RECOMMENDATION",
    "EXIT_OK",
    "EXIT_USAGE",
    "METHODS",
    "Candidate",
    "Check",
    "Cost",
    "EngineVerdict",
    "Method",
    "NotConsidered",
    "Prices",
    "RecommendError",
    "Recommendation",
    "RunInfo",
    "WorkloadAdvice",
    "recommend",
    "recommend_cells",
    "render",
    "to_json",
]
