"""The harness's pytest options (one group) and their validation into ``RunSettings``."""

from __future__ import annotations

import argparse
import inspect
import itertools
from pathlib import Path
from typing import Any

import pytest

from harness.engine import eventloop
from harness.exceptions import UsageError
from harness.results import redact
from harness.session.config import MODEL_SET_CHOICES, ProfileName, RunSettings, parse_settings
from harness.session.execution import parse_dist, parse_reliability
from harness.session.liveprogress import add_option as add_progress_option
from harness.session.traffic import DATASET_FORMATS, TRACE_FORMATS, parse_traffic


def add_options(parser: pytest.Parser) -> None:
    """The one options group, "harness"."""
    group = parser.getgroup("harness", "inference benchmark harness")
    group.addoption(
        "--engine",
        action="append",
        metavar="NAME[,NAME]",
        help="engine(s) to benchmark; repeat or comma-separate (default: onnxruntime)",
    )
    group.addoption(
        "--model", metavar="PATH", help="run a local model instead of the embedded default"
    )
    group.addoption(
        "--images",
        metavar="DIR",
        help="preprocessing workload: your .jpg/.png files instead of the seeded synthetic set",
    )
    group.addoption("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    group.addoption(
        "--model-set",
        default="auto",
        metavar="|".join(MODEL_SET_CHOICES),
        help="the embedded models' sizes: tiny (CPU, smoke runs) or reference (ResNet-50,"
        " BERT-base, a 1B Llama); auto: reference on cuda, tiny otherwise (default: auto)",
    )
    group.addoption(
        "--results-dir",
        default="results/runs",
        metavar="DIR",
        help="where run directories are created (default: results/runs)",
    )
    group.addoption(
        "--profile",
        default="quick",
        help=f"{' | '.join(p.value for p in ProfileName)}: quick keeps cells to seconds,"
        " full uses windows worth trusting (default: quick)",
    )
    group.addoption("--seed", type=int, default=0, help="seed for inputs and arrivals (default: 0)")
    group.addoption(
        "--window", type=float, metavar="SECONDS", help="override the profile's measured window"
    )
    group.addoption(
        "--requests", type=int, metavar="N", help="override the profile's closed-loop request count"
    )
    group.addoption(
        "--dim",
        action="append",
        metavar="NAME=SIZE",
        help="size for a named dynamic dimension of a --model's inputs",
    )
    group.addoption(
        "--dynamic-batch",
        action="store_true",
        default=False,
        help="serve --model with its fixed batch dimension rewritten as dynamic, in a cached"
        " copy (your file is untouched); recorded in every record",
    )
    group.addoption(
        "--slo",
        metavar="METRIC_pNN=DURATION[,...]",
        help="SLOs for goodput and verdicts, e.g. ttft_p99=200ms,tpot_p99=50ms; METRIC: a"
        " latency the selected workloads declare (ttft, tpot, e2e, itl for the built-in ones)",
    )
    group.addoption(
        "--engine-opt",
        action="append",
        metavar="ENGINE.KEY=VALUE",
        help="adapter option, e.g. onnxruntime.intra_op_threads=2",
    )
    group.addoption(
        "--engine-grid",
        action="append",
        metavar="ENGINE.KEY=V1,V2",
        help="measure every cell of ENGINE once per value (repeat for more keys: the cross"
        " product), e.g. vllm.max_num_seqs=4,16; the configuration is the cell parameter"
        " config",
    )
    group.addoption(
        "--engine-grid-file",
        metavar="FILE",
        help="named engine configurations instead: a TOML table [ENGINE.NAME] of options"
        " per configuration",
    )
    _add_traffic_options(group)
    group.addoption(
        "--repeats",
        type=int,
        default=1,
        metavar="N",
        help="measure every cell N times, each time in a fresh worker process, cells"
        " interleaved (all cells once, then again); compare then judges a change against"
        " the spread between repeats rather than within one run (default: 1)",
    )
    group.addoption(
        "--clients",
        default="1",
        metavar="N|auto",
        help="client processes sharing the load of an HTTP engine, each taking every N-th"
        " scheduled request (default: 1, the load comes from this process); auto: as many"
        " as each cell's offered load needs, from what one client process was measured to"
        " sustain against a no-op server",
    )
    group.addoption(
        "--clients-on",
        default="local",
        metavar="WHERE",
        help="local: --clients processes on the cell's machine; ray: Ray actors spread over"
        " the cluster of --ray-address (or of --cells-on=ray), clocks aligned on wall time"
        " (default: local)",
    )
    group.addoption(
        "--early-stop",
        default="on",
        metavar="on|off",
        help="on: a rate point of a sweep or capacity search whose queue and latency grow"
        " without bound stops early, recorded as saturated (past the knee); off: every"
        " point runs its full window. Cells of one fixed load always do (default: on)",
    )
    _add_reliability_options(parser)
    add_progress_option(group)
    VALUE_OPTIONS.update(
        name
        for arg in group.options
        if arg.attrs().get("action", "store") in ("store", "append")
        for name in arg.names()
    )
    OPTION_NAMES.update(name for arg in group.options for name in arg.names())


