"""Arrival schedules: gap laws, bursts and ramps hold on the seeded draws."""

import numpy as np
import pytest

from harness.load.arrivals import Arrivals, OpenLoop, RateShape, ShapedLoad


def _cv(times):
    gaps = np.diff(times)
    return gaps.std() / gaps.mean()


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 3.0])
def test_gamma_gaps_have_the_asked_burstiness_and_rate(burstiness):
    times = OpenLoop(200.0, 100.0, Arrivals.GAMMA, burstiness).schedule(seed=1)
    assert len(times) == pytest.approx(20_000, rel=0.05)
    assert _cv(times) == pytest.approx(burstiness, rel=0.06)
    assert times[0] == 0.0
    assert np.all(np.diff(times) >= 0)
    assert times[-1] < 100.0


def test_poisson_is_gamma_of_burstiness_one_and_constant_is_even():
    poisson = OpenLoop(200.0, 100.0).schedule(seed=2)
    assert _cv(poisson) == pytest.approx(1.0, rel=0.05)
    even = OpenLoop(8.0, 2.5, Arrivals.CONSTANT).schedule(seed=0)
    assert even.tolist() == [i / 8.0 for i in range(20)]


def test_schedules_are_seeded():
    load = OpenLoop(50.0, 10.0, Arrivals.GAMMA, 2.0)
    assert np.array_equal(load.schedule(7), load.schedule(7))
    assert not np.array_equal(load.schedule(7), load.schedule(8))


def test_a_burst_steps_from_base_to_peak_and_back():
    shape = RateShape.burst(base=100.0, peak=1000.0, start=10.0, length=5.0, duration=30.0)
    times = ShapedLoad(shape).schedule(seed=3)
    before = np.sum(times < 10.0)
    during = np.sum((times >= 10.0) & (times < 15.0))
    after = np.sum(times >= 15.0)
    assert before == pytest.approx(1000, rel=0.1)
    assert during == pytest.approx(5000, rel=0.05)
    assert after == pytest.approx(1500, rel=0.1)
    assert shape.expected() == pytest.approx(100 * 25 + 1000 * 5)


def test_a_ramp_rises_linearly():
    shape = RateShape.ramp(100.0, 900.0, duration=20.0)
    times = ShapedLoad(shape, Arrivals.GAMMA, burstiness=2.0).schedule(seed=4)
    first, last = np.sum(times < 5.0), np.sum(times >= 15.0)
    assert first == pytest.approx(5 * 200, rel=0.15)  # mean rate 200 over the first 5 s
    assert last == pytest.approx(5 * 800, rel=0.1)  # and 800 over the last 5 s
    assert len(times) == pytest.approx(shape.expected(), rel=0.05)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: OpenLoop(10.0, 1.0, Arrivals.POISSON, 2.0), "gamma arrivals only"),
        (lambda: OpenLoop(10.0, 1.0, Arrivals.GAMMA, 0.0), "burstiness must be > 0"),
        (lambda: RateShape(((1.0, 5.0), (2.0, 5.0))), "from t=0"),
        (lambda: RateShape(((0.0, 5.0), (2.0, 0.0))), "rates > 0"),
        (lambda: RateShape.burst(1.0, 2.0, 5.0, 10.0, 10.0), "end before the duration"),
    ],
)
def test_bad_shapes_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()
