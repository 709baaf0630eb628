"""Multi-turn sessions, with the engine's prefix cache off and on.

A session is a conversation from ``--session-spec`` (synthetic: turns, words per message,
tokens per reply, think time, session rate), ``--dataset`` (its multi-turn entries:
ShareGPT files, JSONL with messages) or the generated conversations: each turn sends the
history so far (the engine's own replies included) plus the next user message, once the
previous answer has arrived and a seeded think time has passed; sessions arrive open loop
(Poisson) and overlap (harness.load.sessions). Reports TTFT and E2E of first turns and of
later turns apart (a later turn's history is what a prefix cache can reuse), session
durations, how many sessions were open at once, and the prefix-cache queries and hits the
engine counted. ``prefix_cache`` off and on are the two contenders: the same sessions, so the
TTFT difference is what the cache buys.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from harness.api import (
    Cell,
    GenerativeEngine,
    Headline,
    Message,
    OpenEngine,
    OpenLoop,
    ReportSpec,
    RunSettings,
    settings_of,
    stats,
)
from workloads.lib import datasets, reporting
from workloads.lib.generative import (
    HEADLINE,
    engine_counters,
    finish,
    load_source,
    prefix_cache_account,
    read_counters,
    traffic_samples,
    watch_server,
)
from workloads.lib.loadgen import (
    Session,
    SessionSpec,
    Turn,
    active_sessions,
    run_sessions,
    session_durations,
)
from workloads.lib.prompts import (
    engine_context,
    input_counter,
    server_model,
    traffic_label,
    user_dataset,
)

SESSION_RATE = 4.0  # sessions/s arriving
THINK_MEDIAN_S = 0.2  # between an answer and the next question (log-normal, sigma 0.5)
TURN_TOKENS = (4, 48)  # each turn asks for its reference reply's length, clipped to these

REPORT = ReportSpec(
    throughput=reporting.REQUESTS,
    tokens=reporting.TOKENS,
    scenario=("dataset",),
    contender=("prefix_cache",),
    timing_floor=reporting.LAG_P99,
    latencies=reporting.STREAMED,
    plots=(reporting.TTFT_CDF, reporting.E2E_CDF, *reporting.TRAFFIC_PLOTS),
)

SESSION_HEADLINE = (
    Headline(label="TTFT p50 turn 1", metric="ttft_first_turn.p50", unit="ms", scale=1e3),
    Headline(label="later turns", metric="ttft_later_turns.p50", unit="ms", scale=1e3),
    *HEADLINE[2:],
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "dataset" in metafunc.fixturenames:
        traffic = settings_of(metafunc.config).traffic
        if traffic.session_spec is not None:
            label = traffic.session_spec.label
        else:
            label = traffic_label(traffic.dataset, datasets.DEFAULT_NAME)
        metafunc.parametrize("dataset", [label], ids=[label])


def spec_sessions(spec: SessionSpec, count: int, seed: int) -> list[Session]:
    """``count`` sessions as ``--session-spec`` describes them, seeded."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        turns = tuple(
            (Message("user", datasets.synthetic_text(rng, spec.user)),) for _ in range(spec.turns)
        )
        think = rng.lognormal(np.log(max(spec.think, 1e-9)), 0.5, size=spec.turns - 1)
        out.append(
            Session(
                turns=turns,
                max_tokens=(spec.reply,) * spec.turns,
                references=(datasets.synthetic_text(rng, spec.reply),) * spec.turns,
                think_s=tuple(float(t) if spec.think > 0 else 0.0 for t in think),
                session_id=f"s{seed}-{i}",
            )
        )
    return out


def to_sessions(entries: list[datasets.Entry], seed: int, ignore_eos: bool) -> list[Session]:
    """Each conversation's user turns, in order, and the reply lengths its references
    have (clipped to TURN_TOKENS); think times seeded."""
    rng = np.random.default_rng(seed)
    out = []
    for i, entry in enumerate(entries):
        turns, refs = _split(entry)
        think = rng.lognormal(np.log(THINK_MEDIAN_S), 0.5, size=len(turns) - 1)
        asked = tuple(int(np.clip(len(r.split()), *TURN_TOKENS)) for r in refs)
        out.append(
            Session(
                turns=tuple(turns),
                max_tokens=asked,
                references=tuple(refs),
                think_s=tuple(float(t) for t in think),
                ignore_eos=ignore_eos,
                session_id=f"s{seed}-{i}",
            )
        )
    return out


