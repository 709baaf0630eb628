"""Several client processes sharing one schedule (harness.load.clients): the split, the
merge onto one time base, failed clients, the merged run's validity, and real processes
(the null-gen engine, and the openai adapter against the no-op streaming server)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from harness.dist.rayclients import RayActors
from harness.engine import EngineConfig, GenerationRequest, registry
from harness.exceptions import UsageError
from harness.load.clients import (
    ClientFailure,
    ClientResult,
    ClientSpec,
    ClockKind,
    ClosedShare,
    Deadlines,
    Launched,
    OpenShare,
    SharedLoad,
    clock_shift,
    common_now,
    is_network_client,
    merge,
    on_schedule,
    run_client,
    run_shared,
    shifted,
)
from harness.load.localclients import LocalProcesses, client_process
from harness.load.stream_summary import summarize_stream
from harness.metrics.streamtiming import RequestRecord
from harness.metrics.validity import Verdict, judge
from harness.session.config import PROFILES, ProfileName
from harness.session.pytestoptions import parse_settings
from workloads.lib.generative import LoadSource, launcher_for

TICK = 1 / 1024  # times on a binary grid: shifting by powers of two is exact
QUICK = PROFILES[ProfileName.QUICK].policy


def requests(n: int) -> tuple[GenerationRequest, ...]:
    """Request i has a prompt of 1 + i % 7 tokens and asks for 1 + i % 5: a record's
    n_in and n_asked say which request it is."""
    return tuple(
        GenerationRequest(prompt=tuple(range(1 + i % 7)), max_tokens=1 + i % 5, request_id=f"q{i}")
        for i in range(n)
    )


def shared(n: int, clients: int, offsets: list[float] | None = None) -> SharedLoad:
    offs = offsets if offsets is not None else [i * 8 * TICK for i in range(n)]
    return SharedLoad(
        engine="openai",
        config=EngineConfig(model=Path("-")),
        requests=requests(n),
        load=OpenShare(tuple(offs)),
        clients=clients,
    )


def record(req: GenerationRequest, t_sched: float, t_send: float) -> RequestRecord:
    """What a client would see for ``req``: 1 + i % 5 tokens, one per chunk, a tick apart."""
    n = req.max_tokens
    return RequestRecord(
        t_sched=t_sched,
        t_send=t_send,
        t_end=t_send + (n + 2) * TICK,
        chunk_times=tuple(t_send + (k + 2) * TICK for k in range(n)),
        chunk_tokens=(1,) * n,
        n_in=len(req.prompt),
        n_asked=n,
        n_out_reported=n,
        lag=t_send - t_sched,
    )


def single_process(load: SharedLoad, start: float, late: float = 0.0) -> list[RequestRecord]:
    """The records one process would have produced, on the parent's clock."""
    assert isinstance(load.load, OpenShare)
    return [
        record(r, start + o, start + o + late)
        for r, o in zip(load.requests, load.load.offsets, strict=True)
    ]


def as_clients(
    load: SharedLoad, truth: list[RequestRecord], shifts: list[float], parent_shift: float
) -> tuple[ClientResult, ...]:
    """Each client's share of ``truth`` as it would come back: on its own clock."""
    return tuple(
        ClientResult(
            index=k,
            records=tuple(shifted(truth[i], parent_shift - shift) for i in load.indices(k)),
            shift=shift,
            start_late_s=0.0,
            pid=1000 + k,
            host="h",
        )
        for k, shift in enumerate(shifts)
    )


# --- the split --------------------------------------------------------------------------


def test_every_nth_split_covers_every_request_once_in_schedule_order():
    offsets = sorted(np.random.default_rng(3).uniform(0, 5, size=23).tolist())
    load = shared(23, 4, offsets)
    specs = load.specs()
    assert [s.index for s in specs] == [0, 1, 2, 3]
    taken = sorted(i for k in range(4) for i in load.indices(k))
    assert taken == list(range(23))  # every request, exactly once
    for spec in specs:
        assert isinstance(spec.load, OpenShare)
        assert spec.requests == load.requests[spec.index :: 4]
        assert spec.load.offsets == tuple(offsets[spec.index :: 4])
        assert list(spec.load.offsets) == sorted(spec.load.offsets)  # in schedule order
        assert spec.clients == 4
    assert [len(s.requests) for s in specs] == [6, 6, 6, 5]


