"""What a recommendation says, as data: the SLO checks, candidates, verdicts per engine
and per question (frozen dataclasses that check their own consistency), the exit
status they imply, and the number formats they are written with."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from harness.exceptions import HarnessError
from harness.metrics.stats import percentile_key
from harness.report import pareto
from harness.report.matrix import fmt_number
from harness.results.reading import Damaged
from harness.results.records import ParamValue, Status, format_param

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NO_RECOMMENDATION = 3

Method = Literal["samples", "percentiles", "load points", "no SLO"]

METHODS: dict[str, str] = {
    "samples": "goodput recounted from per-request samples: requests within every SLO / window",
    "percentiles": "SLO judged on error-adjusted percentiles; a cell that meets it is"
    " credited its throughput (no aligned per-request samples to recount goodput)",
    "load points": "the load point with the highest throughput among those meeting the SLO"
    " (error-adjusted percentiles per point)",
    "no SLO": "throughput (no SLO applies to this workload)",
}

Params = tuple[tuple[str, ParamValue], ...]

IF_SET = {"json": "if set"}
"""Field metadata: written to JSON only when not None, so output without the option that
sets it (``--energy-price``) stays what it was."""


def param_text(params: Params) -> str:
    return " ".join(f"{k}={format_param(v, none='none')}" for k, v in params)


class RecommendError(HarnessError, ValueError):
    """Input that cannot be recommended from (the message says what to do)."""


def pct(x: float) -> str:
    """A fraction as a percentage: three significant figures, no exponent."""
    value = x * 100
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def positive(x: float) -> bool:
    """A price the command accepts: a positive finite number."""
    return x > 0 and math.isfinite(x)


def lower(a: float, b: float) -> str:
    return pct(1 - a / b) if b > 0 else "0"


def duration(seconds: float) -> str:
    return f"{fmt_number(seconds)} s" if seconds >= 10 else f"{fmt_number(seconds * 1e3)} ms"


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Check:
    """One SLO judged on one candidate: ``value_s`` None when the cell could not say."""

    slo: str
    metric: str
    percentile: float
    threshold_s: float
    value_s: float | None
    absent: str | None = None
    """Why there is no value (too few requests for the percentile, metric not recorded)."""

    def __post_init__(self) -> None:
        if not (self.threshold_s > 0 and math.isfinite(self.threshold_s)):
            raise ValueError("an SLO threshold is a positive duration")
        if (self.value_s is None) != (self.absent is not None):
            raise ValueError("a check has a value or says why it has none")
        if self.value_s is not None and (math.isnan(self.value_s) or self.value_s < 0):
            raise ValueError(f"{self.slo}: a latency is >= 0, got {self.value_s}")

    @property
    def met(self) -> bool:
        return self.value_s is not None and self.value_s <= self.threshold_s

    def text(self) -> str:
        """``e2e p99 61.2 ms > 50 ms (+22.4 %)``, or why there is no value."""
        name = f"{self.metric} {percentile_key(self.percentile)}"
        limit = duration(self.threshold_s)
        if self.value_s is None:
            return f"{name} {self.absent} (SLO {limit})"
        if math.isinf(self.value_s):
            return f"{name} inf > {limit} (failed requests count as infinite latency)"
        value = duration(self.value_s)
        if self.met:
            return f"{name} {value} <= {limit}"
        return f"{name} {value} > {limit} (+{pct(self.value_s / self.threshold_s - 1)} %)"


@dataclass(frozen=True)
class Cost:
    """What serving ``per`` costs on this machine at the candidate's rate: machine time at
    ``--gpu-hour-cost`` and, where included, GPU energy at ``--energy-price``."""

    amount: float
    per: str
    energy: float | None = field(default=None, metadata=IF_SET)
    """The part of ``amount`` that is GPU energy; None: energy is not included."""

    def __post_init__(self) -> None:
        if not (self.amount >= 0 and math.isfinite(self.amount)):
            raise ValueError("a cost is a finite amount >= 0")
        if self.energy is not None and not 0 <= self.energy <= self.amount * (1 + 1e-9):
            raise ValueError("the energy part of a cost is >= 0 and at most the cost")


@dataclass(frozen=True)
class Candidate:
    """A valid cell (for sweeps: its best load point) judged against the SLO.

    ``goodput`` is the ranking figure in ``unit`` (None when it is unknown because the
    cell misses the SLO and has no samples to recount it); ``throughput`` counts every
    completed request. ``blocker``: why the cell cannot be recommended whatever its
    numbers say (saturated, no valid load point).
    """

    run_id: str
    cell_id: str
    engine: str
    params: Params
    load: float | None
    load_unit: str | None
    checks: tuple[Check, ...]
    method: Method
    goodput: float | None
    throughput: float
    unit: str
    counts: str
    output_tokens_per_s: float | None = None
    goodput_ci95: tuple[float | None, float | None] | None = None
    """95 % interval of ``goodput`` where the record allows one (a bound None: unbounded)."""
    blocker: str | None = None
    warnings: tuple[str, ...] = ()
    cost: Cost | None = None
    variant: str | None = None
    """A second configuration measured inside the cell (a precision cell's reference)."""
    mean_power_w: float | None = field(default=None, metadata=IF_SET)
    """The GPUs' mean power over the window its rates were measured in (the record's
    ``metrics.energy``); None: ``energy_absent`` says why there is none (both None when
    energy is not priced)."""
    energy_absent: str | None = field(default=None, metadata=IF_SET)
    ttft_p99_s: float | None = None
    """p99 TTFT of its completed requests (a load search: of the chosen point); None
    where the record has none (a tensor cell, too few requests for a p99)."""
    e2e_p99_s: float | None = None
    """p99 end-to-end latency of its completed requests, as ``ttft_p99_s``."""
    pareto: tuple[str, ...] = ()
    """The fronts of its question (``ttft``, ``e2e``: goodput, or throughput without an
    SLO, against that p99) on which it is Pareto-optimal (harness.report.pareto)."""
    pareto_absent: str | None = None
    """Why it is not a point of every front of its question (no goodput figure, a
    blocker, no p99 of that latency); None when it is a point of each."""
    goodput_step: float | None = field(default=None, metadata=IF_SET)
    """One request (item) over the window its rates were counted in: rates closer than
    this differ by less than one request; None where the record does not say."""
    goodput_tie: bool | None = field(default=None, metadata=IF_SET)
    """For a configuration meeting the SLO, ranked by goodput or machine-time cost:
    whether its goodput is within one request over the window of the highest goodput
    (a tie: the lower p99 latency leads among them); None where that is not judged
    (energy-priced, no window, misses the SLO)."""
    scenario_keys: tuple[str, ...] = field(default=(), metadata={"json": False})
    """The parameters that pose the question (the workload's declared scenario): not
    part of the configuration. Not written to JSON: the question's scenario is."""
    engine_options: tuple[tuple[str, str], ...] | None = field(default=None, metadata=IF_SET)
    """The ``--engine-opt`` values its run fixed for its engine (None: none), part of its
    configuration: two runs with other options measured other configurations."""
    configuration_rank: int | None = None
    """The place of its configuration in its question (1: the recommended one, where
    one is): the same configuration measured in several runs (or repeats) is one
    candidate with several measurements, each of them holding the same rank; None
    before the question is ranked."""

    def __post_init__(self) -> None:
        if self.throughput < 0 or (self.goodput is not None and self.goodput < 0):
            raise ValueError("rates are >= 0")
        if self.goodput is not None and self.goodput > self.throughput * (1 + 1e-9):
            raise ValueError("goodput counts a subset of the completed requests")
        if (self.load is None) != (self.load_unit is None):
            raise ValueError("a load comes with its unit")
        if self.method == "no SLO" and self.checks:
            raise ValueError("a candidate ranked without SLO has no checks")
        if self.mean_power_w is not None and not (
            self.mean_power_w >= 0 and math.isfinite(self.mean_power_w)
        ):
            raise ValueError("a mean power is a finite number of watts >= 0")
        if self.goodput_step is not None and not (self.goodput_step > 0):
            raise ValueError("a goodput step is one request over a window: > 0")
        if self.goodput_tie is not None and not self.meets:
            raise ValueError("only a configuration meeting the SLO ties on goodput")
        self._check_pareto()

    def _check_pareto(self) -> None:
        for metric in pareto.METRICS:
            value = self.latency(metric)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"a {metric} p99 is a finite number of seconds >= 0")
        if len(set(self.pareto)) != len(self.pareto) or not set(self.pareto) <= set(pareto.METRICS):
            raise ValueError(f"Pareto fronts are some of {', '.join(pareto.METRICS)}, once each")
        if self.pareto and (self.pareto_rate is None or self.blocker is not None):
            raise ValueError("a Pareto-optimal configuration has a rate and no blocker")
        if any(self.latency(m) is None for m in self.pareto):
            raise ValueError("a Pareto-optimal configuration has that front's latency")

    def latency(self, metric: str) -> float | None:
        """Its p99 of ``metric`` (``ttft`` or ``e2e``), None where it has none."""
        return {"ttft": self.ttft_p99_s, "e2e": self.e2e_p99_s}[metric]

    @property
    def pareto_rate(self) -> float | None:
        """The rate its Pareto points stand at: the goodput it is ranked by (without an
        SLO, its throughput); None when that is unknown."""
        return self.goodput

    @property
    def meets(self) -> bool:
        checks_ok = all(c.met for c in self.checks)
        return self.blocker is None and checks_ok and self.goodput is not None

    @property
    def missed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.met)

    @property
    def chosen(self) -> Params:
        """Its parameters less those that pose the question: what was chosen."""
        return tuple((k, v) for k, v in self.params if k not in self.scenario_keys)

    @property
    def identity(self) -> tuple[object, ...]:
        """What makes it one configuration, whichever run measured it: the engine, the
        chosen parameters, the path measured and the engine options (a load search's
        load is a result)."""
        return (self.engine, self.chosen, self.variant, self.engine_options)

    def configuration(self) -> str:
        """``mode=dynamic batch=8``, a search's ``at load 1000 req/s``; the second path a
        cell measured is named by what it measured: ``fp32 reference path (measured in
        the precision=int8 cell)``."""
        chosen = param_text(self.chosen)
        if self.variant is not None:
            # a label written as "its fp32 reference path" (the records say so) reads
            # as the thing measured once the cell it belongs to follows it
            path = self.variant.removeprefix("its ")
            return f"{path} (measured in the {chosen} cell)" if chosen else path
        parts = [chosen] if chosen else []
        if self.load is not None and self.load_unit is not None:
            parts.append(f"at load {fmt_number(self.load)} {self.load_unit}")
        return " ".join(parts) or "(no parameters)"

    def options_text(self) -> str:
        """``--engine-opt k=v ...`` of its run (empty: none): said where two
        configurations would otherwise read alike."""
        return " ".join(f"--engine-opt {k}={v}" for k, v in self.engine_options or ())


