"""The harness's own accuracy on a GPU: one torch model timed in a plain loop and through
the harness, request by request, and what the harness adds.

* plain: the model called directly, doing per request what the torch engine does
  (engines/torch.py ``infer``): inputs copied to the device, the module run under
  ``inference_mode``, outputs copied back with a synchronizing ``.to("cpu")``. Timed with
  CUDA events around that work on cuda (the device's own clock, launch to last copy), with
  ``perf_counter`` on cpu.
* harness: the torch engine from the registry, driven by the code a tensor cell runs per
  request: ``serve_open_loop`` (no batching) calling ``workloads.lib.load.timed_batch``
  (collate, ``engine.infer``, output check), with the cell's telemetry thread sampling
  beside it. Its figure is what the cell records as its headline latency, ``e2e`` (due
  time to done, as ``summarize_trace`` takes it), and beside it ``service`` (sent to done).

Why in process and not a ``pytest --engine=torch`` cell's records: a cell has its own
window and Poisson schedule, in another process and at another time, so GPU clocks and
whatever else ran would enter the ratio; here both ways share one process, one loaded
engine (so one TF32 setting), one input, one constant schedule (each request is due
1/rate after the last, the same for both), and alternate in rounds, so drift falls on
both alike. What a cell adds beyond this is off the per-request path: pytest, the worker
process, the record written after the window, and a progress ticker once a second.

    python -m benchmarks.gpu_overhead --device cuda --out overhead.json --md overhead.md
    python -m benchmarks.gpu_overhead --device cpu --iterations 200   # checks the script

The ratio is the harness's median over the plain one; the goal on a GPU-bound model
(a reference-sized model on cuda) is at most 1.02. On a CPU or on a tiny model it says
how large the harness's fixed cost is next to the model's, not the harness's accuracy.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks import publish
from harness.engine import EngineConfig, TensorEngine, registry
from harness.load.clock import MonotonicClock, gc_paused
from harness.load.serving import NoBatching, ServeTrace, serve_open_loop
from harness.metrics import stats
from harness.metrics.telemetry import Telemetry
from harness.results.environment import fingerprint
from workloads.lib import inputs, modelset
from workloads.lib.load import timed_batch

PREFERRED_MODELS = ("resnet50", "tiny-cnn")
"""The default model: the first the embedded set has (resnet50: the reference-sized CNN,
where it exists; tiny-cnn otherwise)."""
GOAL_RATIO = 1.02
DEFAULT_DIMS = {"sequence": 128, "height": 224, "width": 224}
"""Sizes of a model's dynamic non-batch dims, unless --dim says otherwise."""
BUSY_SHARE = 0.5
"""--rate auto: requests come at half the rate the warm-up's p90 call allows, so that none
waits for the one before it (a queue would count against the harness, not the model)."""
QUEUE_NOTE = 0.01
"""Over this share of requests due before the previous one was done, the summary says so."""
Array = npt.NDArray[Any]


EMBEDDED = modelset.TENSOR_MODELS


def default_model() -> str:
    return next(m for m in PREFERRED_MODELS if m in EMBEDDED)


def model_path(name: str, seed: int) -> tuple[Path, dict[str, Any]]:
    """An embedded model by name (built or taken from the cache), or a model file."""
    if name in EMBEDDED:
        built = modelset.by_name(name, seed)
        return built.path, built.describe()
    path = Path(name)
    if not path.is_file():
        have = ", ".join(sorted(EMBEDDED))
        raise SystemExit(f"--model {name}: neither an embedded model ({have}) nor a file")
    return path, {"path": str(path)}


def open_engine(path: Path, device: str, options: Mapping[str, str]) -> TensorEngine:
    """The harness's torch engine, eager: the plain loop has no compiled or captured way."""
    engine = registry.load("torch")(
        EngineConfig(model=path, device=device, options={**options, "mode": "eager"})
    )
    engine.load()
    if not isinstance(engine, TensorEngine):
        raise SystemExit("the torch engine is not a tensor engine here")
    return engine


def request_inputs(
    engine: TensorEngine, batch: int, dims: Mapping[str, int], seed: int
) -> dict[str, Array]:
    """One seeded request of ``batch`` items, the same for every call of both ways."""
    specs = engine.input_specs()
    sizes = {d: dims.get(d, DEFAULT_DIMS.get(d, 0)) for d in inputs.dim_names(specs)}
    return inputs.synthesize(specs, sizes, np.random.default_rng(seed), batch=batch)