def test_a_schedule_out_of_order_is_refused():
    with pytest.raises(ValueError, match="schedule order"):
        OpenShare((0.0, 0.2, 0.1))


def test_closed_loop_deals_out_users_and_the_minimum_request_count():
    load = replace(shared(20, 3), load=ClosedShare(users=5, min_duration_s=2.0, min_requests=10))
    specs = load.specs()
    shares = [s.load for s in specs]
    assert all(isinstance(s, ClosedShare) for s in shares)
    assert [s.users for s in shares] == [2, 2, 1]  # type: ignore[union-attr]
    # client k holds requests k, k+3, ...; its part of the first 10 is what it must send
    assert [s.min_requests for s in shares] == [4, 3, 3]  # type: ignore[union-attr]
    assert sum(s.min_requests for s in shares) == 10  # type: ignore[union-attr]
    few_users = replace(load, load=ClosedShare(users=2))
    assert few_users.active == 2  # a client without a user gets no share
    assert [len(s.requests) for s in few_users.specs()] == [10, 10]


# --- the merge --------------------------------------------------------------------------


def test_merge_converts_time_bases_and_equals_the_single_process_summary():
    load = shared(300, 3)
    start, parent_shift = 4096.0, -256.0  # the parent's clock reads start - parent_shift
    truth = single_process(load, start - parent_shift, late=TICK)
    outcomes = as_clients(load, truth, shifts=[1024.0, -2048.0, 512.0], parent_shift=parent_shift)
    assert outcomes[0].records[0].t_sched != truth[0].t_sched  # really on another clock
    merged = merge(load, Launched("test", start, parent_shift, outcomes))
    assert list(merged.records) == truth  # every request once, in its place, same times
    offered = 300 / 2.0
    mine = summarize_stream(merged.records, (), offered)
    one = summarize_stream(truth, (), offered)
    assert mine.metrics == one.metrics
    assert mine.evidence == one.evidence
    doc = merged.to_json()
    assert (doc["count"], doc["clock"], doc["launcher"]) == (3, "monotonic", "test")
    assert [c["requests"] for c in doc["per_client"]] == [100, 100, 100]
    assert [c["pid"] for c in doc["per_client"]] == [1000, 1001, 1002]
    assert all(c["lag_p99_s"] == TICK and c["error"] is None for c in doc["per_client"])


def test_wall_clock_shift_is_the_offset_of_the_epoch_from_perf_counter():
    assert clock_shift(ClockKind.MONOTONIC) == 0.0
    shift = clock_shift(ClockKind.WALL)
    assert abs(time.perf_counter() + shift - time.time()) < 0.01


def test_a_late_start_becomes_lag_on_every_request_of_that_client():
    req = requests(3)
    offsets = np.array([0.0, 0.25, 0.5])
    began, start = 10.0 + 0.05, 10.0  # the driver began 50 ms after the common start
    own = [record(r, began + o, began + o) for r, o in zip(req, offsets, strict=True)]
    out, late = on_schedule(own, offsets, start)
    assert late == pytest.approx(0.05)
    assert [r.t_sched for r in out] == pytest.approx([10.0, 10.25, 10.5])
    assert [r.lag for r in out] == pytest.approx([0.05] * 3)
    assert [r.t_send for r in out] == [r.t_send for r in own]  # sends are what they were


