"""GPU check: what the harness can run on this machine's GPU, with the packages it has.

Prints the environment fingerprint and the engines' availability, runs the conformance
suite (tests/test_gpu_conformance.py) and a quick profile of the tensor workloads for
every tensor engine that can run on the device, then says what ran, what was skipped
and why. Writes its run directory (and a summary) under --out. Installs nothing.

    scripts/gpu-check [--device cuda] [--out DIR] [--budget-s 480]

``--device cpu`` runs the same steps on the CPU (to check the script itself).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a bare source tree: the harness need not be installed
NEEDED = ("numpy", "pydantic", "psutil", "pytest", "rich", "scipy", "onnx")
WORKLOADS = "test_batching.py or test_shapes.py or test_preprocessing.py"


def _say(text: str) -> None:
    print(f"\n=== gpu-check: {text}", flush=True)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
    )
    return env


def _run(args: list[str], env: dict[str, str], timeout: float) -> int:
    print("$", " ".join(args), flush=True)
    try:
        return subprocess.run(
            args, cwd=REPO, env=env, timeout=max(timeout, 30), check=False
        ).returncode
    except subprocess.TimeoutExpired:
        print(f"gpu-check: stopped after {timeout:.0f} s (budget)")
        return 124


def _missing() -> list[str]:
    return [m for m in NEEDED if importlib.util.find_spec(m) is None]


def _tensor_engines(device: str) -> dict[str, str]:
    """Every registered tensor engine -> '' if it can run on ``device``, else the reason."""
    from harness import registry  # noqa: PLC0415

    out = {}
    for name in registry.names():
        status = registry.status(name, device)
        if status.family == "tensor" and not name.startswith("null"):
            out[name] = "" if status.availability.available else status.availability.reason
    return out


def _summary(run_dir: Path) -> dict[str, list[str]]:
    from harness import store  # noqa: PLC0415

    out: dict[str, list[str]] = {}
    for rec in store.read_records(run_dir):
        line = rec.cell_id + (f": {rec.reasons[0]}" if rec.reasons else "")
        out.setdefault(rec.status.value, []).append(line)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=REPO / "results" / "gpu-check")
    p.add_argument("--budget-s", type=float, default=480.0, help="whole check (default 480)")
    p.add_argument("--window", type=float, default=1.5, help="measured window per cell (s)")
    p.add_argument("--workloads", default=WORKLOADS, help=f"pytest -k selection ({WORKLOADS})")
    args = p.parse_args(argv)
    start = time.monotonic()
    left = lambda: args.budget_s - (time.monotonic() - start)  # noqa: E731
    env = _env() | {"HARNESS_CONFORMANCE_DEVICE": args.device}
    missing = _missing()
    if missing:
        print(f"gpu-check: the harness needs {', '.join(missing)}, not installed here")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    env.setdefault("HARNESS_CACHE_DIR", str(args.out / "cache"))

    _say("environment fingerprint")
    from harness.environment import fingerprint  # noqa: PLC0415

    print(json.dumps(fingerprint(), indent=1, default=str))
    _say(f"engines on {args.device}")
    _run([sys.executable, "-m", "harness", "engines", "--device", args.device], env, 60)
    engines = _tensor_engines(args.device)
    runnable = [n for n, why in engines.items() if not why]
    for name, why in engines.items():
        print(f"  {name}: {'runs' if not why else 'skipped: ' + why}")

    _say("conformance suite")
    conformance = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/test_gpu_conformance.py",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rs",
        ],
        env,
        left() * 0.4,
    )
    workloads = 0
    runs = args.out / "runs"
    if runnable:
        _say(f"quick tensor workloads on {', '.join(runnable)}")
        workloads = _run(
            [
                sys.executable,
                "-m",
                "pytest",
                "workloads",
                "-p",
                "no:cacheprovider",
                f"--engine={','.join(runnable)}",
                f"--device={args.device}",
                "--profile=quick",
                f"--window={args.window}",
                f"--results-dir={runs}",
                "-k",
                args.workloads,
            ],
            env,
            left() - 15,
        )
    _say("summary")
    report = {
        "device": args.device,
        "engines": engines,
        "conformance_exit": conformance,
        "workloads_exit": workloads,
        "seconds": round(time.monotonic() - start, 1),
    }
    dirs = sorted(runs.iterdir()) if runs.is_dir() else []
    if dirs:
        report["run_dir"] = str(dirs[-1])
        report["cells"] = _summary(dirs[-1])
    (args.out / "summary.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0 if conformance in (0, 5) and workloads == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