VALUE_OPTIONS: set[str] = set()
"""The harness's options that take a value (filled by ``add_options``)."""
OPTION_NAMES: set[str] = set()
"""Every option string of the harness (filled by ``add_options``)."""


def check_rootdir(config: pytest.Config) -> None:
    """Refuse a session whose rootdir pytest took from a harness option's value.

    pytest chooses the rootdir and config file from the command line's paths before any
    plugin has added its options, so in ``--results-dir /elsewhere`` it reads
    ``/elsewhere`` as a test path: the session is rooted outside the project, loses its
    configuration (``testpaths``) and collects the project's own tests as well. The
    ``--option=value`` form is never read that way.
    """
    args = config.invocation_params.args
    if any(a.startswith(("--rootdir", "-c", "--config-file", "--inifile")) for a in args):
        return  # the user chose where the session is rooted
    here = config.invocation_params.dir
    culprits = [
        (name, value)
        for name, value in itertools.pairwise(args)
        if name in VALUE_OPTIONS and _names_a_path(here, value)
    ]
    if not culprits:
        return
    intended = _rootdir_without_options(config)
    moved = config.rootpath != intended if intended is not None else config.inipath is None
    if moved:
        fixed = " ".join(f"{name}={value}" for name, value in culprits)
        raise pytest.UsageError(
            "pytest read "
            + ", ".join(f"{value!r} (the value of {name})" for name, value in culprits)
            + " as a test path before the harness's options existed, and so rooted the"
            f" session at {config.rootpath}"
            + (f" instead of {intended}" if intended is not None else "")
            + f"; write {fixed}"
        )


def _names_a_path(here: Path, arg: str) -> bool:
    try:
        return (here / arg.split("::", maxsplit=1)[0]).exists()
    except (OSError, ValueError):
        return False


def _rootdir_without_options(config: pytest.Config) -> Path | None:
    """The rootdir pytest would choose from the command line's real paths alone, asked of
    pytest's own (private, version-dependent) function; None where it cannot be asked."""
    try:
        from _pytest.config.findpaths import determine_setup  # noqa: PLC0415
    except ImportError:
        return None
    wanted: dict[str, Any] = {
        "inifile": None,
        "override_ini": config.option.override_ini,
        "args": list(config.option.file_or_dir or ()),
        "rootdir_cmd_arg": None,
        "invocation_dir": config.invocation_params.dir,
    }
    try:
        params = inspect.signature(determine_setup).parameters
        result = determine_setup(**{k: v for k, v in wanted.items() if k in params})
    except Exception:  # any change of that private API: fall back to the heuristic
        return None
    root = result[0]
    return root if isinstance(root, Path) else None


