"""Test hosts as Linux network namespaces, and a Ray cluster across them.

Ray binds to the machine's non-loopback address even when told 127.0.0.1, and tests may
send traffic only to loopback or to the test's own hosts. So the cluster lives in
namespaces this module creates and removes: a *head* and a *worker* namespace joined by
a veth pair with addresses of the test's own (10.213.0.0/24), each with ``lo`` up and
nothing else. Nothing in them can reach any other network.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.213.0"
RAY_PORT = 6390
NO_PHONE_HOME = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    # a dead node is noticed in seconds, not the default half minute
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


def can_make_namespaces() -> str | None:
    """None when this process may create namespaces, else why not."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"hxprobe{os.getpid()}"
    made = subprocess.run(
        ["ip", "netns", "add", probe], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class Host:
    ns: str
    address: str

    def argv(self, args: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *args]

    def run(
        self, args: Sequence[str], extra_env: dict[str, str] | None = None, **kw: object
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **NO_PHONE_HOME, **(extra_env or {})}
        return subprocess.run(
            self.argv(args), env=env, text=True, capture_output=True, check=False, **kw
        )  # type: ignore[call-overload, no-any-return]

    def pids(self) -> list[int]:
        out = subprocess.run(
            ["ip", "netns", "pids", self.ns], capture_output=True, text=True, check=False
        )
        return [int(p) for p in out.stdout.split()]

    def kill_all(self) -> int:
        """SIGKILL every process in the namespace: the host drops off the network."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)


@contextlib.contextmanager
def two_hosts(tag: str) -> Iterator[tuple[Host, Host]]:
    """A head and a worker host joined by a veth pair; removed with all their processes."""
    head, worker = Host(f"hx{tag}h", f"{SUBNET}.1"), Host(f"hx{tag}w", f"{SUBNET}.2")
    try:
        for host in (head, worker):
            _ip("netns", "add", host.ns)
            _ip("-n", host.ns, "link", "set", "lo", "up")
        _ip("link", "add", f"hx{tag}a", "type", "veth", "peer", "name", f"hx{tag}b")
        for host, dev in ((head, f"hx{tag}a"), (worker, f"hx{tag}b")):
            _ip("link", "set", dev, "netns", host.ns)
            _ip("-n", host.ns, "addr", "add", f"{host.address}/24", "dev", dev)
            _ip("-n", host.ns, "link", "set", dev, "up")
        yield head, worker
    finally:
        for host in (worker, head):
            host.kill_all()
            subprocess.run(["ip", "netns", "del", host.ns], check=False, capture_output=True)


def ray_cli() -> str:
    """The ``ray`` command of this interpreter's environment."""
    found = Path(sys.executable).parent / "ray"
    return str(found) if found.exists() else "ray"


@dataclass(frozen=True)
class Cluster:
    address: str
    env: dict[str, str]
    """What a driver needs in its environment: Ray's token authentication on."""


def start_ray(head: Host, worker: Host, temp: Path, cpus: int = 1) -> Cluster:
    """A Ray head (``cpus`` CPUs) in ``head`` and a worker node in ``worker``, with a
    fresh cluster token (Ray 2.59+ authenticates node and driver connections)."""
    address = f"{head.address}:{RAY_PORT}"
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    common = ["--num-cpus", str(cpus), "--disable-usage-stats", f"--temp-dir={temp}"]
    started = head.run(
        [
            ray_cli(),
            "start",
            "--head",
            f"--node-ip-address={head.address}",
            f"--port={RAY_PORT}",
            "--include-dashboard=false",
            *common,
        ],
        auth,
        timeout=180,
    )
    if started.returncode != 0:
        raise RuntimeError(f"ray head did not start: {started.stdout}\n{started.stderr}")
    joined = worker.run(
        [
            ray_cli(),
            "start",
            f"--address={address}",
            f"--node-ip-address={worker.address}",
            *common,
        ],
        auth,
        timeout=180,
    )
    if joined.returncode != 0:
        raise RuntimeError(f"ray worker did not join: {joined.stdout}\n{joined.stderr}")
    _wait_for_nodes(head, address, 2, auth)
    return Cluster(address, auth)


def _wait_for_nodes(
    head: Host, address: str, n: int, auth: dict[str, str], timeout_s: float = 60.0
) -> None:
    probe = (
        "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False);"
        " print(sum(1 for x in ray.nodes() if x['Alive']))"
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = head.run([sys.executable, "-c", probe, address], auth, timeout=60)
        if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(n)]:
            return
        time.sleep(1)
    raise RuntimeError(f"the Ray cluster at {address} never had {n} live nodes")
