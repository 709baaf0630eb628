"""Client processes on this machine: the launcher that spawns one process per client
(``LocalProcesses``), the start barrier over a pipe, and the collection of their results.
Another launcher (Ray actors, ``harness.dist.rayclients``) implements the same
``Launcher`` protocol of ``harness.load.clients``.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import ClassVar

from harness.exceptions import Cancelled
from harness.load.clients import (
    ClientFailure,
    ClientResult,
    ClientSpec,
    ClockKind,
    Deadlines,
    Launched,
    Outcome,
    StartSignal,
    client_error,
    clock_shift,
    common_now,
    run_client,
)

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """An orphaned client would keep loading the server the next cell measures."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _pipe_barrier(conn: Connection) -> StartSignal:
    def wait_for_start() -> float:
        conn.send(("ready", None))
        start = conn.recv()
        if not isinstance(start, float):
            raise Cancelled("the parent called the run off")
        return start

    return wait_for_start


def client_process(spec: ClientSpec, conn: Connection, cpus: frozenset[int] | None) -> None:
    """Entry point of a spawned client process: its result, or why there is none."""
    _die_with_parent()
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        message: tuple[str, object] = ("result", run_client(spec, _pipe_barrier(conn)))
    except Exception as exc:  # reported to the parent, which counts the share as failed
        message = ("error", client_error(exc))
    with contextlib.suppress(OSError):
        conn.send(message)
    conn.close()


ClientTarget = Callable[[ClientSpec, Connection, frozenset[int] | None], None]


@dataclass
class _Child:
    index: int
    process: BaseProcess
    conn: Connection

    def poll(self, expect: str) -> tuple[bool, object]:
        """(True, payload) on ``expect``; (False, reason) on a failure; (False, None): not yet."""
        alive = self.process.is_alive()  # before the poll: a dead child's last words are in
        if self.conn.poll():
            try:
                kind, payload = self.conn.recv()
            except (EOFError, OSError):
                return False, self._gone(expect)
            if kind == expect:
                return True, payload
            return False, f"client {self.index}: {payload}"
        if not alive:
            return False, self._gone(expect)
        return False, None

    def _gone(self, expect: str) -> str:
        self.process.join(1.0)  # its pipe closes as it exits: let the exit code arrive
        return f"client {self.index} {_exit(self.process)} before its {expect}"

    def stop(self, grace_s: float) -> None:
        self.process.join(grace_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5.0)
        self.conn.close()


def _exit(process: BaseProcess) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        return f"was killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _collect(
    children: Mapping[int, _Child], expect: str, timeout_s: float
) -> tuple[dict[int, object], dict[int, ClientFailure]]:
    """Each child's ``expect`` message, or why it has none, by ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    waiting = dict(children)
    got: dict[int, object] = {}
    failed: dict[int, ClientFailure] = {}
    while waiting and (left := deadline - time.monotonic()) > 0:
        wait([h for c in waiting.values() for h in (c.conn, c.process.sentinel)], left)
        for index, child in list(waiting.items()):
            ok, payload = child.poll(expect)
            if ok:
                got[index] = payload
            elif payload is not None:
                failed[index] = ClientFailure(index, str(payload), time.perf_counter())
            else:
                continue
            del waiting[index]
    for index, child in waiting.items():
        child.process.kill()  # a client that stopped answering must not load the server on
        reason = f"client {index} sent no {expect} within {timeout_s:g} s (killed)"
        failed[index] = ClientFailure(index, reason, time.perf_counter())
    return got, failed


@dataclass(frozen=True)
class LocalProcesses:
    """Clients as spawned processes of this machine (``MONOTONIC`` clock).

    ``cpus``: client i is pinned to ``cpus[i % len(cpus)]``; empty: it keeps this
    process's affinity. ``start_delay_s``: from the last client ready to the start,
    enough for the start to reach every client and for each to settle its collector."""

    name: ClassVar[str] = "local-processes"
    clock: ClassVar[ClockKind] = ClockKind.MONOTONIC
    start_delay_s: float = 0.3
    cpus: tuple[frozenset[int], ...] = ()
    target: ClientTarget = client_process

    def __post_init__(self) -> None:
        if not self.start_delay_s > 0:
            raise ValueError("start_delay_s must be > 0")

    def launch(self, specs: Sequence[ClientSpec], deadlines: Deadlines) -> Launched:
        kinds = {s.clock for s in specs}
        if len(kinds) != 1:
            raise ValueError("every client of a run must use the same clock")
        clock = kinds.pop()
        children = {s.index: self._spawn(s) for s in specs}
        try:
            _, failed = _collect(children, "ready", deadlines.ready_s)
            start = common_now(clock) + self.start_delay_s
            for index, child in children.items():
                with contextlib.suppress(OSError):  # a dead child's pipe: already failed
                    child.conn.send(None if index in failed else start)
            running = {i: c for i, c in children.items() if i not in failed}
            run_s = deadlines.run_s + self.start_delay_s
            results, late_failures = _collect(running, "result", run_s)
        finally:
            for child in children.values():
                child.stop(grace_s=5.0)
        outcomes = _outcomes(specs, results, failed | late_failures)
        return Launched(self.name, start, clock_shift(clock), outcomes)

    def _spawn(self, spec: ClientSpec) -> _Child:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        cpus = self.cpus[spec.index % len(self.cpus)] if self.cpus else None
        process = ctx.Process(
            target=self.target, args=(spec, child, cpus), name=f"client-{spec.index}", daemon=True
        )
        process.start()
        child.close()  # the parent's copy: EOF reaches it when the client goes
        return _Child(spec.index, process, parent)


def _outcomes(
    specs: Sequence[ClientSpec], results: Mapping[int, object], failed: Mapping[int, ClientFailure]
) -> tuple[Outcome, ...]:
    out: list[Outcome] = []
    for spec in specs:
        result = results.get(spec.index)
        if isinstance(result, ClientResult) and result.index == spec.index:
            out.append(result)
        elif spec.index in failed:
            out.append(failed[spec.index])
        else:
            why = f"client {spec.index} sent a result that is not its ClientResult"
            out.append(ClientFailure(spec.index, why, time.perf_counter()))
    return tuple(out)
