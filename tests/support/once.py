"""A module's expensive run made once per test session, whichever xdist worker asks first.

A module-scoped fixture runs once per pytest-xdist worker that gets one of its module's
tests, and ``--dist load`` splits a module between the two workers whenever a batch ends
inside it: tests/test_isolation.py's fault run (about 70 s) then ran twice in one session.
Grouping the tests instead (``--dist loadgroup``) made the whole step slower (CI,
2026-12-07: 692 s against 615 s), so the fixture's value is shared: the first worker makes
it under a lock in the session's common temporary directory and pickles it there; a
worker that asks later, or while it is being made, waits and reads it back. Without xdist
the value is simply made.
"""

from __future__ import annotations

import fcntl
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

import pytest

T = TypeVar("T")


def once(request: pytest.FixtureRequest, make: Callable[[Path], T]) -> T:
    """``make(directory)`` once per session for the requesting fixture; its value is
    pickled (a failure is not: the next worker that asks tries again, and fails alike)."""
    factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
    key = f"{request.module.__name__}.{request.fixturename}"
    worker = getattr(request.config, "workerinput", None)
    if worker is None:
        return make(factory.mktemp(key, numbered=True))
    # xdist gives each worker <session basetemp>/popen-gwN: their parent is the session's
    shared = factory.getbasetemp().parent / f"once-{worker['testrunuid']}"
    shared.mkdir(exist_ok=True)
    with (shared / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = shared / f"{key}.pickle"
        if made.exists():
            return cast(T, pickle.loads(made.read_bytes()))
        where = shared / key
        where.mkdir(exist_ok=True)
        value = make(where)
        made.write_bytes(pickle.dumps(value))
        return value
