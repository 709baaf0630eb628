"""Knee and capacity searches over synthetic systems (no engine, no clock)."""

from __future__ import annotations

import math

import pytest

from harness.load.capacity import (
    KneeRule,
    Point,
    SearchPolicy,
    Stop,
    capacity_search,
    sweep,
)

SLO_S = 0.010
CAPACITY = 1234.0  # the rate at which the synthetic p99 crosses SLO_S


def queue_p99(rate: float) -> float:
    """p99 of an M/M/1-like system whose p99 equals SLO_S at CAPACITY."""
    service_rate = CAPACITY + math.log(100) / SLO_S
    if rate >= service_rate:
        return math.inf
    return math.log(100) / (service_rate - rate)


def point(rate: float, *, invalid: str | None = None, errors: float = 0.0) -> Point:
    p99 = queue_p99(rate)
    return Point(
        load=rate,
        valid=invalid is None,
        reasons=(invalid,) if invalid else (),
        throughput=rate * (1 - errors),
        error_rate=errors,
        latency_p99_s=p99,
        slo_failures=() if p99 <= SLO_S else (f"e2e_p99 {p99:.3g} s > {SLO_S} s",),
        offered=rate,
    )


class Recorder:
    def __init__(self, system):
        self.system = system
        self.loads: list[float] = []

    def __call__(self, load: float) -> Point:
        self.loads.append(load)
        return self.system(load)


def test_capacity_is_bracketed_within_the_tolerance():
    measure = Recorder(point)
    result = capacity_search(measure, SearchPolicy(start=100, floor=10, ceiling=1e5))
    assert result.converged
    assert result.capacity is not None
    assert result.above is not None
    assert result.capacity.load <= CAPACITY < result.above.load
    assert result.above.load / result.capacity.load <= 1.1
    # bracketing doubled from 100 to the first failing rate, 1600
    assert measure.loads[:5] == [100, 200, 400, 800, 1600]
    assert [p.load for p in result.points] == measure.loads
    doc = result.to_json()
    assert doc["bracket"] == [result.capacity.load, result.above.load]
    assert doc["capacity"] == result.capacity.load
    assert "passes" in doc["why"]
    assert "fails" in doc["why"]


def test_an_invalid_point_never_becomes_the_capacity():
    def system(rate: float) -> Point:
        if rate >= 700:  # within the SLO, but the generator could not keep up
            return point(rate, invalid="load-generator lag p99 30 ms > bound 20 ms")
        return point(rate)

    result = capacity_search(system, SearchPolicy(start=100, floor=10, ceiling=1e5))
    assert result.capacity is not None
    assert result.above is not None
    assert result.capacity.load < 700 <= result.above.load
    assert all(p.valid for p in result.points if p.load == result.capacity.load)
    assert "invalid: load-generator lag" in result.why


def test_search_goes_down_when_the_first_rate_fails():
    measure = Recorder(point)
    result = capacity_search(measure, SearchPolicy(start=8000, floor=10, ceiling=1e5))
    assert measure.loads[:4] == [8000, 4000, 2000, 1000]
    assert result.capacity is not None
    assert result.capacity.load <= CAPACITY


def test_no_passing_rate_gives_no_capacity_and_says_why():
    result = capacity_search(
        lambda r: point(r, errors=0.5, invalid="error rate 50% > ceiling 1%"),
        SearchPolicy(start=100, floor=25, ceiling=1e5),
    )
    assert result.capacity is None
    assert [p.load for p in result.points] == [100, 50, 25]
    assert "nothing passes down to 25" in result.why


def test_a_ceiling_that_passes_makes_capacity_a_lower_bound():
    result = capacity_search(point, SearchPolicy(start=100, floor=10, ceiling=300))
    assert result.capacity is not None
    assert result.capacity.load == 300
    assert result.above is None
    assert not result.converged
    assert "capacity is above" in result.why


def test_search_stops_at_max_points():
    result = capacity_search(
        point, SearchPolicy(start=100, floor=10, ceiling=1e5, tolerance=1e-6, max_points=7)
    )
    assert len(result.points) == 7
    assert not result.converged
    assert "stopped after 7 points" in result.why


def test_sweep_knee_is_the_last_point_before_latency_blows_up():
    result = sweep(point, [100, 200, 400, 800, 1200, 1600, 3200], KneeRule())
    assert result.stop is Stop.BLOWUP
    # the synthetic p99 passes 3x the lowest load's before it crosses the SLO
    base = queue_p99(100)
    knee = result.knee
    assert knee is not None
    assert queue_p99(knee.load) <= 3 * base
    blown = result.points[-1]
    assert blown.latency_p99_s is not None
    assert blown.latency_p99_s > 3 * base
    assert not result.to_json()["knee_is_lower_bound"]


def test_sweep_stops_at_an_invalid_point_and_flags_a_lower_bound():
    def system(rate: float) -> Point:
        return (
            point(rate, invalid="p99 needs >= 100 samples, have 40") if rate > 300 else point(rate)
        )

    result = sweep(system, [100, 200, 400, 800], KneeRule())
    assert result.stop is Stop.INVALID
    assert result.knee is not None
    assert result.knee.load == 200
    assert [p.load for p in result.points] == [100, 200, 400]
    assert result.to_json()["knee_is_lower_bound"]
    assert "invalid" in result.why


def test_sweep_blows_up_on_errors_and_on_a_throughput_plateau():
    errs = sweep(lambda r: point(r, errors=0.05 if r > 150 else 0.0), [100, 200], KneeRule())
    assert errs.knee is not None
    assert errs.knee.load == 100
    assert "error rate" in errs.why

    def closed(users: float) -> Point:  # throughput saturates at 4 users
        tput = 100 * min(users, 4)
        return Point(users, True, (), tput, 0.0, 0.01 * users / min(users, 4))

    result = sweep(closed, [1, 2, 4, 8, 16], KneeRule(plateau=True, latency_factor=10))
    assert result.knee is not None
    assert result.knee.load == 4
    assert "throughput gained 0.0%" in result.why
    assert "last load" in result.why


def test_sweep_with_no_blow_up_reports_the_range_end():
    result = sweep(point, [10, 20, 40], KneeRule())
    assert result.stop is Stop.END
    assert result.knee is not None
    assert result.knee.load == 40
    assert result.to_json()["knee_is_lower_bound"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"load": 0.0},
        {"valid": False},
        {"reasons": ("x",)},
        {"error_rate": 1.5},
    ],
)
def test_points_check_themselves(kwargs):
    base = {
        "load": 1.0,
        "valid": True,
        "reasons": (),
        "throughput": 1.0,
        "error_rate": 0.0,
        "latency_p99_s": 0.1,
    }
    with pytest.raises(ValueError, match=r"load|point|fraction"):
        Point(**(base | kwargs))


def test_policies_check_themselves():
    with pytest.raises(ValueError, match="floor <= start"):
        SearchPolicy(start=5, floor=10, ceiling=100)
    with pytest.raises(ValueError, match="growth"):
        SearchPolicy(start=10, floor=10, ceiling=100, growth=1.0)
    with pytest.raises(ValueError, match="latency_factor"):
        KneeRule(latency_factor=1.0)
    with pytest.raises(ValueError, match="increasing"):
        sweep(point, [200, 100], KneeRule())
