"""Multi-turn sessions (harness.load.sessions): history, think time, open-loop arrivals,
a failed turn ending its session, and the session figures. The engine here is a fake
that records what it was sent (``RecordingChatEngine``): these test the harness's logic."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from harness.engine import Chunk, GenerationRequest, Message
from harness.load.clock import MonotonicClock
from harness.load.sessions import Session, Turn, active_sessions, durations, run_sessions
from harness.load.streamdriver import Driver
from harness.metrics.streamtiming import RequestRecord


class RecordingChatEngine:
    """A fake: answers each turn with "reply-<request id>" in two chunks, after
    ``service_s``; fails the requests whose id is in ``fail``."""

    def __init__(self, service_s: float = 0.002, fail: frozenset[str] = frozenset()) -> None:
        self.service_s = service_s
        self.fail = fail
        self.sent: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        self.sent.append(request)
        await asyncio.sleep(self.service_s)
        if request.request_id in self.fail:
            raise RuntimeError("injected failure")
        yield Chunk(n_tokens=1, text="reply-", prompt_tokens=len(request.messages))
        yield Chunk(n_tokens=1, text=request.request_id)


def session(turns: int, think: float = 0.01, sid: str = "s") -> Session:
    news: list[tuple[Message, ...]] = [(Message("user", f"question {k}"),) for k in range(turns)]
    news[0] = (Message("system", "be brief"), *news[0])
    return Session(
        turns=tuple(news),
        max_tokens=(2,) * turns,
        references=tuple(f"reference {k}" for k in range(turns)),
        think_s=(think,) * (turns - 1),
        session_id=sid,
    )


def run(engine: RecordingChatEngine, sessions: list[Session], arrivals: list[float]) -> list[Turn]:
    driver = Driver(engine, MonotonicClock(), timeout_s=5.0)  # type: ignore[arg-type]
    return asyncio.run(run_sessions(driver, sessions, np.asarray(arrivals)))


def test_each_turn_sends_the_history_with_the_engines_own_replies() -> None:
    engine = RecordingChatEngine()
    turns = run(engine, [session(3)], [0.0])
    assert [(t.session, t.turn) for t in turns] == [(0, 0), (0, 1), (0, 2)]
    third = engine.sent[2].messages
    assert [m.role for m in third] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert third[2].content == "reply-s-t0"  # what the engine streamed, not the reference
    assert third[4].content == "reply-s-t1"
    assert [t.record.n_in for t in turns] == [2, 4, 6]  # the engine's count of what it got
    assert {t.record.n_in_source for t in turns} == {"engine"}


def test_a_later_turn_is_due_a_think_time_after_the_last_answer() -> None:
    engine = RecordingChatEngine(service_s=0.005)
    turns = run(engine, [session(2, think=0.05)], [0.0])
    first, second = (t.record for t in turns)
    gap = second.t_sched - first.t_end
    assert 0.05 <= gap < 0.07  # the think time, measured from the end of the answer
    assert second.lag < 0.05  # sent within a think time of when it was due


def test_sessions_arrive_open_loop_and_overlap() -> None:
    engine = RecordingChatEngine(service_s=0.02)
    turns = run(engine, [session(2, think=0.0, sid=s) for s in "ab"], [0.0, 0.01])
    starts = {t.session: t.record.t_sched for t in turns if t.turn == 0}
    assert starts[1] - starts[0] == pytest.approx(0.01, abs=0.005)
    assert active_sessions(turns)["max"] == 2.0


def test_a_failed_turn_ends_its_session_and_is_counted() -> None:
    engine = RecordingChatEngine(fail=frozenset({"s-t1"}))
    turns = run(engine, [session(4)], [0.0])
    assert [(t.turn, t.record.ok) for t in turns] == [(0, True), (1, False)]
    assert "injected failure" in (turns[1].record.error or "")


def test_an_engine_without_text_gets_the_reference_reply_in_the_history() -> None:
    class Silent(RecordingChatEngine):
        async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
            self.sent.append(request)
            yield Chunk(n_tokens=2)

    engine = Silent()
    run(engine, [session(2)], [0.0])
    assert engine.sent[1].messages[2] == Message("assistant", "reference 0")


def _record(t0: float, t1: float) -> RequestRecord:
    return RequestRecord(
        t_sched=t0, t_send=t0, t_end=t1, chunk_times=(t1,), chunk_tokens=(1,), n_in=1, n_asked=1
    )


def test_session_figures_known_answers() -> None:
    turns = [
        Turn(0, 0, _record(0.0, 1.0)),
        Turn(0, 1, _record(2.0, 3.0)),  # session 0: 0..3
        Turn(1, 0, _record(1.0, 2.0)),  # session 1: 1..2
    ]
    assert sorted(durations(turns)) == [1.0, 3.0]
    # one session over [0, 1) and [2, 3), two over [1, 2): mean 4/3 over 3 s
    assert active_sessions(turns) == {"mean": pytest.approx(4 / 3), "max": 2.0}


def test_a_session_needs_one_setting_per_turn() -> None:
    with pytest.raises(ValueError, match="one max_tokens"):
        Session(turns=((Message("user", "q"),),), max_tokens=(), references=("r",), think_s=())
    with pytest.raises(ValueError, match="think time"):
        Session(
            turns=((Message("user", "q"),),), max_tokens=(1,), references=("r",), think_s=(1.0,)
        )
