"""Service-level objectives: what ``--slo`` says, which latencies it may name, and how a
cell and a request are judged against it. Every SLO the harness applies, in a run and in
``recommend``, is judged here.

An SLO names a latency by the key of its summary in a cell's metrics (``e2e``, ``ttft``,
or a workload's own), a percentile and a threshold: ``e2e_p99=50ms``. Which latencies a
cell can be held to is what its workload declares (``ReportSpec.latencies``,
harness.results.reportspec); an SLO naming a latency that no cell of a run declares is a
usage error (``check_named``), not an SLO that silently applies nowhere.

* Per cell (``slo_verdicts``): the error-adjusted percentile of the latency's summary
  (a failed request counts as infinite latency) is within the threshold; a percentile
  the cell had too few samples for does not meet it.
* Per request (``within``, for goodput): its own value of every latency an SLO names is
  within that SLO's threshold.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from harness.exceptions import UsageError
from harness.metrics import stats

NAME = re.compile(r"[a-z][a-z0-9_]*")
"""A latency's name: the key of its summary in a cell's metrics (``e2e``, ``batch_latency``)."""

BUILT_IN = ("ttft", "tpot", "e2e", "itl")
"""The latencies the harness's own summaries hold requests to (harness.load.serve_summary:
``e2e``; harness.load.stream_summary: all four), and the only ones SLOs could name before
workloads declared theirs: a record that declares none is read as holding those of these
it has (harness.report.recommend.candidates)."""


def check_name(name: str) -> str:
    """``name`` if it can name a latency (lower case, digits, underscores, a letter
    first), else ValueError saying what a name looks like."""
    if not NAME.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a latency name: the key of its summary in the metrics, in"
            " lower case letters, digits and underscores, a letter first (e.g. e2e, ttft,"
            " batch_latency)"
        )
    return name


@dataclass(frozen=True)
class SLO:
    """``metric`` p``percentile`` must be <= ``threshold_s``; per request, metric <= threshold."""

    metric: str
    percentile: float
    threshold_s: float

    def __post_init__(self) -> None:
        check_name(self.metric)
        if not 0 < self.percentile < 100:
            raise ValueError("SLO percentile must be in (0, 100)")
        if not (math.isfinite(self.threshold_s) and self.threshold_s > 0):
            raise ValueError("SLO threshold must be a positive duration")

    @property
    def key(self) -> str:
        return f"{self.metric}_p{self.percentile:g}"


def parse_slos(text: str) -> tuple[SLO, ...]:
    """``"ttft_p99=200ms,tpot_p99=50ms"`` -> SLOs (units: s, ms, us; bare numbers are s).

    Any latency name is taken here (whether a run declares it is checked once its cells
    are known, ``check_named``). Every flaw is a ``ValueError`` that names the item: a
    metric given twice is one (which of two thresholds was meant cannot be guessed)."""
    slos: dict[str, SLO] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        slo = _slo(item)
        if slo.key in slos:
            raise ValueError(f"{slo.key} is given twice; give each metric and percentile once")
        slos[slo.key] = slo
    return tuple(slos.values())


def _slo(item: str) -> SLO:
    key, sep, value = item.partition("=")
    metric, _, pct = key.strip().rpartition("_p")
    if not sep or not metric or not pct:
        raise ValueError(f"SLO {item!r}: expected METRIC_pNN=DURATION, e.g. ttft_p99=200ms")
    try:
        percentile = float(pct)
    except ValueError:
        raise ValueError(f"SLO {item!r}: p{pct} is not a percentile; e.g. p99 or p99.9") from None
    try:
        return SLO(metric.strip(), percentile, _duration(value.strip()))
    except ValueError as exc:
        raise ValueError(f"SLO {item!r}: {exc}") from None


def _duration(text: str) -> float:
    number, scale = text, 1.0
    for suffix, factor in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if text.endswith(suffix):
            number, scale = text[: -len(suffix)], factor
            break
    try:
        return float(number) * scale
    except ValueError:
        raise ValueError(
            f"{text!r} is not a duration; give a number with s, ms or us, e.g. 200ms"
        ) from None


# -- which SLOs apply ---------------------------------------------------------------------


def slos_on(slos: Sequence[SLO], latencies: Collection[str]) -> tuple[SLO, ...]:
    """The SLOs that name one of ``latencies``, in their order: the ones a cell measuring
    those latencies is held to (the others are other workloads' in the same run)."""
    return tuple(s for s in slos if s.metric in latencies)


def check_named(slos: Sequence[SLO], declared: Collection[str], *, where: str, fix: str) -> None:
    """UsageError, in one line, unless every SLO names one of the ``declared`` latencies
    (those of ``where``, e.g. "the selected cells"): what was asked, what there is, and
    ``fix``, what to do about it."""
    unknown = [s for s in slos if s.metric not in declared]
    if not unknown:
        return
    asked = ", ".join(s.key for s in unknown)
    names = ", ".join(dict.fromkeys(s.metric for s in unknown))
    have = f"they declare: {', '.join(sorted(declared))}" if declared else "they declare none"
    raise UsageError(f"--slo {asked}: no latency named {names} in {where}; {have}; {fix}")


# -- judging ------------------------------------------------------------------------------


def adjusted_percentile(summary: object, percentile: float) -> float | None:
    """The error-adjusted ``percentile`` of a latency summary (harness.metrics.stats
    .to_json); None where the summary has none (too few samples, not a summary)."""
    adjusted = summary.get("adjusted") if isinstance(summary, Mapping) else None
    value = (
        adjusted.get(stats.percentile_key(percentile)) if isinstance(adjusted, Mapping) else None
    )
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def slo_verdicts(
    metrics: Mapping[str, object], slos: Sequence[SLO], latencies: Collection[str]
) -> dict[str, object]:
    """``metrics.slo`` of a cell that measures ``latencies``: each SLO on one of them
    judged on the error-adjusted percentile of its summary in ``metrics``; no value, not
    met. SLOs on other latencies are left out."""
    verdicts: dict[str, object] = {}
    for slo in slos_on(slos, latencies):
        value = adjusted_percentile(metrics.get(slo.metric), slo.percentile)
        verdicts[slo.key] = {
            "threshold_s": slo.threshold_s,
            "value_s": value,
            "met": value is not None and value <= slo.threshold_s,
        }
    return verdicts


def within(values: Mapping[str, npt.ArrayLike], slos: Sequence[SLO]) -> npt.NDArray[np.bool_]:
    """Per request: its value of every latency in ``values`` (one array per latency, a
    value per request) within each SLO on that latency; SLOs on other latencies are left
    out. Successful requests only: a failed request never meets an SLO."""
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in values.items()}
    met = np.ones(np.broadcast_shapes(*(a.shape for a in arrays.values())), dtype=np.bool_)
    for slo in slos_on(slos, arrays):
        met &= arrays[slo.metric] <= slo.threshold_s
    return met
