"""Multi-turn sessions: conversations that arrive open loop and speak turn by turn.

A session is a conversation. Its first turn is due at the session's scheduled arrival
(open loop: whatever the engine is doing, and latency counts from that time); each later
turn sends the history so far (every earlier message, the engine's own replies included)
plus the new user message, once the previous answer has fully arrived and a think time
has passed: it is due then, and the generator's lateness against that time is its lag.
Turns within a session are sequential; sessions overlap freely.

The history carries the replies the engine actually streamed, so a prefix cache sees
what a real client's next turn would send; an engine whose chunks carry no text (the
null engine) gets the session's reference reply in its place.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import cast

import numpy as np
import numpy.typing as npt

from harness.engine import Chunk, GenerationRequest, GenerativeEngine, Message
from harness.load.clock import gc_paused
from harness.load.livecounters import LIVE, schedule_span
from harness.load.streamdriver import Driver, sleep_until
from harness.metrics.streamtiming import RequestRecord


@dataclass(frozen=True)
class Session:
    """One conversation: the new messages of each turn (a user message, the first turn
    maybe a system message before it), what each turn asks for, and a reference reply per
    turn for engines that stream no text."""

    turns: tuple[tuple[Message, ...], ...]
    max_tokens: tuple[int, ...]
    references: tuple[str, ...]
    think_s: tuple[float, ...]
    """Seconds between a turn's last token and the next turn (one fewer than turns)."""
    ignore_eos: bool = True
    session_id: str = ""

    def __post_init__(self) -> None:
        n = len(self.turns)
        if n < 1 or len(self.max_tokens) != n or len(self.references) != n:
            raise ValueError("a session needs one max_tokens and one reference per turn")
        if len(self.think_s) != n - 1 or any(t < 0 for t in self.think_s):
            raise ValueError("one non-negative think time between each two turns")


@dataclass(frozen=True)
class Turn:
    """One turn as the client saw it."""

    session: int
    turn: int
    record: RequestRecord


@dataclass
class _Capture:
    """The engine, keeping the text of the reply it streams (for the next turn's history)."""

    engine: GenerativeEngine
    text: list[str] = field(default_factory=list)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        async for chunk in self.engine.generate(request):
            self.text.append(chunk.text)
            yield chunk


async def _converse(driver: Driver, index: int, session: Session, due: float) -> list[Turn]:
    history: list[Message] = []
    out: list[Turn] = []
    for k, new in enumerate(session.turns):
        if k:
            due = driver.clock.now() + session.think_s[k - 1]
            await sleep_until(driver.clock, due)
        history.extend(new)
        request = GenerationRequest(
            prompt="",
            messages=tuple(history),
            max_tokens=session.max_tokens[k],
            ignore_eos=session.ignore_eos,
            request_id=f"{session.session_id or index}-t{k}",
        )
        capture = _Capture(driver.engine)
        # the driver only streams from it: generate() is all of the engine it uses
        turn_driver = replace(driver, engine=cast(GenerativeEngine, capture))
        record = await turn_driver.one(request, due)
        out.append(Turn(index, k, record))
        if not record.ok:
            break  # the conversation cannot go on without its answer
        reply = "".join(capture.text) or session.references[k]
        history.append(Message("assistant", reply))
    return out


async def run_sessions(
    driver: Driver, sessions: Sequence[Session], arrivals: npt.NDArray[np.float64]
) -> list[Turn]:
    """Every session, started at its arrival offset (seconds from now), its turns in
    order; the turns of all sessions, by session then turn. A turn that fails ends its
    session (its later turns are never sent: nothing to build them on), and is counted."""
    if len(sessions) != len(arrivals):
        raise ValueError("one arrival per session")
    with gc_paused():
        # planned: the last session's arrival, and every turn (a failed turn ends its session)
        LIVE.begin_window(schedule_span(arrivals), sum(len(s.turns) for s in sessions))
        start = driver.clock.now()
        tasks: dict[int, asyncio.Task[list[Turn]]] = {}
        for i in np.argsort(arrivals, kind="stable").tolist():
            due = start + float(arrivals[i])
            await sleep_until(driver.clock, due)
            tasks[i] = asyncio.create_task(_converse(driver, i, sessions[i], due))
        turns = [turn for i in range(len(sessions)) for turn in await tasks[i]]
        LIVE.end_window()
        return turns


def active_sessions(turns: Sequence[Turn]) -> dict[str, float]:
    """How many sessions were open at once (first turn due to last token): the mean over
    the window and the most."""
    spans: dict[int, list[float]] = {}
    for t in turns:
        lo_hi = spans.setdefault(t.session, [t.record.t_sched, t.record.t_end])
        lo_hi[0] = min(lo_hi[0], t.record.t_sched)
        lo_hi[1] = max(lo_hi[1], t.record.t_end)
    if not spans:
        return {"mean": 0.0, "max": 0.0}
    edges = sorted((v, d) for lo, hi in spans.values() for v, d in ((lo, 1), (hi, -1)))
    level, most, area = 0, 0, 0.0
    for (t0, d), (t1, _) in pairwise(edges):
        level += d
        most = max(most, level)
        area += level * (t1 - t0)
    window = edges[-1][0] - edges[0][0]
    return {"mean": area / window if window > 0 else float(level), "max": float(most)}


def durations(turns: Sequence[Turn]) -> list[float]:
    """Each session's length: its first turn due to its last token."""
    spans: dict[int, tuple[float, float]] = {}
    for t in turns:
        lo, hi = spans.get(t.session, (t.record.t_sched, t.record.t_end))
        spans[t.session] = (min(lo, t.record.t_sched), max(hi, t.record.t_end))
    return [hi - lo for lo, hi in spans.values()]
