"""The event loop the load generators run on: uvloop where it is installed (the openai
extra brings it), else asyncio's own.

uvloop runs the streaming client's loop in libuv (C) instead of Python: measured on one
core against the no-op server (docs/measurements.md, "The streaming client"), one client
process sustains about 10,000 streamed requests/s on it and 9,000 on asyncio's loop, at
the same generator lag. ``HARNESS_EVENT_LOOP=asyncio`` keeps asyncio's loop (to compare,
or where an engine's library insists on it); the loop that ran is in the openai engine's
``describe()``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from harness.exceptions import UsageError

T = TypeVar("T")

ENV = "HARNESS_EVENT_LOOP"
CHOICES = ("auto", "uvloop", "asyncio")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the harness's event loops; a UsageError for an unknown choice or
    uvloop asked for where it is not installed."""
    choice = os.environ.get(ENV, "auto") or "auto"
    if choice not in CHOICES:
        raise UsageError(f"{ENV}={choice!r}: choose one of {', '.join(CHOICES)}")
    has_uvloop = importlib.util.find_spec("uvloop") is not None
    if choice == "uvloop" and not has_uvloop:
        raise UsageError(f"{ENV}=uvloop, but uvloop is not installed (pip install uvloop)")
    if choice == "asyncio" or not has_uvloop:
        return asyncio.new_event_loop
    return _uvloop


def _uvloop() -> asyncio.AbstractEventLoop:
    import uvloop  # noqa: PLC0415

    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def runner() -> asyncio.Runner:
    return asyncio.Runner(loop_factory=loop_factory())


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the harness's loop."""
    with runner() as r:
        return r.run(main)


def new_loop() -> asyncio.AbstractEventLoop:
    return loop_factory()()
