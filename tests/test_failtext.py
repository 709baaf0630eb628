"""A cell the engine cannot serve fails in one line on the terminal (issue 35: a dead
server gave about 370 lines of chained tracebacks per run of four cells)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.exceptions import EngineError
from harness.session import failtext

REPO = Path(__file__).resolve().parents[1]


def _report(exc: BaseException) -> pytest.TestReport:
    try:
        raise exc
    except BaseException:
        info = pytest.ExceptionInfo.from_current()
    return pytest.TestReport("w.py::t[a]", ("w.py", 1, "t"), {}, "failed", info.getrepr(), "call")


def test_an_engine_error_becomes_one_line_naming_where_the_traceback_is():
    rep = _report(EngineError("OpenAI endpoint http://127.0.0.1:9 not usable: refused"))
    assert failtext.shorten(rep, "the worker's log, /r/logs/w.log")
    assert rep.longreprtext == (
        "the engine could not serve this cell: OpenAI endpoint http://127.0.0.1:9 not usable:"
        " refused (traceback: the worker's log, /r/logs/w.log)"
    )


def test_other_failures_keep_their_traceback():
    rep = _report(AssertionError("a workload's own bug"))
    before = rep.longreprtext
    assert not failtext.shorten(rep, "x")
    assert rep.longreprtext == before
    assert "Traceback" in before or "AssertionError" in before


def test_in_process_the_traceback_goes_to_the_runs_log(tmp_path):
    rep = _report(EngineError("engine failed to load"))
    full = rep.longreprtext
    failtext.shorten_in_process(rep, tmp_path / "logs")
    log = tmp_path / "logs" / failtext.IN_PROCESS_LOG
    assert rep.longreprtext.endswith(f"(traceback: {log})")
    assert full in log.read_text()
    assert log.read_text().startswith("w.py::t[a] (call):\n")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again on leaving: nothing listens there


@pytest.mark.slow  # a real run of four cells against a port nothing listens on: ~6 s
@pytest.mark.parametrize("isolation", ["process", "none"])
def test_a_dead_server_gives_one_line_per_cell(tmp_path, isolation):
    url = f"http://127.0.0.1:{_closed_port()}"
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "--engine=openai",
        f"--engine-opt=openai.base_url={url}",
        "-k",
        "test_streaming",
        f"--results-dir={tmp_path / 'r'}",
        f"--isolation={isolation}",
        "-p",
        "no:cacheprovider",
    ]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == pytest.ExitCode.TESTS_FAILED, out.stdout[-3000:]
    failures = out.stdout.split("= FAILURES =")[1].split("= harness result matrix =")[0]
    lines = [ln for ln in failures.splitlines() if ln.strip() and ln[0] not in "_="]
    assert len(lines) == 4, failures
    assert all(line.startswith("the engine could not serve this cell: ") for line in lines)
    assert f"OpenAI endpoint {url} not usable" in lines[0]
    assert "Traceback" not in out.stdout
    assert "httpx" not in failures
    [run_dir] = (tmp_path / "r").iterdir()
    logs = "\n".join(p.read_text() for p in (run_dir / "logs").iterdir())
    assert "httpx.ConnectError" in logs  # the whole story, where the line says it is