class PlainModel:
    """The model file as a torch module of its own, called the way the engine calls its
    module, with none of the engine's or the harness's code around it."""

    def __init__(self, path: Path, device: str, dtype: str) -> None:
        import torch  # noqa: PLC0415

        self.torch = torch
        self.device = device
        self.dtype = getattr(torch, dtype)
        module = _module(path).to(device=device, dtype=self.dtype)
        if hasattr(module, "float_dtype"):
            module.float_dtype = self.dtype  # as the engine sets it on its own copy
        self.module = _eval(module)
        self.cuda = device.startswith("cuda")

    def call(self, arrays: Sequence[Array]) -> list[Any]:
        """One request: host to device, the module, device to host (which synchronizes)."""
        torch = self.torch
        tensors = [torch.from_numpy(a).to(self.device) for a in arrays]
        tensors = [t.to(self.dtype) if t.is_floating_point() else t for t in tensors]
        outs = self.module(*tensors)
        outs = outs if isinstance(outs, list | tuple) else (outs,)
        return [o.to("cpu") for o in outs]

    def timed(self, arrays: Sequence[Array]) -> tuple[float, float]:
        """Seconds of one request: (device time from CUDA events, or the host clock on a
        CPU; the host clock)."""
        torch = self.torch
        with torch.inference_mode():
            if not self.cuda:
                t0 = time.perf_counter()
                self.call(arrays)
                wall = time.perf_counter() - t0
                return wall, wall
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            t0 = time.perf_counter()
            start.record()
            self.call(arrays)
            end.record()
            end.synchronize()
            wall = time.perf_counter() - t0
            return start.elapsed_time(end) / 1e3, wall


def _eval(module: Any) -> Any:
    try:
        return module.eval()
    except NotImplementedError:  # a torch.export program refuses eval(): inference only
        return module


def _module(path: Path) -> Any:
    if path.suffix == ".onnx":
        from engines.torch_onnx import OnnxModule  # noqa: PLC0415

        return OnnxModule(path)
    if path.suffix == ".pt2":
        import torch  # noqa: PLC0415

        return torch.export.load(str(path)).module()
    raise SystemExit(f"{path.name}: the torch engine loads .onnx or .pt2 files")


