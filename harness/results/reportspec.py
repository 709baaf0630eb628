"""What a workload declares for its reports: the contract between a workload and
``report``, ``compare``, ``recommend`` and the plots.

A workload measures; the reporting commands read its records, and never import it. So
what they need to know about a workload beyond its headline figures travels in every
record it writes (``CellRecord.report_spec``, and the planned cell's in the manifest, for
a cell that never wrote one): where its throughput is and what one unit counts, which
parameters pose the question rather than answer it, where the load generator's own
timing error is, and which plots draw it. A workload declares it once, beside its test,
with ``@pytest.mark.report_spec(ReportSpec(...))`` (docs/writing-a-workload.md).

Paths are dotted paths into the record's ``metrics`` (``throughput.requests_per_s``).
``Cell.finish`` checks that each path the cell declares resolves (``check_path``): a typo
fails the cell naming the path, instead of an empty matrix entry or a cell that
``recommend`` silently cannot rank.

Records written before workloads declared anything (and records of a workload that
declares nothing) carry no spec: readers infer the one the reports assumed then
(``harness.results.legacyspec``), so old runs report byte for byte as they did.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from harness.metrics.slo import check_name
from harness.results.frozen import Frozen


class Rate(Frozen):
    """A throughput figure: ``metric`` in ``unit``, one unit counting ``counts``."""

    metric: str
    unit: str
    counts: str
    """What one unit counts, plural ("requests", "images"): costs are per 1k of them."""
    ci: str | None = None
    """Path to its 95 % interval, a ``[low, high]`` pair."""
    completed: str | None = None
    """Path to the number of units completed over the record's ``window.duration_s``:
    with it, and per-request samples of an SLO's metric, ``recommend`` recounts goodput
    (requests within every SLO / window) instead of judging percentiles."""


class Latency(Frozen):
    """A latency the workload measures, which ``--slo NAME_pNN=DURATION`` may name.

    ``name`` is the key of its summary in the metrics (``stats.to_json`` of seconds; with a
    ``search``, in the settled point's ``full`` metrics): a cell is judged on its
    error-adjusted percentile. ``samples``: the key of its raw values in the record's
    samples where there is one per completed request, in request order; with the
    throughput's ``completed``, ``recommend`` then recounts goodput request by request
    (it checks the count), else it judges the percentile."""

    name: str
    samples: str | None = None
    unit: Literal["s"] = "s"
    """Seconds: SLO thresholds are durations (the reports show them in ms)."""

    _name = field_validator("name")(check_name)


class Paired(Frozen):
    """A cell measuring two configurations side by side (a reduced precision and its
    reference): ``recommend`` ranks both, without SLO, the reference as
    ``reference_label``: what that path measured ("fp32 reference path"; a leading
    "its", as records have it, is dropped), shown as measured in the cell's own
    configuration ("... (measured in the precision=int8 cell)")."""

    own: Rate
    reference: Rate
    reference_label: str


class LoadSearch(Frozen):
    """Load points of a sweep or capacity search (``harness.load.capacity``'s points at
    ``points``), and the one the search settled on: ``settled`` holds its ``load`` and
    ``unit``, ``full`` its complete metrics. ``recommend`` picks the best point meeting
    the SLO; the plots draw the curve."""

    points: str
    settled: str
    full: str
    objective: str | None = None
    """Path to the SLO text the search held to (``e2e_p99=10ms``), drawn as a line."""


class LoadCurvePlot(Frozen):
    """p99 latency against achieved throughput along the ``search``'s points, the
    settled point starred, one plot per workload."""

    kind: Literal["load_curve"] = "load_curve"


class PolicyCurvePlot(Frozen):
    """p99 latency against achieved throughput across cells: one line per configuration
    (every parameter but ``over``), one point per value of ``over``."""

    kind: Literal["policy_curve"] = "policy_curve"
    over: str
    per: str
    """What one line is, for the title ("policy": "... per policy")."""
    caption: str
    throughput: str = "throughput.requests_per_s"
    latency: str = "e2e.p99"


class CdfPlot(Frozen):
    """Empirical CDF of the raw samples ``samples``, one line per cell, per workload."""

    kind: Literal["cdf"] = "cdf"
    samples: str
    what: str
    """Its name in titles and section headings ("E2E latency")."""


class HistogramPlot(Frozen):
    """Shares of each value of the record's histogram ``histogram``, one bar per cell;
    every cell declaring the same ``name`` shares the plot."""

    kind: Literal["histogram"] = "histogram"
    histogram: str
    name: str
    section: str
    title: str
    caption: str
    xlabel: str
    ylabel: str


class StagesPlot(Frozen):
    """Stacked time per stage: ``metric`` maps each stage to a dict whose ``per`` value
    (seconds, times ``scale``) is drawn; every cell declaring the same ``name`` shares
    the plot."""

    kind: Literal["stages"] = "stages"
    metric: str
    per: str
    name: str
    section: str
    title: str
    caption: str
    xlabel: str
    scale: float = 1.0


class TrafficPlot(Frozen):
    """Histograms of the traffic a generative cell carried, from its raw per-request
    ``samples``: input tokens, output tokens with the ``max_tokens`` each request asked
    for beside them (replies that ended before the cap show), and the seconds between
    scheduled arrivals (an open loop's only). One figure per cell, in the section after
    the latency CDFs; a key the record lacks is left out with a note, and a cell with none
    of them has no figure (records written before the keys existed)."""

    kind: Literal["traffic"] = "traffic"
    input_tokens: str = "input_tokens"
    """Samples key: each successful request's input tokens as sent."""
    output_tokens: str = "output_tokens"
    """Samples key: each successful request's output tokens received."""
    asked_tokens: str = "asked_tokens"
    """Samples key: the ``max_tokens`` each request asked for."""
    interarrival: str = "interarrival"
    """Samples key: seconds between consecutive scheduled arrivals (absent: closed loop)."""


PlotSpec = Annotated[
    LoadCurvePlot | PolicyCurvePlot | CdfPlot | HistogramPlot | StagesPlot | TrafficPlot,
    Field(discriminator="kind"),
]


class ReportSpec(Frozen):
    """What the reports need to know about a workload beyond its headline figures (which
    ``Cell.finish`` takes, since they may depend on the cell)."""

    throughput: Rate | None = None
    """What ``recommend`` ranks a cell by (None: it cannot rank the workload's cells)."""
    tokens: str | None = None
    """Path to output tokens/s, where a cell has them (with a ``search``: in the settled
    point's ``full`` metrics): ``--gpu-hour-cost`` then ranks by cost per 1M tokens."""
    paired: Paired | None = None
    search: LoadSearch | None = None
    scenario: tuple[str, ...] = ()
    """Parameters that pose the question rather than answer it (the offered load, the
    traffic shape, the model): cells are compared only with cells of the same values."""
    contender: tuple[str, ...] = ()
    """Parameters that name what competes besides the engine (a preprocessing library):
    ``recommend`` shows and judges ``engine/value``."""
    answer_checks: tuple[str, ...] = ()
    """Prefixes of this workload's validity warnings that say a faster path changed the
    model's answers beyond tolerance: such a cell is never recommended."""
    timing_floor: str | None = None
    """Path to the load generator's own timing error (its lag p99, seconds): ``compare``
    does not call a latency change smaller than it."""
    plots: tuple[PlotSpec, ...] = ()
    latencies: tuple[Latency, ...] | None = None
    """The latencies SLOs may name (harness.metrics.slo). None: the workload declares none,
    so ``--slo`` in a run names none of its cells' metrics; a record written before the
    field existed reads as holding those of ttft, tpot, e2e and itl its metrics have."""

    @model_validator(mode="after")
    def _consistent(self) -> ReportSpec:
        kinds = [p.kind for p in self.plots]
        if "load_curve" in kinds and self.search is None:
            raise ValueError("a load_curve plot draws the search's points: declare a search")
        for what, path in self.paths():
            if not path or any(not part for part in path.split(".")):
                raise ValueError(f"{what}: {path!r} is not a dotted metrics path")
        names = self.latency_names()
        if len(set(names)) != len(names):
            raise ValueError(f"latencies: each name once, got {', '.join(names)}")
        return self

    def latency_names(self) -> tuple[str, ...]:
        """The names of the declared latencies (none declared: none)."""
        return tuple(latency.name for latency in self.latencies or ())

    def paths(self) -> Iterator[tuple[str, str]]:
        """(what, path) of every metrics path declared, for ``check_path``."""
        rates = [("throughput", self.throughput)]
        if self.paired is not None:
            rates += [("paired.own", self.paired.own), ("paired.reference", self.paired.reference)]
        for what, rate in rates:
            if rate is not None:
                yield f"{what}.metric", rate.metric
                if rate.ci is not None:
                    yield f"{what}.ci", rate.ci
                if rate.completed is not None:
                    yield f"{what}.completed", rate.completed
        if self.timing_floor is not None:
            yield "timing_floor", self.timing_floor
        if self.search is None:
            if self.tokens is not None:
                yield "tokens", self.tokens
            for name in self.latency_names():
                yield f"latency {name!r}", name
        else:  # tokens and latencies are then in the settled point's metrics, absent when
            # it found none
            yield "search.points", self.search.points
            yield "search.settled", self.search.settled


# -- does a path resolve? ----------------------------------------------------------------


def check_path(metrics: Mapping[str, Any], path: str, what: str) -> None:
    """Raise ValueError, naming ``path`` and the keys that are there, unless ``path``
    resolves in ``metrics``.

    A path resolves when each of its parts names a key, or when it stops early at a
    figure the cell recorded as not measured: a ``None`` (no knee found), a dict saying
    why it is ``absent``, or a percentile its summary had too few samples for (listed
    under ``needs_samples``, harness.metrics.stats.to_json, also for its ``ci95``).
    """
    why = _unresolved(metrics, path)
    if why is not None:
        raise ValueError(f"{what} names metrics path {path!r}, which this cell lacks: {why}")


def _unresolved(metrics: Mapping[str, Any], path: str) -> str | None:
    node: Any = metrics
    parents: list[Mapping[str, Any]] = []
    walked: list[str] = []
    for part in path.split("."):
        if node is None or (isinstance(node, Mapping) and "absent" in node and part not in node):
            return None  # recorded as not measured
        if not isinstance(node, Mapping):
            return f"{'.'.join(walked)} is a {type(node).__name__}, not a dict of metrics"
        if part not in node:
            if _withheld(node, parents, part):
                return None
            where = ".".join(walked) or "metrics"
            return f"{where} has no {part!r} (it has: {', '.join(map(str, node)) or 'nothing'})"
        parents.append(node)
        node = node[part]
        walked.append(part)
    return None


def _withheld(node: Mapping[str, Any], parents: list[Mapping[str, Any]], part: str) -> bool:
    """A percentile left out for too few samples, of this summary or (``ci95``, the
    ``adjusted`` forms) of the summary it belongs to."""
    for summary in (node, *(parents[-1:])):
        needs = summary.get("needs_samples")
        if isinstance(needs, Mapping) and part in needs:
            return True
    return False
