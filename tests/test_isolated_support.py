"""tests/support/isolated.started: the runs it starts take SIGINT even when these tests were
started with SIGINT ignored (a background shell, nohup, a CI runner), and leave nothing behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.isolated import sigint_ignored, started

# Reports its SIGINT handler, starts a grandchild in a session of its own (as the harness
# starts its workers), prints both pids and sleeps until killed.
PARENT = """
import signal, subprocess, sys, time
handler = signal.getsignal(signal.SIGINT)
print("default" if handler is signal.default_int_handler else repr(handler), flush=True)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                         start_new_session=True)
print(child.pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_started_run_takes_sigint_and_leaves_no_process_behind(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", PARENT]
    failed = pytest.raises(AssertionError, match="stands for a failed test")
    with failed, sigint_ignored(), started(argv, tmp_path, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "default"
        grandchild = int(proc.stdout.readline())
        pids = [proc.pid, grandchild]
        assert all(_alive(pid) for pid in pids)
        raise AssertionError("stands for a failed test")
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)]


def test_a_signalled_run_stops_on_sigint_from_a_background_shell(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    with sigint_ignored(), started(argv, tmp_path, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "up"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == -signal.SIGINT  # not a hang until killed