def _split(entry: datasets.Entry) -> tuple[list[tuple[Message, ...]], list[str]]:
    """The new messages of each turn (a system message rides with the first) and the
    reference reply after each."""
    turns: list[tuple[Message, ...]] = []
    refs: list[str] = []
    pending: list[Message] = []
    for m in entry.messages:
        if m.role == "assistant":
            refs.append(m.content)
            continue
        pending.append(m)
        if m.role == "user":
            turns.append(tuple(pending))
            pending = []
    refs = [*refs[: len(turns) - 1], entry.reference_output or "a reply"]
    return turns, refs


def turn_samples(turns: list[Turn]) -> dict[str, list[float]]:
    first = [t.record for t in turns if t.turn == 0 and t.record.ok]
    later = [t.record for t in turns if t.turn > 0 and t.record.ok]
    return {
        "ttft_first_turn": [r.t_first - r.t_sched for r in first],
        "ttft_later_turns": [r.t_first - r.t_sched for r in later],
        "e2e_first_turn": [r.t_last - r.t_sched for r in first],
        "e2e_later_turns": [r.t_last - r.t_sched for r in later],
    }


@pytest.mark.requires(family="generative", streaming=True)
@pytest.mark.report_spec(REPORT)
@pytest.mark.engine_setting("prefix_cache")
@pytest.mark.parametrize("prefix_cache", ["off", "on"])
def test_sessions(
    request: pytest.FixtureRequest,
    cell: Cell,
    open_engine: OpenEngine,
    harness_settings: RunSettings,
    aio: asyncio.Runner,
    dataset: str,
    prefix_cache: str,
) -> None:
    settings = harness_settings
    model = server_model(settings, cell.engine)
    on = prefix_cache == "on"
    engine, source = load_source(request, open_engine, cell, model, aio, prefix_caching=on)
    seed = settings.seed + 5000
    spec = settings.traffic.session_spec
    if spec is not None:
        rate, think = spec.rate, spec.think
        count = -(-settings.profile.gen_requests // spec.turns)  # turns enough for a p99
        sessions = spec_sessions(spec, count, seed)
    else:
        rate, think = SESSION_RATE, THINK_MEDIAN_S
        sessions = _enough(dataset_sessions(settings, engine, model, seed), settings)
    # a Poisson count over twice the time the sessions need: one arrival for each of them
    # (cutting sessions to the arrivals left 98 turns of the 100 a p99 needs)
    span = 2 * len(sessions) / rate
    arrivals = OpenLoop(rate=rate, duration=span).schedule(seed)[: len(sessions)]
    sessions = sessions[: len(arrivals)]
    before = read_counters(engine)
    server = watch_server(request, engine)  # the server's own view, until finish
    turns = aio.run(run_sessions(source.driver, sessions, arrivals))
    counters = engine_counters(before, read_counters(engine))
    records = [t.record for t in turns]
    samples = turn_samples(turns)
    extra = {key: stats.to_json(stats.summarize(values)) for key, values in samples.items()} | {
        "sessions": {
            "count": len(sessions),
            "turns": len(turns),
            "duration": stats.to_json(stats.summarize(session_durations(turns))),
            "open_at_once": active_sessions(turns),
            "rate_per_s": rate,
            "think_median_s": think,
            "source": "spec" if spec is not None else "dataset",
        },
        "prefix_cache": prefix_cache_account(counters),
        "engine_counters": counters,
    }
    finish(
        cell,
        settings,
        records,
        # no offered rate: a later turn is due when its session is ready, not on a clock
        # (each turn's lag against that time is still recorded)
        offered_rate=None,
        seed=seed,
        server=server,
        extra=extra,
        samples=samples | traffic_samples(records, None),
        headline=SESSION_HEADLINE,
    )


def dataset_sessions(
    settings: RunSettings, engine: GenerativeEngine, model: Path, seed: int
) -> list[Session]:
    """The multi-turn conversations of ``--dataset`` (or the generated ones; all of them
    when none has more than one turn), drawn with replacement."""
    data = user_dataset(settings, input_counter(model), engine_context(engine, model))
    multi = [e for e in data.dataset.entries if sum(m.role == "user" for m in e.messages) > 1]
    entries = datasets.select(
        data.dataset if not multi else _only(data.dataset, multi), 400, seed, replace=True
    )
    return to_sessions(list(entries), seed, ignore_eos=True)


def _only(dataset: datasets.Dataset, entries: list[datasets.Entry]) -> datasets.Dataset:
    return replace(dataset, entries=tuple(entries))


def _enough(sessions: list[Session], settings: RunSettings) -> list[Session]:
    """Sessions until their turns reach the profile's generative request count."""
    out, turns = [], 0
    for s in sessions:
        if turns >= settings.profile.gen_requests:
            break
        out.append(s)
        turns += len(s.turns)
    return out