@dataclass(frozen=True)
class NotConsidered:
    """A planned cell that cannot be a candidate, with its status and why."""

    run_id: str
    cell_id: str
    engine: str
    params: Params
    status: str
    reasons: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.reasons:
            raise ValueError("a cell left out says why")


@dataclass(frozen=True)
class EngineVerdict:
    """One engine's best configuration and how it fared against the recommendation."""

    engine: str
    best: Candidate | None
    verdict: str


@dataclass(frozen=True)
class WorkloadAdvice:
    """The verdict for one question: a workload, on one machine, for one scenario (the
    model and the offered load or traffic shape, which are given, not chosen)."""

    workload: str
    hardware: str
    scenario: Params
    slos_applied: tuple[str, ...]
    slos_not_applicable: tuple[str, ...]
    ranked_by: str
    recommended: Candidate | None
    runner_up: Candidate | None
    engines: tuple[EngineVerdict, ...]
    candidates: tuple[Candidate, ...]
    """Those meeting the SLO, best first, then the others, closest to meeting it first."""
    not_considered: tuple[NotConsidered, ...]
    energy_note: str | None = field(default=None, metadata=IF_SET)
    """With ``--energy-price``: why GPU energy is not in this question's costs (None: it
    is, or no configuration was priced)."""
    fronts: tuple[str, ...] = ()
    """The Pareto fronts drawn for this question: the latencies (``ttft``, ``e2e``) some
    configuration that could be recommended has a p99 of."""

    def __post_init__(self) -> None:
        if self.recommended is not None and (
            not self.recommended.meets or self.recommended != self.candidates[0]
        ):
            raise ValueError("the recommendation is the best candidate meeting the SLO")
        if self.runner_up is not None and (self.recommended is None or not self.runner_up.meets):
            raise ValueError("a runner-up meets the SLO and comes after a recommendation")
        r, u = self.recommended, self.runner_up
        if u is not None and r is not None and u.identity == r.identity:
            raise ValueError("a runner-up is another configuration, not a repeat of it")
        if any(not set(c.pareto) <= set(self.fronts) for c in self.candidates):
            raise ValueError("a candidate is Pareto-optimal only on its question's fronts")

    @property
    def title(self) -> str:
        return " ".join([self.workload, param_text(self.scenario)]).strip()

    @property
    def measured(self) -> bool:
        """Some cell ran (not every one was skipped): a recommendation is expected."""
        return bool(self.candidates) or any(
            n.status != Status.SKIPPED.value for n in self.not_considered
        )