def test_a_dead_clients_share_becomes_failed_requests_with_the_reason():
    load = shared(200, 2)
    start = 64.0
    truth = single_process(load, start)
    ok = as_clients(load, truth, shifts=[0.0, 0.0], parent_shift=0.0)[0]
    dead = ClientFailure(1, "client 1 was killed by signal SIGKILL before its result", 70.0)
    merged = merge(load, Launched("test", start, 0.0, (ok, dead)))
    assert len(merged.records) == 200
    failed = merged.records[1::2]
    assert all(not r.ok for r in failed)
    assert all("client 1 failed: client 1 was killed by signal SIGKILL" in r.error for r in failed)
    assert [r.t_sched for r in failed] == [truth[i].t_sched for i in range(1, 200, 2)]
    assert [r.n_asked for r in failed] == [truth[i].n_asked for i in range(1, 200, 2)]
    assert all(r.ok for r in merged.records[0::2])
    s = summarize_stream(merged.records, (), 100.0)
    assert s.metrics["requests"]["failed"] == 100
    assert sum(s.metrics["errors"].values()) == 100
    verdict = judge(s.evidence, QUICK)
    assert verdict.verdict is Verdict.INVALID
    assert any("error rate 50.00%" in r for r in verdict.reasons)
    reports = merged.to_json()["per_client"]
    assert reports[1]["error"].startswith("client 1 was killed")
    assert (reports[1]["requests"], reports[1]["failed"], reports[1]["pid"]) == (100, 100, None)


def test_an_open_loop_request_a_client_did_not_return_is_failed_not_dropped():
    load = shared(10, 2)
    truth = single_process(load, 0.0)
    full = as_clients(load, truth, [0.0, 0.0], 0.0)
    short = replace(full[1], records=full[1].records[:3])
    merged = merge(load, Launched("test", 0.0, 0.0, (full[0], short)))
    assert len(merged.records) == 10
    assert [r.ok for r in merged.records[1::2]] == [True, True, True, False, False]
    assert "returned no record for it" in (merged.records[9].error or "")


def test_a_client_that_started_late_makes_the_merged_run_invalid_for_lag():
    load = shared(400, 2, [i / 200 for i in range(400)])  # 200 req/s for 2 s
    on_time = single_process(load, 0.0)
    late = single_process(load, 0.0, late=0.05)
    ok_run = merge(load, Launched("t", 0.0, 0.0, as_clients(load, on_time, [0.0, 0.0], 0.0)))
    mixed = [on_time[i] if i % 2 == 0 else late[i] for i in range(400)]
    bad_run = merge(load, Launched("t", 0.0, 0.0, as_clients(load, mixed, [0.0, 0.0], 0.0)))
    good = summarize_stream(ok_run.records, (), 200.0).evidence
    assert judge(good, QUICK).verdict is Verdict.VALID
    # achieved and sent are the merged run's: each client alone sent only half the rate
    assert good.sent_rate == pytest.approx(200.0, rel=0.02)
    assert good.achieved_rate == pytest.approx(200.0, rel=0.02)
    bad = summarize_stream(bad_run.records, (), 200.0).evidence
    verdict = judge(bad, QUICK)
    assert verdict.verdict is Verdict.INVALID
    assert any(r.startswith("load-generator lag p99 50 ms > bound 20 ms") for r in verdict.reasons)
    lags = [c["lag_p99_s"] for c in bad_run.to_json()["per_client"]]
    assert lags == pytest.approx([0.0, 0.05])


def test_merge_refuses_a_launch_without_an_outcome_per_client():
    load = shared(10, 2)
    truth = single_process(load, 0.0)
    one = as_clients(load, truth, [0.0, 0.0], 0.0)[:1]
    with pytest.raises(ValueError, match="one outcome per client"):
        merge(load, Launched("t", 0.0, 0.0, one))


def test_a_spec_needs_a_start_or_a_barrier():
    spec = shared(4, 2).specs()[0]
    assert spec.start is None
    with pytest.raises(ValueError, match="no start"):
        run_client(spec)


# --- the option -------------------------------------------------------------------------


def settings(**kw):
    base = dict(device="cpu", profile="quick", results_dir="results/runs", seed=0)
    return parse_settings(**(base | kw))


def test_clients_option_is_validated_and_recorded():
    s = settings(engine=["openai"], clients=3)
    assert s.clients == 3
    assert s.to_json()["clients"] == 3
    assert settings(engine=None).to_json()["clients"] == 1
    with pytest.raises(UsageError, match="--clients must be >= 1, got 0"):
        settings(engine=["openai"], clients=0)
    with pytest.raises(UsageError, match="not an HTTP engine: onnxruntime, null-gen"):
        settings(engine=["onnxruntime,null-gen,openai"], clients=2)
    assert settings(engine=["onnxruntime"], clients=1).clients == 1  # one: in-process