@dataclass(frozen=True)
class Schedule:
    """Both ways: ``iterations`` requests each, due evenly at ``rate``, in ``rounds``
    alternating rounds (plain first in even rounds, harness first in odd ones)."""

    rate: float
    iterations: int
    rounds: int

    def offsets(self) -> Array:
        """One round's due times, seconds from its start: 0, 1/rate, 2/rate, ..."""
        return np.arange(self.iterations // self.rounds, dtype=np.float64) / self.rate


def plain_round(model: PlainModel, arrays: Sequence[Array], offsets: Array) -> dict[str, Array]:
    """The plain loop, paced as the harness paces: each request starts when it is due.
    Per request: its timed seconds, the host clock around it, and due to done."""
    clock = MonotonicClock()
    out = {k: np.empty(offsets.size) for k in ("timed", "wall", "e2e")}
    with gc_paused():  # as serve_open_loop keeps the collector out of its window
        start = clock.now()
        for i, offset in enumerate(offsets.tolist()):
            clock.sleep_until(start + offset)
            out["timed"][i], out["wall"][i] = model.timed(arrays)
            out["e2e"][i] = clock.now() - (start + offset)
    return out


def harness_round(engine: TensorEngine, request: dict[str, Array], offsets: Array) -> ServeTrace:
    """The cell's per-request path, its telemetry thread beside it, as in a cell."""
    clock, pool = MonotonicClock(), [request]

    def run_batch(indices: Sequence[int]) -> dict[str, float]:
        return timed_batch(engine, pool, indices, clock)

    sampler = Telemetry()
    sampler.start()
    try:
        return serve_open_loop(offsets, NoBatching(), run_batch, clock)
    finally:
        sampler.stop()


def warm_up(engine: TensorEngine, model: PlainModel, request: dict[str, Array], n: int) -> float:
    """Both ways ``n`` times; returns the plain way's p90 wall seconds."""
    engine.warmup(request, n)
    arrays = list(request.values())
    return float(np.percentile([model.timed(arrays)[1] for _ in range(max(n, 1))], 90))


def measure(
    engine: TensorEngine, model: PlainModel, request: dict[str, Array], schedule: Schedule
) -> dict[str, Any]:
    """Rounds of both ways, which goes first alternating; every request's figures pooled,
    and each round's ratio of medians."""
    arrays, offsets = list(request.values()), schedule.offsets()
    plain: dict[str, list[float]] = {"timed": [], "wall": [], "e2e": []}
    harness: dict[str, list[float]] = {"e2e": [], "service": [], "queue": [], "lag": []}
    waited = 0
    rounds = []
    for r in range(schedule.rounds):
        if r % 2:
            trace = harness_round(engine, request, offsets)
            p = plain_round(model, arrays, offsets)
        else:
            p = plain_round(model, arrays, offsets)
            trace = harness_round(engine, request, offsets)
        ok = ~trace.failed
        e2e = (trace.t_done - trace.t_sched)[ok]  # what summarize_trace records as e2e
        for key, values in p.items():
            plain[key].extend(values.tolist())
        harness["e2e"].extend(e2e.tolist())
        harness["service"].extend((trace.t_done - trace.t_send)[ok].tolist())
        harness["queue"].extend((trace.t_send - trace.t_sched)[ok].tolist())
        waited += int(np.sum(trace.t_sched[1:] < trace.t_done[:-1]))
        harness["lag"].extend(trace.lag)
        rounds.append(_round_row(p["timed"], e2e, int(trace.failed.sum())))
    return {"plain": plain, "harness": harness, "rounds": rounds, "waited": waited}


def _round_row(plain: Array, harness: Array, failed: int) -> dict[str, Any]:
    p50, h50 = float(np.median(plain)), float(np.median(harness)) if harness.size else None
    return {
        "plain_median_s": p50,
        "harness_median_s": h50,
        "ratio": h50 / p50 if h50 is not None and p50 > 0 else None,
        "failed": failed,
    }


def figures(values: Sequence[float]) -> dict[str, Any]:
    """Median and p99 (nearest rank, as the records have them) with the count."""
    summary = stats.summarize(np.asarray(values, dtype=np.float64))
    return {
        "count": summary.count,
        "median_s": summary.percentiles.get("p50"),
        "p99_s": summary.percentiles.get("p99"),
    }


def result(measured: dict[str, Any], cuda: bool) -> dict[str, Any]:
    """The document's figures: both ways, the added latency, the ratio, the goal."""
    plain = figures(measured["plain"]["timed"]) | {
        "timer": "CUDA events, h2d to d2h" if cuda else "perf_counter",
        "wall": figures(measured["plain"]["wall"]),
        "e2e": figures(measured["plain"]["e2e"]),
    }
    harness = figures(measured["harness"]["e2e"]) | {
        "timer": "perf_counter, due to done (the cell's e2e)",
        "service": figures(measured["harness"]["service"]),
        "queue": figures(measured["harness"]["queue"]),
        # due before the one before them was done: a queue, not the harness's own time
        "waited": measured.get("waited", 0),
        "lag": figures(measured["harness"]["lag"]),
    }
    p50, h50 = plain["median_s"], harness["median_s"]
    ratio = h50 / p50 if p50 and h50 is not None else None
    service = harness["service"]["median_s"]
    return {
        "plain": plain,
        "harness": harness,
        "added_latency_s": h50 - p50 if ratio is not None else None,
        "ratio": ratio,
        "service_ratio": service / p50 if p50 and service is not None else None,
        "rounds": measured["rounds"],
        "goal": {
            "ratio_at_most": GOAL_RATIO,
            "met": ratio is not None and ratio <= GOAL_RATIO,
            "applies": "a GPU-bound (reference-sized) model on cuda",
        },
    }


def _dims(values: Sequence[str]) -> dict[str, int]:
    out = {}
    for item in values:
        name, _, size = item.partition("=")
        if not size.isdigit():
            raise SystemExit(f"--dim {item}: want NAME=SIZE, e.g. --dim sequence=128")
        out[name] = int(size)
    return out


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_overhead", description=__doc__.split("\n")[0]
    )
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: cuda)")
    p.add_argument(
        "--model", default=None, help=f"embedded name or file (default: {default_model()})"
    )
    p.add_argument("--batch", type=int, default=1, help="items per request (default: 1)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE")
    p.add_argument("--iterations", type=int, default=1000, help="requests per way (>= 100)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (default: 5)")
    p.add_argument("--warmup", type=int, default=50, help="warm-up calls per way (default: 50)")
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help=f"requests/s of both ways (default: {BUSY_SHARE:g} x what the warm-up managed)",
    )
    p.add_argument("--threads", type=int, default=None, help="cpu: torch threads of both ways")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the JSON here")
    p.add_argument("--md", type=Path, default=None, help="write the Markdown summary here")
    args = p.parse_args(argv)
    if args.iterations // max(args.rounds, 1) * args.rounds < 100 or args.rounds < 1:
        p.error("--iterations must give >= 100 requests per way in all (p99 needs 100)")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    name = args.model or default_model()
    path, described = model_path(name, args.seed)
    options = {"dtype": args.dtype} | ({"threads": str(args.threads)} if args.threads else {})
    # torch.set_num_threads is process-wide: the plain loop runs on the engine's threads
    engine = open_engine(path, args.device, options)
    try:
        # loaded while the plain loop runs too: on cuda the engine holds fp32 matmuls and
        # convolutions to IEEE (no TF32), a process-wide setting both ways then share
        model = PlainModel(path, args.device, args.dtype)
        request = request_inputs(engine, args.batch, _dims(args.dim), args.seed)
        seconds = warm_up(engine, model, request, args.warmup)
        rate = args.rate or BUSY_SHARE / seconds
        schedule = Schedule(rate, args.iterations, args.rounds)
        measured = measure(engine, model, request, schedule)
        described_engine = engine.describe()
    finally:
        engine.close()
    return {
        "model": {"name": name, **described, "batch": args.batch, "dtype": args.dtype},
        "inputs": {k: list(v.shape) for k, v in request.items()},
        "device": args.device,
        "engine": described_engine,
        "schedule": {
            "rate": rate,
            "iterations": schedule.iterations // schedule.rounds * schedule.rounds,
            "rounds": schedule.rounds,
            "warmup": args.warmup,
            "warmup_p90_s": seconds,
        },
        **result(measured, args.device.startswith("cuda")),
    }


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1e3:.4g} ms"