def _add_traffic_options(group: pytest.OptionGroup) -> None:
    group.addoption(
        "--dataset",
        metavar="PATH",
        help="generative dataset workload: your prompts or conversations (ShareGPT JSON, JSONL"
        " with prompt or messages, or json/csv/parquet through Hugging Face datasets) instead"
        " of the generated synthetic conversations",
    )
    group.addoption(
        "--dataset-format",
        default="auto",
        help=f"{' | '.join(DATASET_FORMATS)} (default: auto, from the file)",
    )
    group.addoption(
        "--output-mode",
        default="reference",
        help="reply lengths of dataset requests: fixed (ignore_eos), reference (the dataset's"
        " reply lengths, ignore_eos) or natural (end of sequence, capped; default: reference)",
    )
    group.addoption(
        "--output-cap",
        type=int,
        default=128,
        metavar="TOKENS",
        help="the longest reply in natural mode (default: 128)",
    )
    group.addoption(
        "--session-spec",
        metavar="SPEC",
        help="multi-turn sessions workload: synthetic sessions instead of --dataset's or the"
        " generated conversations, e.g. turns=4,user=64,reply=48,think=1,rate=2 (user turns per"
        " session, words per message, tokens per reply, median think seconds, sessions/s)",
    )
    group.addoption(
        "--trace-file",
        metavar="PATH",
        help="trace-replay workload: a timestamped request log (Mooncake JSONL, Azure LLM"
        " inference CSV, BurstGPT CSV) instead of the generated one",
    )
    group.addoption(
        "--trace-format",
        default="auto",
        help=f"{' | '.join(TRACE_FORMATS)} (default: auto, from the file)",
    )
    group.addoption(
        "--trace-speed",
        type=float,
        metavar="X",
        help="replay X times as fast (inter-arrival times divided by X)",
    )
    group.addoption(
        "--trace-rate",
        type=float,
        metavar="REQ_PER_S",
        help="replay at this mean request rate instead (not with --trace-speed)",
    )
    group.addoption(
        "--trace-slice",
        metavar="START:END",
        help="replay trace seconds [START, END) only (either may be empty)",
    )
    group.addoption("--trace-limit", type=int, metavar="N", help="replay the first N requests only")
    group.addoption(
        "--lora",
        action="append",
        metavar="NAME=DIR[@WEIGHT]",
        help="generative workloads: requests spread over LoRA adapters by weight (repeat, or"
        " comma-separate; base[@WEIGHT]: the base model's share); the engine serves them",
    )


def _add_reliability_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness")
    group.addoption(
        "--isolation",
        default="process",
        help="process: each engine's cells run in a spawned worker, so a crash or hang costs"
        " one cell; none: in this process (debugging) (default: process)",
    )
    group.addoption(
        "--cell-timeout",
        type=float,
        metavar="SECONDS",
        help="deadline of one cell, engine loading excluded; past it the cell is a timeout"
        " (default: 600 quick, 3600 full)",
    )
    group.addoption(
        "--load-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="deadline for starting a worker or loading an engine (default: 600)",
    )
    group.addoption(
        "--request-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="a request not answered within this is a failed request (default: 300)",
    )
    group.addoption(
        "--max-restarts",
        type=int,
        default=3,
        help="worker restarts per engine after crashes/timeouts before its remaining cells"
        " are failed (default: 3)",
    )
    group.addoption(
        "--worker-memory",
        metavar="SIZE",
        help="kill a worker whose processes hold more than SIZE (e.g. 8GiB) and record its"
        " cell as crashed (default: 90%% of RAM)",
    )
    group.addoption(
        "--resume",
        metavar="RUN_DIR",
        help="finish an interrupted or failed run: run only its cells without an ok record",
    )
    _add_dist_options(group)
    # Internal: how a controller starts a worker (harness.session.isolation).
    group.addoption("--harness-worker", metavar="SPEC", help=argparse.SUPPRESS)
    # Internal: a run of exactly one cell, on a Ray node (harness.dist.remotecell).
    group.addoption("--harness-only", metavar="NODEID", help=argparse.SUPPRESS)
    group.addoption("--harness-events-fd", type=int, help=argparse.SUPPRESS)