@dataclass(frozen=True)
class FakeWallLauncher:
    """A fake launcher (no clients run): keeps the specs it was given; every client fails."""

    name: ClassVar[str] = "fake-wall"
    clock: ClassVar[ClockKind] = ClockKind.WALL
    seen: list[ClientSpec] = field(default_factory=list)

    def launch(self, specs, deadlines):
        self.seen.extend(specs)
        failures = tuple(ClientFailure(s.index, "fake", 0.0) for s in specs)
        return Launched(self.name, 0.0, 0.0, failures)


def test_clients_on_picks_the_launcher_whose_clock_the_clients_use(monkeypatch):
    local = settings(engine=["openai"], clients=2)
    assert isinstance(launcher_for(local), LocalProcesses)
    real = importlib.util.find_spec  # Ray stands as installed
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "ray" else real(name)
    )
    on_ray = settings(engine=["openai"], clients=2, clients_on="ray", ray_address="h:6379")
    launcher = launcher_for(on_ray)
    assert isinstance(launcher, RayActors)
    assert (launcher.address, launcher.clock) == ("h:6379", ClockKind.WALL)
    fake = FakeWallLauncher()
    config = EngineConfig(model=Path("-"), options={"base_url": "http://127.0.0.1:1"})
    source = LoadSource(None, None, on_ray, "openai", config, fake, ceiling_check=False)  # type: ignore[arg-type]
    sent = source.open_loop(requests(6), np.arange(6) * 0.01)
    assert [s.clock for s in fake.seen] == [ClockKind.WALL, ClockKind.WALL]
    assert [len(s.requests) for s in fake.seen] == [3, 3]
    assert sent.clients is not None
    assert (sent.clients["launcher"], sent.clients["clock"]) == ("fake-wall", "wall")
    assert [r.error for r in sent.records] == ["client 0 failed: fake", "client 1 failed: fake"] * 3


def test_network_clients_are_the_adapters_that_take_a_server():
    assert is_network_client(registry.load("openai"))
    assert not is_network_client(registry.load("null-gen"))
    assert not is_network_client(registry.load("vllm"))  # in-process: would load N models

    class Declared:
        network_client = False

        @classmethod
        def validate_options(cls, options):
            return None  # takes anything, but says it is no network client

    assert not is_network_client(Declared)  # type: ignore[arg-type]


# --- real client processes --------------------------------------------------------------


def null_gen_load(n: int, clients: int, rate: float) -> SharedLoad:
    return replace(
        shared(n, clients, [i / rate for i in range(n)]),
        engine="null-gen",
        config=EngineConfig(model=Path("-")),
    )


def dies_or_hangs(spec: ClientSpec, conn: Connection, cpus: frozenset[int] | None) -> None:
    """Client 1 dies before it is ready; client 2 is ready, then never answers."""
    if spec.index == 1:
        os._exit(3)
    if spec.index == 2:
        conn.send(("ready", None))
        conn.recv()
        time.sleep(3600)
    client_process(spec, conn, cpus)


@pytest.mark.slow
def test_local_clients_that_die_or_hang_do_not_hang_the_run():
    load = null_gen_load(60, 3, rate=100.0)
    t0 = time.monotonic()
    merged = run_shared(load, LocalProcesses(target=dies_or_hangs), Deadlines(60.0, 4.0))
    assert time.monotonic() - t0 < 40.0  # bounded by the deadlines, not by the hang
    assert len(merged.records) == 60
    reports = merged.to_json()["per_client"]
    assert (reports[0]["ok"], reports[0]["error"]) == (20, None)
    assert reports[1]["error"] == "client 1 exited with code 3 before its ready"
    assert reports[2]["error"] == "client 2 sent no result within 4.3 s (killed)"
    assert [r.ok for r in merged.records] == [i % 3 == 0 for i in range(60)]
    assert "client 2 failed: client 2 sent no result" in (merged.records[2].error or "")


