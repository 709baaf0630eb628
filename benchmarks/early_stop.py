"""Does the over-saturation early stop make a capacity search faster, and find the same knee?

Runs the tensor capacity workload (``workloads/test_load.py::test_capacity``, no batching)
against the ``null`` engine with a fixed service time, so the server saturates at a known
rate (1 / service time, less the harness's own time per request), once with
``--early-stop=on`` and once with ``--early-stop=off``, in alternating order over
``--rounds`` rounds. Each run is a whole pytest session, as a user runs it: the wall time
includes its start (a few seconds, the same for both).

    python -m benchmarks.early_stop --rounds 2 --out /tmp/early-stop.json

``--workload generative`` runs the generative capacity workload
(``test_generative_capacity``, open loop through the streaming driver) on ``null-gen``
instead: ``--max-num-seqs`` sequences at a time, ``--token-time`` seconds a token, so it
serves about max_num_seqs / (tokens per reply x token time) requests/s (the workload's
replies average about 17 tokens), with a stand-in model directory (null-gen reads only
its vocabulary size).

    python -m benchmarks.early_stop --workload generative --rounds 2

Prints a Markdown table: wall time, the capacity (knee) and the rate it failed at, the
points stopped early and the scheduled seconds they saved, and the ratio of wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NODE = "workloads/test_load.py::test_capacity"
SELECT = "none"  # the no-batching cell: one request at a time, a D/1-like server
GENERATIVE_NODE = "workloads/test_load.py::test_generative_capacity"
RECORDS = {"tensor": "capacity.*.json", "generative": "generative_capacity.*.json"}
SLOS = {"tensor": "e2e_p99=100ms", "generative": "ttft_p99=500ms,e2e_p99=1s"}


def engine_args(args: argparse.Namespace, root: Path) -> list[str]:
    """The workload's node and its engine's options."""
    if args.workload == "tensor":
        return [
            NODE,
            "-k",
            SELECT,
            "--engine=null",
            f"--engine-opt=null.service_time_s={args.service_time:g}",
        ]
    model = root / "model"  # null-gen needs no weights: only the vocabulary's size
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    return [
        GENERATIVE_NODE,
        "--engine=null-gen",
        f"--engine-opt=null-gen.token_time_s={args.token_time:g}",
        f"--engine-opt=null-gen.max_num_seqs={args.max_num_seqs}",
        f"--model={model}",
    ]


def run_once(early_stop: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One pytest session of the capacity cell; its wall time and search."""
    results = root / f"runs-{early_stop}-{time.monotonic_ns()}"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *engine_args(args, root),
        "-p",
        "no:cacheprovider",
        "-q",
        f"--slo={args.slo or SLOS[args.workload]}",
        f"--early-stop={early_stop}",
        f"--results-dir={results}",
    ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    record = next(results.rglob(RECORDS[args.workload]))
    metrics = json.loads(record.read_text())["metrics"]
    search = metrics["search"]
    return {
        "early_stop": early_stop,
        "wall_s": wall,
        "capacity": search["capacity"],
        "fails_at": search["bracket"][1],
        "points": len(search["points"]),
        "stopped": search["early_stop"]["points"],
        "saved_s": search["early_stop"]["saved_s"],
        "measured_s": sum(p["window_s"] for p in search["points"]),
    }


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| early stop | wall s | capacity req/s | fails at req/s | points | stopped early"
        " | scheduled s saved | measured s |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in runs:
        stopped = ", ".join(f"{x:.0f}" for x in r["stopped"]) or "-"
        lines.append(
            f"| {r['early_stop']} | {r['wall_s']:.1f} | {r['capacity']:.1f} |"
            f" {r['fails_at']:.1f} | {r['points']} | {stopped} | {r['saved_s']:.1f} |"
            f" {r['measured_s']:.1f} |"
        )
    return "\n".join(lines)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    wall = {k: sum(r["wall_s"] for r in runs if r["early_stop"] == k) for k in ("on", "off")}
    knees = {k: [r["capacity"] for r in runs if r["early_stop"] == k] for k in ("on", "off")}
    return {"wall_s": wall, "ratio_on_off": wall["on"] / wall["off"], "capacity": knees}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(RECORDS), default="tensor")
    parser.add_argument("--service-time", type=float, default=0.005, help="null's seconds/call")
    parser.add_argument("--token-time", type=float, default=0.003, help="null-gen's s/token")
    parser.add_argument("--max-num-seqs", type=int, default=4, help="null-gen's concurrency")
    parser.add_argument("--slo", help="the capacity's objective (default: by workload)")
    parser.add_argument("--rounds", type=int, default=1, help="on/off pairs, order alternating")
    parser.add_argument("--out", type=Path, help="write every run and the summary as JSON")
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="early-stop-") as tmp:
        for i in range(args.rounds):
            order = ("on", "off") if i % 2 == 0 else ("off", "on")
            runs.extend(run_once(mode, args, Path(tmp)) for mode in order)
    s = summary(runs)
    doc = {"workload": args.workload, "runs": runs, "summary": s, "cpus": os.cpu_count()}
    print(table(runs))
    print(
        f"\nwall: on {s['wall_s']['on']:.1f} s, off {s['wall_s']['off']:.1f} s"
        f" (on/off {s['ratio_on_off']:.2f}); capacity on {s['capacity']['on']},"
        f" off {s['capacity']['off']}"
    )
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
