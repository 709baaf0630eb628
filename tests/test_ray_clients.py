"""Clients as Ray actors (harness.dist.rayclients) on a real two-host Ray cluster (network
namespaces this test creates): two clients, one per host, share one schedule against
the no-op streaming server on the head host; then the worker host is killed mid-run and
only its client's share is lost, each of those requests a failed request that says why.

``tox -e ray`` runs this (root, Ray installed); about a minute on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.netns import (
    NO_PHONE_HOME,
    Cluster,
    Host,
    can_make_namespaces,
    start_ray,
    two_hosts,
)

pytest.importorskip("ray", reason="Ray is not installed (tox -e ray)")
for module in ("httptools", "httpx"):
    pytest.importorskip(module, reason="the openai adapter's extra is not installed")
WHY_NOT = can_make_namespaces()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(WHY_NOT is not None, reason=f"no test hosts: {WHY_NOT}"),
]

REPO = Path(__file__).resolve().parents[1]
PORT = 8731
RATE = 100.0


def _env(cluster: Cluster) -> dict[str, str]:
    return {**os.environ, **NO_PHONE_HOME, **cluster.env}


def _server(head: Host) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "benchmarks.noop_server", "--port", str(PORT)]
    server = subprocess.Popen(
        head.argv([*argv, "--host", head.address]), cwd=REPO, env={**os.environ, **NO_PHONE_HOME}
    )
    deadline = time.monotonic() + 30
    probe = f"import socket; socket.create_connection(('{head.address}', {PORT}), 1)"
    while head.run([sys.executable, "-c", probe]).returncode != 0:
        assert server.poll() is None, "the no-op server exited"
        assert time.monotonic() < deadline, "the no-op server did not listen"
        time.sleep(0.2)
    return server


def _driver(
    head: Host, cluster: Cluster, seconds: float, marker: Path | None, port: int = PORT
) -> list[str]:
    url = f"http://{head.address}:{port}"
    args = [cluster.address, url, "2", str(RATE), str(seconds)]
    return head.argv(
        [
            sys.executable,
            "-m",
            "tests.support.ray_clients_driver",
            *args,
            *([str(marker)] if marker else []),
        ]
    )


def _run_driver(head: Host, cluster: Cluster, seconds: float, port: int = PORT) -> dict[str, Any]:
    """One whole driver run; its merged run."""
    done = subprocess.run(
        _driver(head, cluster, seconds, None, port),
        cwd=REPO,
        env=_env(cluster),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return _doc(done.stdout)


def _doc(stdout: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return doc


def test_clients_as_ray_actors_on_two_hosts(tmp_path):
    with two_hosts("c") as (head, worker):
        temp = Path(tempfile.mkdtemp(prefix="hxrc", dir="/tmp"))  # AF_UNIX paths: short
        cluster = start_ray(head, worker, temp)
        server = _server(head)
        try:
            first = _run_driver(head, cluster, 4.0)
            check_whole_run(first, head, worker)
            unloaded = _run_driver(head, cluster, 2.0, port=PORT + 1)  # nothing listens there
            check_clients_that_cannot_load(unloaded)
            lost = _kill_worker_mid_run(head, worker, cluster, tmp_path / "ready")
            check_lost_client(lost, head, worker)
            print(json.dumps(figures(first, lost), indent=1))
        finally:
            server.kill()
            server.wait(10)


def check_whole_run(doc: dict[str, Any], head: Host, worker: Host) -> None:
    clients = doc["per_client"]
    assert [c["error"] for c in clients] == [None, None], clients
    assert doc["launcher"] == "ray-actors"
    assert doc["clock"] == "wall"  # clients on other machines: wall-clock alignment
    # one client on each host (SPREAD, one CPU each), each with its half of the schedule
    hosts = sorted(c["host"].rsplit("(", 1)[1].rstrip(")") for c in clients)
    assert hosts == sorted([head.address, worker.address])
    assert [(c["requests"], c["ok"], c["failed"]) for c in clients] == [(200, 200, 0)] * 2
    # every request once, in its place: the server answered as many tokens as it asked
    assert doc["n"] == 400
    assert all(doc["ok"])
    assert doc["n_out"] == doc["asked"]
    assert doc["sched_error_s"] < 1e-6  # merged on the common schedule
    assert doc["achieved_over_offered"] > 0.9
    # a client on the other host, on wall-clock time: lag bounded by NTP-free alignment
    assert doc["lag_p99_s"] is not None
    assert doc["lag_p99_s"] < 0.2
    assert all(c["start_late_s"] < 0.5 for c in clients)


def check_clients_that_cannot_load(doc: dict[str, Any]) -> None:
    """Both clients fail before the start (their engine cannot reach the server): each
    share is failed requests naming the client and the engine's error."""
    assert doc["n"] == 200
    assert not any(doc["ok"])
    for client in doc["per_client"]:
        assert (client["requests"], client["ok"], client["failed"]) == (100, 0, 100)
        assert client["error"].startswith(f"client {client['index']} (Ray actor): ")
        assert "EngineError" in client["error"]
    assert len(doc["errors"]) == 2


def _kill_worker_mid_run(
    head: Host, worker: Host, cluster: Cluster, marker: Path
) -> dict[str, Any]:
    with subprocess.Popen(
        _driver(head, cluster, 8.0, marker),
        cwd=REPO,
        env=_env(cluster),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as driver:
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert driver.poll() is None, driver.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "the clients never got ready"
            time.sleep(0.1)
        assert json.loads(marker.read_text()) == []  # both clients ready
        time.sleep(3.0)  # the start is 1 s after ready: about 2 s into the 8 s schedule
        assert worker.kill_all() > 0
        out, err = driver.communicate(timeout=240)
    assert driver.returncode == 0, err[-4000:]
    return _doc(out)


def check_lost_client(doc: dict[str, Any], head: Host, worker: Host) -> None:
    by_host = {
        (c["host"] or "").rsplit("(", 1)[-1].rstrip(")") if c["host"] else None: c
        for c in doc["per_client"]
    }
    survivor = by_host.pop(head.address)
    (lost,) = by_host.values()
    # the head's client ran its whole share; the worker's client is one failure, named
    assert (survivor["requests"], survivor["ok"], survivor["failed"]) == (400, 400, 0)
    # a dead client's records died with it: its whole share is failed requests
    assert (lost["requests"], lost["ok"], lost["failed"]) == (400, 0, 400)
    assert lost["host"] is None
    assert "Ray actor" in lost["error"]
    assert "failed during the run" in lost["error"]
    # nothing dropped: every request is in the run, the lost ones as failed requests
    assert doc["n"] == 800
    (error,) = doc["errors"]
    assert error.startswith(f"client {lost['index']} failed: client {lost['index']} (Ray actor)")
    assert sum(doc["ok"]) == 400


def figures(whole: dict[str, Any], lost: dict[str, Any]) -> dict[str, Any]:
    """What the closing note quotes: alignment across hosts, and what a lost client says."""
    keep = ("index", "host", "lag_p99_s", "start_late_s")
    return {
        "whole_run": {
            "lag_p99_ms": round(whole["lag_p99_s"] * 1e3, 3),
            "achieved_over_offered": round(whole["achieved_over_offered"], 4),
            "clients": [{k: c[k] for k in keep} for c in whole["per_client"]],
        },
        "lost_client_error": next(c["error"] for c in lost["per_client"] if c["error"]),
    }
