"""One writer per run directory: an ``flock`` that dies with the process holding it.

The controller of a run (or of its ``--resume``) holds an exclusive lock on
``<run-dir>/.owner`` for as long as it writes the run. A second controller is refused
with the owner's pid; a reader asks ``owner()`` to tell a run that is still being written
from one whose controller was killed (its manifest still says "running", but nobody
holds the lock: the run is interrupted, and resumable). Workers of the run write records
under their controller's lock and never take it themselves.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

from harness.exceptions import RunLocked

LOCK_FILE = ".owner"
RETRY_S = 2.0  # a reader's probe holds the lock for microseconds; never wait for a writer


@dataclass(frozen=True)
class Owner:
    """Who holds a run directory (as far as its lock file says)."""

    pid: int | None
    host: str | None
    since: str | None

    def describe(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "another process"
        where = f" on {self.host}" if self.host else ""
        when = f", since {self.since}" if self.since else ""
        return who + where + when


def _read_owner(path: Path) -> Owner:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return Owner(None, None, None)
    if not isinstance(data, dict):
        return Owner(None, None, None)
    pid = data.get("pid")
    return Owner(
        pid if isinstance(pid, int) else None,
        str(data["host"]) if "host" in data else None,
        str(data["since"]) if "since" in data else None,
    )


class RunLock:
    """The exclusive lock of one run directory, held until ``release`` or process death."""

    def __init__(self, run_dir: Path, fd: int) -> None:
        self.run_dir = run_dir
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


def acquire(run_dir: Path, since: str) -> RunLock:
    """Take the run directory's lock or raise ``RunLocked`` naming the owner.

    The descriptor is not inherited by workers (``O_CLOEXEC``): a lock that outlived its
    controller in an orphaned child would make a dead run look alive.
    """
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + RETRY_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise
            if time.monotonic() >= deadline:
                os.close(fd)
                raise RunLocked(
                    f"{run_dir} is being written by {_read_owner(path).describe()}; wait for"
                    " that run to finish (or stop it), then try again"
                ) from None
            time.sleep(0.05)
    stamp = json.dumps({"pid": os.getpid(), "host": platform.node(), "since": since})
    os.ftruncate(fd, 0)
    os.pwrite(fd, stamp.encode() + b"\n", 0)
    return RunLock(run_dir, fd)


def owner(run_dir: Path) -> Owner | None:
    """The live process that holds ``run_dir``, or None when nobody does.

    A shared lock is taken and dropped at once: it fails only while a writer holds the
    exclusive one. A directory that cannot be opened for this (read-only media, no lock
    file: a run written before locks existed) has no live owner that we can see.
    """
    path = run_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return _read_owner(path)
        return None
    finally:
        os.close(fd)  # also drops the shared lock if it was taken
    return None
