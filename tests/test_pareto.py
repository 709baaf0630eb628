"""``harness.report.pareto``: which configurations no other beats on rate and latency."""

from __future__ import annotations

import math

import pytest

from harness.report.pareto import Point, dominates, front, optimal, staircase


def test_a_point_is_dominated_by_one_at_least_as_good_on_both_and_better_on_one():
    base = Point(rate=10.0, latency_s=0.05)
    assert dominates(Point(12.0, 0.05), base)  # more rate, same latency
    assert dominates(Point(10.0, 0.04), base)  # same rate, less latency
    assert dominates(Point(11.0, 0.01), base)
    assert not dominates(Point(10.0, 0.05), base)  # equal: neither beats the other
    assert not dominates(Point(12.0, 0.06), base)  # a trade-off: faster but slower
    assert not dominates(Point(9.0, 0.01), base)
    assert not dominates(base, base)


def test_the_front_is_every_point_no_other_dominates():
    points = [
        Point(12.0, 0.08),  # on the front: the most rate
        Point(11.0, 0.10),  # beaten by the first: less rate, more latency
        Point(10.0, 0.05),  # on the front: the least latency
        Point(0.0, 0.30),  # beaten by all
        Point(11.0, 0.07),  # on the front: between the two ends
    ]
    assert optimal(points) == (True, False, True, False, True)
    assert front(points) == (Point(10.0, 0.05), Point(11.0, 0.07), Point(12.0, 0.08))


def test_equal_points_are_both_on_the_front_and_drawn_once():
    twins = [Point(5.0, 0.1), Point(5.0, 0.1), Point(4.0, 0.2)]
    assert optimal(twins) == (True, True, False)
    assert front(twins) == (Point(5.0, 0.1),)


def test_one_point_is_its_own_front_and_none_has_none():
    assert optimal([Point(1.0, 1.0)]) == (True,)
    assert optimal([]) == ()
    assert front([]) == ()
    assert staircase([]) == ()


def test_the_staircase_goes_right_at_one_rate_then_up():
    points = [Point(12.0, 0.9), Point(10.0, 0.5), Point(11.0, 0.7), Point(1.0, 1.0)]
    assert staircase(points) == (
        (0.5, 10.0),
        (0.7, 10.0),
        (0.7, 11.0),
        (0.9, 11.0),
        (0.9, 12.0),
    )
    assert staircase([Point(3.0, 0.2)]) == ((0.2, 3.0),)


@pytest.mark.parametrize(
    ("rate", "latency"),
    [(-1.0, 0.1), (1.0, -0.1), (math.inf, 0.1), (1.0, math.inf), (math.nan, 0.1)],
)
def test_a_point_refuses_figures_that_cannot_be_placed(rate, latency):
    with pytest.raises(ValueError, match="finite number >= 0"):
        Point(rate, latency)