def summary(doc: dict[str, Any]) -> str:
    plain, harness = doc["plain"], doc["harness"]
    ratio = doc["ratio"]
    rounds = [r["ratio"] for r in doc["rounds"] if r["ratio"] is not None]
    spread = f" (rounds {min(rounds):.4f} to {max(rounds):.4f})" if rounds else ""
    model, cuda = doc["model"], doc["plain"]["timer"] != "perf_counter"
    lines = [
        f"`{doc['command']}`",
        "",
        f"{model['name']}, batch {model['batch']}, {model['dtype']}, on {doc['device']};"
        f" {doc['schedule']['iterations']} requests per way at"
        f" {doc['schedule']['rate']:.4g} req/s in {doc['schedule']['rounds']} rounds",
        "",
        "| way | timer | median | p99 |",
        "|---|---|---|---|",
        _row("plain loop", plain["timer"], plain),
        *([_row("(plain, host clock)", "perf_counter", plain["wall"])] if cuda else []),
        _row("(plain, due to done)", "perf_counter", plain["e2e"]),
        _row("through the harness", harness["timer"], harness),
        _row("(harness, sent to done)", "perf_counter", harness["service"]),
        "",
        f"added latency (median difference): {_ms(doc['added_latency_s'])};"
        f" ratio of medians {'n/a' if ratio is None else f'{ratio:.4f}'}{spread};"
        f" goal <= {GOAL_RATIO} on {doc['goal']['applies']}:"
        f" {'met' if doc['goal']['met'] else 'not met'}",
    ]
    return "\n".join(lines + _queue_note(harness))


def _row(way: str, timer: str, figures: Mapping[str, Any]) -> str:
    return f"| {way} | {timer} | {_ms(figures['median_s'])} | {_ms(figures['p99_s'])} |"


def _queue_note(harness: Mapping[str, Any]) -> list[str]:
    """Requests that waited for the one before them: then the harness's e2e holds a queue
    that the plain figure does not, and the ratio says little about the harness."""
    waited, count = harness.get("waited", 0), harness["count"] or 1
    if waited <= QUEUE_NOTE * count:
        return []
    return [
        "",
        f"note: {waited} of {count} requests through the harness were due before the one"
        " before them was done (the machine was slower than in the warm-up): rerun on an"
        " idle machine or with a lower --rate",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse(argv)
    words = sys.argv[1:] if argv is None else list(argv)
    doc: dict[str, Any] = {"command": " ".join(["python -m benchmarks.gpu_overhead", *words])}
    doc["environment"] = fingerprint()
    doc |= run(args)
    publish(doc, summary(doc), args.out, args.md)


if __name__ == "__main__":
    main()