def _add_dist_options(group: pytest.OptionGroup) -> None:
    group.addoption(
        "--cells-on",
        default="local",
        metavar="WHERE",
        help="local: cells run on this machine; ray: each cell is a Ray task on a cluster,"
        " records come back into this run directory (default: local)",
    )
    group.addoption(
        "--ray-address",
        metavar="HOST:PORT",
        help="the Ray cluster to run on (default: start a local Ray instance)",
    )
    group.addoption(
        "--ray-cpus-per-cell",
        type=float,
        default=1.0,
        metavar="N",
        help="CPUs each cell's Ray task asks for (default: 1)",
    )
    group.addoption(
        "--ray-gpus-per-cell",
        type=float,
        default=1.0,
        metavar="N",
        help="GPUs a --device=cuda cell's task asks for; 1 keeps cells off each other's"
        " device (default: 1)",
    )
    group.addoption(
        "--ray-retries",
        type=int,
        default=2,
        metavar="N",
        help="reruns of a cell lost to the cluster (dead worker or node); a cell that failed"
        " on its own is not rerun (default: 2)",
    )
    group.addoption(
        "--ray-python",
        action="append",
        metavar="ENGINE=PATH",
        help="the Python of a pre-built environment for ENGINE's cells on every node",
    )


def settings_from(config: pytest.Config) -> RunSettings:
    """Every option validated once; a bad value is a usage error, never a traceback
    (``--slo`` is held to the selected cells' latencies once they are collected:
    harness.session.slocheck).

    Secrets in engine options are remembered first, so that no message, record, log or
    report line shows them, even one about a malformed option."""
    opt = config.getoption
    for item in opt("engine_opt") or ():
        key, _, value = item.partition("=")
        redact.remember(redact.secrets_in_value(key, value))
    try:
        eventloop.loop_factory()  # HARNESS_EVENT_LOOP, refused before anything runs
        reliability = parse_reliability(
            isolation=opt("isolation"),
            cell_timeout=opt("cell_timeout"),
            load_timeout=opt("load_timeout"),
            request_timeout=opt("request_timeout"),
            max_restarts=opt("max_restarts"),
            worker_memory=opt("worker_memory"),
            resume=opt("resume"),
        )
        return parse_settings(
            engines=opt("engine"),
            device=opt("device"),
            model_set=opt("model_set"),
            profile=opt("profile"),
            results_dir=opt("results_dir"),
            seed=opt("seed"),
            model=opt("model"),
            images=opt("images"),
            window=opt("window"),
            requests=opt("requests"),
            dims=opt("dim"),
            dynamic_batch=opt("dynamic_batch"),
            engine_options=opt("engine_opt"),
            slo=opt("slo"),
            clients=opt("clients"),
            clients_on=opt("clients_on"),
            reliability=reliability,
            repeats=opt("repeats"),
            early_stop=opt("early_stop"),
            lora=opt("lora"),
            engine_grid=opt("engine_grid"),
            engine_grid_file=opt("engine_grid_file"),
            traffic=parse_traffic(
                dataset=opt("dataset"),
                dataset_format=opt("dataset_format"),
                output_mode=opt("output_mode"),
                output_cap=opt("output_cap"),
                trace=opt("trace_file"),
                trace_format=opt("trace_format"),
                trace_speed=opt("trace_speed"),
                trace_rate=opt("trace_rate"),
                trace_slice=opt("trace_slice"),
                trace_limit=opt("trace_limit"),
                session_spec=opt("session_spec"),
            ),
            dist=parse_dist(
                mode=opt("cells_on"),
                address=opt("ray_address"),
                cpus_per_cell=opt("ray_cpus_per_cell"),
                gpus_per_cell=opt("ray_gpus_per_cell"),
                retries=opt("ray_retries"),
                python=opt("ray_python"),
                isolation=opt("isolation"),
                clients_on=opt("clients_on"),
            ),
        )
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None