@dataclass(frozen=True)
class RunInfo:
    path: str
    run_id: str
    state: str
    """As readers show it: "interrupted: ..." for a running manifest nobody writes."""


@dataclass(frozen=True)
class Recommendation:
    slos: tuple[str, ...]
    gpu_hour_cost: float | None
    runs: tuple[RunInfo, ...]
    hardware: tuple[str, ...]
    workloads: tuple[WorkloadAdvice, ...]
    skipped: tuple[Damaged, ...] = ()
    """Damaged files left out (``--skip-damaged``)."""
    energy_price: float | None = field(default=None, metadata=IF_SET)
    """``--energy-price``: the price of one kWh (None: energy is not priced)."""

    def __post_init__(self) -> None:
        if self.gpu_hour_cost is not None and not positive(self.gpu_hour_cost):
            raise ValueError("the machine's hourly cost is a positive number")
        if self.energy_price is not None and not positive(self.energy_price):
            raise ValueError("the price of a kWh is a positive number")

    @property
    def exit_code(self) -> int:
        missing = [w for w in self.workloads if w.measured and w.recommended is None]
        if missing or not any(w.recommended for w in self.workloads):
            return EXIT_NO_RECOMMENDATION
        return EXIT_OK


def figure_name(c: Candidate) -> str:
    return "throughput" if c.method == "no SLO" else "goodput"
