"""Batching semantics under a fake clock: batches close at B or at D, never later."""

import numpy as np
import pytest

from harness.load.serving import (
    Dispatch,
    DynamicBatching,
    NoBatching,
    StaticBatching,
    Wait,
    serve_open_loop,
)
from tests.support.fakes import FakeClock


def serve(offsets, policy, service=0.0, fail_on=None):
    clock = FakeClock()
    batches: list[tuple[float, list[int]]] = []

    def run_batch(indices):
        batches.append((clock.now(), list(indices)))
        if fail_on is not None and fail_on in indices:
            raise RuntimeError("injected failure")
        clock.advance(service)
        return service

    trace = serve_open_loop(np.asarray(offsets, dtype=float), policy, run_batch, clock)
    return trace, batches


def test_dynamic_decide_closes_at_max_batch_or_deadline():
    policy = DynamicBatching(max_size=4, max_delay=0.005)
    assert policy.decide(0, None, 1.0, True) == Wait(None)
    assert policy.decide(2, 1.0, 1.001, True) == Wait(1.005)
    assert policy.decide(2, 1.0, 1.005, True) == Dispatch(2)
    assert policy.decide(4, 1.0, 1.0, True) == Dispatch(4)
    assert policy.decide(9, 1.0, 1.0, True) == Dispatch(4)


def test_dynamic_closes_at_max_delay_when_batch_does_not_fill():
    # Arrivals at 0, 1, 2 ms; B=4, D=5 ms: the batch closes at exactly 5 ms with 3.
    trace, batches = serve([0.0, 0.001, 0.002, 0.020], DynamicBatching(4, 0.005))
    assert batches[0] == (pytest.approx(0.005), [0, 1, 2])
    assert batches[1] == (pytest.approx(0.025), [3])
    assert trace.batch_sizes == [3, 1]
    np.testing.assert_allclose(trace.t_send - trace.t_sched, [0.005, 0.004, 0.003, 0.005])


def test_dynamic_closes_when_full_before_deadline():
    # Four arrivals within 3 ms: the batch closes at the fourth arrival, not at D=5 ms.
    _, batches = serve([0.0, 0.001, 0.002, 0.003, 0.004], DynamicBatching(4, 0.005))
    assert batches[0] == (pytest.approx(0.003), [0, 1, 2, 3])
    assert batches[1] == (pytest.approx(0.009), [4])


def test_dynamic_never_closes_later_than_deadline_under_random_arrivals():
    rng = np.random.default_rng(7)
    offsets = np.sort(rng.uniform(0, 1.0, size=500))
    b, d = 8, 0.004
    trace, batches = serve(offsets, DynamicBatching(b, d))
    for t_close, idx in batches:
        oldest = trace.t_sched[idx[0]]
        assert len(idx) <= b
        # closes at D after the oldest arrival, or earlier when full
        assert t_close <= oldest + d + 1e-12
        if len(idx) < b:
            assert t_close == pytest.approx(oldest + d)
        else:
            assert t_close == pytest.approx(trace.t_sched[idx[-1]])


def test_busy_engine_dispatches_at_once_when_free():
    # Service 10 ms; arrivals keep coming: queued requests wait for the engine and the
    # next batch is dispatched the moment the engine is free (deadline long passed).
    trace, batches = serve([0.0, 0.001, 0.002, 0.003], DynamicBatching(2, 0.001), service=0.010)
    assert [idx for _, idx in batches] == [[0, 1], [2, 3]]
    assert batches[0][0] == pytest.approx(0.001)
    assert batches[1][0] == pytest.approx(0.011)
    np.testing.assert_allclose(trace.t_done - trace.t_sched, [0.011, 0.010, 0.019, 0.018])


def test_static_waits_to_fill_and_flushes_the_tail():
    trace, batches = serve([0.0, 0.010, 0.020, 0.030, 0.040], StaticBatching(2))
    assert [idx for _, idx in batches] == [[0, 1], [2, 3], [4]]
    assert [t for t, _ in batches] == pytest.approx([0.010, 0.030, 0.040])
    assert trace.flushed_batches == 1
    # the first request of each pair waited a whole gap for its partner
    np.testing.assert_allclose(trace.t_send - trace.t_sched, [0.010, 0.0, 0.010, 0.0, 0.0])


def test_no_batching_is_fifo_one_at_a_time():
    trace, batches = serve([0.0, 0.0, 0.001], NoBatching(), service=0.002)
    assert [idx for _, idx in batches] == [[0], [1], [2]]
    assert [t for t, _ in batches] == pytest.approx([0.0, 0.002, 0.004])
    assert trace.batch_sizes == [1, 1, 1]


def test_failed_batch_fails_its_requests_and_the_run_goes_on():
    trace, _ = serve([0.0, 0.001, 0.002, 0.003], StaticBatching(2), fail_on=1)
    assert trace.failed.tolist() == [True, True, False, False]
    assert trace.errors == {"RuntimeError: injected failure": 1}
    assert not np.isnan(trace.t_done).any()


def test_serving_loop_records_its_wakeups():
    trace, _ = serve([0.0, 0.5, 1.0], NoBatching())
    # a fake clock wakes exactly on time: one zero-lag sleep per idle wait
    assert trace.lag == [0.0, 0.0]
    assert trace.window == pytest.approx(1.0)


def test_policies_validate_their_parameters():
    with pytest.raises(ValueError, match="static batch size"):
        StaticBatching(0)
    with pytest.raises(ValueError, match="max queue delay"):
        DynamicBatching(4, -0.001)
    with pytest.raises(ValueError, match="max batch"):
        DynamicBatching(0, 0.001)
