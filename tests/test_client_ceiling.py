"""The load generator's own ceiling (workloads/lib/clientceiling.py): measured against the
harness's no-op streaming server with the real ``openai`` adapter, and what
``--clients auto`` and the warning make of it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.exceptions import UsageError
from harness.load import noopserver
from harness.session.config import AUTO_CLIENTS, PROFILES, ProfileName
from harness.session.pytestoptions import parse_settings
from tests.support.runner import run_workloads
from workloads.lib import clientceiling
from workloads.lib.clientceiling import Ceiling, clients_for, warning

REPO = Path(__file__).resolve().parents[1]


def test_clients_for_keeps_each_process_under_its_share() -> None:
    found = Ceiling(400.0, ())
    assert clients_for(100.0, found) == 1  # 100 <= 0.5 * 400
    assert clients_for(201.0, found) == min(2, os.cpu_count() or 1)
    assert clients_for(10_000.0, found) == (os.cpu_count() or 1)  # one per core at most
    assert clients_for(5.0, Ceiling(0.0, ())) == (os.cpu_count() or 1)


def test_the_warning_names_the_load_and_the_ceiling() -> None:
    found = Ceiling(400.0, ())
    assert warning(200.0, 1, found) is None
    text = warning(300.0, 1, found)
    assert text is not None
    assert text.startswith("client near its ceiling: each of 1 client process(es) was offered 300")
    assert "400 req/s one client process sustains here" in text
    assert warning(300.0, 2, found) is None


def settings(clients: str, engine: str = "null"):  # type: ignore[no-untyped-def]
    return parse_settings(
        engine=[engine], device="cpu", profile="quick", results_dir="r", seed=0, clients=clients
    )


def test_clients_auto_is_an_option_value() -> None:
    assert settings("auto").clients == AUTO_CLIENTS
    assert settings("3", "openai").clients == 3
    with pytest.raises(UsageError, match="--clients 'many': give a number of processes or auto"):
        settings("many")


@pytest.mark.slow
def test_the_ceiling_is_measured_against_the_noop_server() -> None:
    pytest.importorskip("httptools")
    policy = PROFILES[ProfileName.QUICK].policy
    with asyncio.Runner() as aio:
        found = clientceiling.measure("openai", {}, policy, aio)
    rates = [s["rate_per_s"] for s in found.steps]
    assert rates == list(clientceiling.LADDER[: len(rates)])  # in order, stopping at a miss
    assert found.rate_per_s >= 100.0  # a single client streams more than this here
    passed = [s for s in found.steps if s["ok"]]
    assert all(s["lag_p99_s"] <= policy.max_lag_p99_s for s in passed)
    assert found.rate_per_s == max(s["rate_per_s"] for s in passed)


@contextlib.contextmanager
def noop_url():
    port = noopserver.free_port()
    cmd = [sys.executable, "-m", "harness.load.noopserver", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                __import__("socket").create_connection(("127.0.0.1", port), 0.5).close()
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(10)


@pytest.mark.slow
def test_clients_auto_sizes_a_cell_from_the_measured_ceiling(tmp_path: Path) -> None:
    pytest.importorskip("httptools")
    with noop_url() as url:
        run = run_workloads(
            tmp_path,
            "--engine=openai",
            f"--engine-opt=openai.base_url={url}",
            "--clients=auto",
            "--requests=100",
            "-k",
            "test_streaming and open-12",
        )
    assert run.returncode == 0, run.stdout[-3000:]
    (record,) = run.records.values()
    sized = record.metrics["client_ceiling"]
    assert sized["auto"] is True
    assert sized["rate_per_s"] > 0
    expected = clients_for(sized["offered_per_s"], Ceiling(sized["rate_per_s"], ()))
    assert sized["clients"] == expected
    assert sized["warning"] is None
