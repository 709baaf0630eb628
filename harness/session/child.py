"""One spawned worker process, seen from the controller: its events, output, memory, end.

The worker writes JSON events, one per line, to a pipe of its own (its stdout and
stderr belong to the engine, which may print anything). Both are read by threads into
a queue, so the controller waits on one thing with a deadline. Output lines are
redacted, appended to a log file in the run directory and kept as a short tail for
the record of a crashed or timed-out cell.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil

from harness.results.redact import known_secrets, redact_text

TAIL_LINES = 100  # a faulthandler dump of a deep stack fits
KILL_GRACE_S = 3.0
MAX_LINE = 1000


@dataclass(frozen=True)
class Event:
    """A message from the worker; ``kind`` "exit" is synthesized when its pipe closes."""

    kind: str
    data: dict[str, Any]


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (the out-of-memory killer sends this)" if -returncode == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exit code {returncode}"


class Child:
    """A worker process started by ``spawn``; every method is safe after it died."""

    def __init__(
        self, proc: subprocess.Popen[bytes], events: IO[bytes], log: Path, started: float
    ) -> None:
        self.proc = proc
        self.started = started
        self.queue: queue.Queue[Event] = queue.Queue()
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._log = log
        self._secrets = known_secrets()
        self._threads = [
            threading.Thread(target=self._read_events, args=(events,), daemon=True),
            threading.Thread(target=self._read_output, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_events(self, stream: IO[bytes]) -> None:
        with stream:
            for line in stream:
                try:
                    data = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line from a dying worker
                if isinstance(data, dict) and isinstance(data.get("ev"), str):
                    self.queue.put(Event(data.pop("ev"), data))
        self._threads[1].join(timeout=5.0)  # the output tail is complete before "exit"
        self.queue.put(Event("exit", {}))

    def _read_output(self) -> None:
        out = self.proc.stdout
        if out is None:
            return
        log: IO[str] | None = None
        with contextlib.suppress(OSError):
            log = self._log.open("a", encoding="utf-8")
        with out:
            for raw in out:
                text = raw.decode(errors="replace").rstrip("\n")[:MAX_LINE]
                line = redact_text(text, self._secrets)
                self.tail.append(line)
                log = self._append(log, line)
        if log is not None:
            log.close()

    def _append(self, log: IO[str] | None, line: str) -> IO[str] | None:
        """Keep reading (a worker blocked on a full pipe would stall) even when the log
        cannot be written; the tail still holds the end, and says why the log stops."""
        if log is None:
            return None
        try:
            log.write(line + "\n")
            log.flush()
        except OSError as exc:
            self.tail.append(f"[harness: worker log {self._log} stopped: {exc}]")
            with contextlib.suppress(OSError):
                log.close()
            return None
        return log

    def next_event(self, timeout: float) -> Event | None:
        try:
            return self.queue.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None

    def rss_bytes(self) -> int:
        """Resident memory of the worker and everything it started (engine cores, servers)."""
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
        return total

    def dump_stacks(self) -> None:
        """Ask a hung worker for every thread's stack (faulthandler on SIGUSR1) for the log."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGUSR1)
        time.sleep(0.5)

    def kill(self) -> int:
        """Terminate the worker and its whole process tree; return its exit status."""
        try:
            tree = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        # Children first: a server in a session of its own would outlive its parent.
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        if self.proc.poll() is None:
            self.proc.terminate()
        _, alive = psutil.wait_procs(tree, timeout=KILL_GRACE_S)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        try:
            return self.proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def wait(self, timeout: float = KILL_GRACE_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return self.kill()

    def close(self) -> None:
        for thread in self._threads:
            thread.join(timeout=5.0)


def spawn(argv: Sequence[str], cwd: Path, env: dict[str, str], log: Path) -> Child:
    """Start ``argv`` with an events pipe, whose fd number (``pass_fds`` keeps it) is
    appended as ``--harness-events-fd``."""
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            [*argv, f"--harness-events-fd={write_fd}"],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(write_fd,),
            # Its own session: a Ctrl-C at the terminal reaches the controller only, which
            # decides what the interrupted cell's record says and then stops the worker.
            start_new_session=True,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return Child(proc, os.fdopen(read_fd, "rb"), log, time.monotonic())