def test_a_client_with_a_start_fixed_in_advance_runs_in_this_process():
    """The Ray path: no barrier, the start travels in the spec (here: the wall clock)."""
    load = replace(null_gen_load(20, 2, rate=200.0), clock=ClockKind.WALL)
    # a lead that loading and warming up never eat, even on a busy machine (0.2 s did once
    # beside another xdist worker: 51 ms late)
    start = common_now(ClockKind.WALL) + 1.0
    spec = replace(load.specs()[1], start=start)
    result = run_client(spec)
    assert (result.index, len(result.records)) == (1, 10)
    assert all(r.ok for r in result.records)
    assert result.shift == pytest.approx(time.time() - time.perf_counter(), abs=0.01)
    on_common = [r.t_sched + result.shift - start for r in result.records]
    assert on_common == pytest.approx([(2 * i + 1) / 200.0 for i in range(10)], abs=1e-6)
    # never early (a start ignored is sent at once, a second early); late only by the
    # scheduler's wake-up, far under the lead
    assert 0.0 <= result.start_late_s < 0.5


@pytest.mark.slow
def test_local_clients_on_the_wall_clock_merge_onto_this_process_clock():
    load = replace(null_gen_load(40, 2, rate=100.0), clock=ClockKind.WALL)
    before = time.perf_counter()
    merged = run_shared(load, LocalProcesses(), Deadlines(60.0, 10.0))
    after = time.perf_counter()
    assert merged.clock is ClockKind.WALL
    assert [r.ok for r in merged.records] == [True] * 40
    t0 = merged.records[0].t_sched
    assert before < t0 < after  # converted to this process's perf_counter
    offsets = [r.t_sched - t0 for r in merged.records]
    assert offsets == pytest.approx([i / 100.0 for i in range(40)], abs=1e-3)


@pytest.mark.slow
def test_a_client_whose_engine_raises_reports_why():
    load = replace(null_gen_load(6, 2, rate=100.0), engine="no-such-engine")
    merged = run_shared(load, LocalProcesses(), Deadlines(60.0, 10.0))
    assert len(merged.records) == 6
    assert all("unknown engine 'no-such-engine'" in (r.error or "") for r in merged.records)
    assert all(c["error"].startswith("client ") for c in merged.to_json()["per_client"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the no-op server exited"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise AssertionError(f"the no-op server did not listen on {port}")


@pytest.fixture(scope="module")
def noop_url():
    """benchmarks/noop_server.py on a free loopback port, as its command line starts it."""
    pytest.importorskip("httptools")
    port = _free_port()
    cmd = [sys.executable, "-m", "benchmarks.noop_server", "--port", str(port), "--processes", "1"]
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(cmd, cwd=root, start_new_session=True)  # its own process group
    try:
        _wait_listening(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and the process it spawned
        proc.wait(10)


@pytest.mark.slow
def test_two_client_processes_against_the_noop_server(noop_url):
    rate, n = 200.0, 400
    offsets = np.cumsum(np.random.default_rng(5).exponential(1 / rate, size=n))
    offsets -= offsets[0]
    load = replace(
        shared(n, 2, offsets.tolist()),
        config=EngineConfig(model=Path("-"), options={"base_url": noop_url, "timeout_s": "30"}),
        warmup=requests(8),
    )
    merged = run_shared(load, LocalProcesses(), Deadlines(60.0, 30.0))
    records = merged.records
    assert len(records) == n
    # each slot holds its own request: the server answered as many tokens as it asked
    assert [r.n_in for r in records] == [len(q.prompt) for q in load.requests]
    assert [r.n_out for r in records] == [q.max_tokens for q in load.requests]
    assert all(r.ok for r in records)
    start = records[0].t_sched
    assert [r.t_sched - start for r in records] == pytest.approx(offsets.tolist(), abs=1e-9)
    doc = merged.to_json()
    assert [(c["requests"], c["ok"]) for c in doc["per_client"]] == [(200, 200), (200, 200)]
    assert len({c["pid"] for c in doc["per_client"]}) == 2
    assert doc["clock"] == "monotonic"
    offered = n / (float(offsets[-1]) + 1 / rate)
    ev = summarize_stream(records, (), offered).evidence
    assert ev.achieved_rate is not None
    assert ev.sent_rate is not None
    assert ev.achieved_rate / offered > 0.95
    assert ev.sent_rate / offered > 0.95
