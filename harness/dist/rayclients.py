"""Client processes as Ray actors, for load from more machines than the one running the cell.

A launcher for ``harness.load.clients``: each client of a shared schedule is a Ray actor
(one CPU each, spread over the cluster's nodes where it has room), running the same
``run_client`` a local client process runs. The start barrier is the same: every actor
loads its engine and warms up, says it is ready, and only then does the launcher pick
the common start and send it. Actors may be on other machines, so the start and every
timestamp are on the wall clock (``ClockKind.WALL``): alignment across nodes is as good
as NTP keeps their clocks.

A client whose actor dies (its process, or its node), raises, or misses a deadline is
killed and reported as a ``ClientFailure`` naming it and its node; the other clients'
records stand. Ray is imported only when a launch starts.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from harness.load.clients import ClientFailure, ClientResult, ClientSpec, ClockKind, Deadlines, Launched, Outcome, client_error, clock_shift, common_now, run_client
from harness.exceptions import Cancelled
from harness.dist.rayconn import connect, node_address, ray_module

POLL_S = 0.5


class ClientActor:
    """The body of one client actor. ``run`` and the barrier calls (``wait_ready``,
    ``go``) arrive on different threads of the actor (it has ``max_concurrency`` 3)."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._starts: queue.Queue[float | None] = queue.Queue(maxsize=1)

    def run(self, spec: ClientSpec) -> ClientResult | str:
        """The client's result, or why there is none (an error the driver reports)."""
        try:
            result = run_client(spec, self._await_start)
        except Exception as exc:
            return client_error(exc)
        return dataclasses.replace(result, host=f"{result.host} ({node_address()})")

    def _await_start(self) -> float:
        self._ready.set()
        start = self._starts.get()
        if start is None:
            raise Cancelled("the launcher called the run off")
        return start

    def wait_ready(self, timeout_s: float) -> bool:
        return self._ready.wait(timeout_s)

    def go(self, start: float | None) -> None:
        self._starts.put(start)


@dataclass
class _Client:
    spec: ClientSpec
    actor: Any
    run: Any
    ready: Any


@dataclass(frozen=True)
class RayActors:
    """Clients as Ray actors on the cluster at ``address`` (None: ``RAY_ADDRESS``, or a
    Ray instance this process already joined, or a new local one).

    ``cpus_per_client``: what each actor asks Ray for; a client is one Python process,
    which saturates one core. ``start_delay_s``: from the last client ready to the
    start, enough for ``go`` to reach every node."""

    name: ClassVar[str] = "ray-actors"
    clock: ClassVar[ClockKind] = ClockKind.WALL
    address: str | None = None
    cpus_per_client: float = 1.0
    start_delay_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.cpus_per_client > 0 or not self.start_delay_s > 0:
            raise ValueError("cpus_per_client and start_delay_s must be > 0")

    def launch(self, specs: Sequence[ClientSpec], deadlines: Deadlines) -> Launched:
        ray = ray_module()
        if any(s.clock is not self.clock for s in specs):
            raise ValueError("clients on Ray stamp with the wall clock (ClockKind.WALL)")
        self._connect(ray)
        actor_class = ray.remote(num_cpus=self.cpus_per_client, max_concurrency=3)(ClientActor)
        clients = {s.index: self._start(actor_class, s, deadlines) for s in specs}
        try:
            failed = self._await_ready(ray, clients, deadlines.ready_s)
            start = common_now(self.clock) + self.start_delay_s
            for index, client in clients.items():
                client.actor.go.remote(None if index in failed else start)
            running = {i: c for i, c in clients.items() if i not in failed}
            results, late = self._await_results(ray, running, deadlines.run_s + self.start_delay_s)
        finally:
            for client in clients.values():
                ray.kill(client.actor, no_restart=True)
        outcomes = tuple(
            results[s.index] if s.index in results else (failed | late)[s.index] for s in specs
        )
        return Launched(self.name, start, clock_shift(self.clock), outcomes)

    def _connect(self, ray: Any) -> None:
        if not ray.is_initialized():
            connect(ray, self.address)

    def _start(self, actor_class: Any, spec: ClientSpec, deadlines: Deadlines) -> _Client:
        actor = actor_class.options(
            scheduling_strategy="SPREAD",  # one client per node while nodes have room
            max_restarts=0,
        ).remote()
        ready = actor.wait_ready.remote(deadlines.ready_s)
        return _Client(spec, actor, actor.run.remote(spec), ready)

    def _await_ready(
        self, ray: Any, clients: dict[int, _Client], timeout_s: float
    ) -> dict[int, ClientFailure]:
        """Which clients failed to get ready: their ``run`` ended first, or the deadline."""
        calls = {c.ready: (i, "ready") for i, c in clients.items()}
        calls |= {c.run: (i, "run") for i, c in clients.items()}
        ready: set[int] = set()
        failed: dict[int, ClientFailure] = {}
        deadline = time.monotonic() + timeout_s
        while calls and (left := deadline - time.monotonic()) > 0:
            done, _ = ray.wait(list(calls), num_returns=1, timeout=min(left, POLL_S))
            for ref in done:
                index, call = calls.pop(ref)
                if index in failed:
                    continue
                if call == "run":  # it ended before the start: never a result
                    ready.discard(index)
                    failed[index] = _failure(ray, clients[index], "before the start")
                elif _value(ray, ref) is True:
                    ready.add(index)
                # else: the barrier call failed or timed out; its run call will say why
            if len(ready) + len(failed) == len(clients):
                break
        for index in set(clients) - ready - set(failed):
            reason = f"client {index} was not ready within {timeout_s:g} s (killed)"
            failed[index] = ClientFailure(index, reason, time.perf_counter())
        return failed

    def _await_results(
        self, ray: Any, clients: dict[int, _Client], timeout_s: float
    ) -> tuple[dict[int, Outcome], dict[int, ClientFailure]]:
        pending = {c.run: i for i, c in clients.items()}
        results: dict[int, Outcome] = {}
        failed: dict[int, ClientFailure] = {}
        if not pending:
            return results, failed
        done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
        for ref in done:
            index = pending.pop(ref)
            value = _value(ray, ref)
            if isinstance(value, ClientResult) and value.index == index:
                results[index] = value
            else:
                failed[index] = _failure(ray, clients[index], "during the run")
        for index in pending.values():
            reason = f"client {index} sent no result within {timeout_s:g} s (killed)"
            failed[index] = ClientFailure(index, reason, time.perf_counter())
        return results, failed


def _value(ray: Any, ref: Any) -> object:
    """A finished call's value, or the exception that ended it."""
    try:
        return ray.get(ref)
    except Exception as exc:
        return exc


def _failure(ray: Any, client: _Client, when: str) -> ClientFailure:
    """Why a client's ``run`` ended without a result: its own error, or Ray's."""
    value = _value(ray, client.run)
    if isinstance(value, BaseException):
        first = str(value).strip().splitlines()[0] if str(value).strip() else ""
        why = f"its actor failed {when}: {type(value).__name__}: {first}"
    elif isinstance(value, str):
        why = value
    else:
        why = f"it returned {type(value).__name__} {when}, not its ClientResult"
    index = client.spec.index
    return ClientFailure(index, f"client {index} (Ray actor): {why}"[:500], time.perf_counter())
