"""The harness's pytest options, each declared once (``OPTIONS``): flag, default, help,
its own check, the ``RunSettings`` field it fills and its section of docs/usage.md.

harness.session.pytestoptions registers them with pytest and reads them back into
``RunSettings``; ``python -m harness.session.optiontable`` rewrites docs/usage.md's option
reference from them; tests/test_option_table.py checks that the three agree.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.load import adapters
from harness.session import config
from harness.session.config import MODEL_SET_CHOICES, ProfileName
from harness.session.optiondecl import (
    CLIENTS,
    ENGINES,
    INPUTS,
    INTERNAL,
    MEASUREMENT,
    OUTPUT,
    RAY,
    RELIABILITY,
    Option,
    rewrite_usage,
)
from harness.session.progressview import Mode
from harness.session.traffic import DATASET_FORMATS, TRACE_FORMATS


def _traffic_option(flag: str, text: str, **declared: Any) -> Option:
    """An option of what generative workloads send (``RunSettings.traffic``)."""
    return Option(flag, text, INPUTS, "traffic", **declared)


def _reliability_option(flag: str, text: str, **declared: Any) -> Option:
    return Option(flag, text, RELIABILITY, "reliability", **declared)


def _dist_option(flag: str, text: str, **declared: Any) -> Option:
    return Option(flag, text, RAY, "dist", **declared)


def _engines_and_models() -> tuple[Option, ...]:
    return (
        Option(
            "--engine",
            "engine(s) to benchmark; repeat or comma-separate (default: onnxruntime)",
            ENGINES,
            "engines",
            metavar="NAME[,NAME]",
            action="append",
            convert=config.parse_engine,
            doc="engine(s) to benchmark (repeatable; default `onnxruntime`); an unknown name"
            " is a usage error listing the registered ones",
        ),
        Option(
            "--model",
            "run a local model instead of the embedded default",
            ENGINES,
            "model",
            metavar="PATH",
            convert=config.parse_model,
            doc="local model instead of the embedded default (must exist). Tensor engines load"
            " it as an ONNX file, inspected once at start: a folder, an empty or non-ONNX file,"
            " or an input without a leading batch dimension is a usage error (torch also takes"
            " a `.pt2`; generative engines such as vLLM take a model directory, unchecked)",
        ),
        Option(
            "--images",
            "preprocessing workload: your .jpg/.png files instead of the seeded synthetic set",
            INPUTS,
            "images",
            metavar="DIR",
            convert=config.parse_images,
            doc="the preprocessing workload reads your `.jpg`/`.jpeg`/`.png` files instead of"
            " the seeded synthetic corpus (the folder must hold at least one); every file is"
            " decoded once at start, and files PIL cannot decode are a usage error naming each"
            " and why",
        ),
        Option(
            "--device",
            "the device cells run on (default: cpu)",
            ENGINES,
            "device",
            default="cpu",
            metavar="cpu|cuda|cuda:N",
            convert=config.parse_device,
            doc="device (default `cpu`); an engine that cannot use it skips its cells with the"
            " reason",
        ),
        Option(
            "--model-set",
            "the embedded models' sizes: tiny (CPU, smoke runs) or reference (ResNet-50,"
            " BERT-base, a 1B Llama); auto: reference on cuda, tiny otherwise (default: auto)",
            ENGINES,
            "model_set",
            default="auto",
            metavar="|".join(MODEL_SET_CHOICES),
            convert=config.parse_model_set,
            doc="the embedded models the workloads run without `--model`"
            " ([workloads.md](workloads.md#embedded-models)): `tiny` (tiny CNN, encoder and"
            " Llama: CPU and smoke runs) or `reference` (ResNet-50, BERT-base, a 1B Llama;"
            " built on first use, tens of seconds, 2.5 GB of cache); `auto` (default):"
            " `reference` on `cuda`/`cuda:N`, `tiny` otherwise. Workload dimensions (sequence"
            " lengths, image sizes) follow the set; cell ids stay the same and each record's"
            " `engine_info.embedded_model` names the model; recorded in the run's settings and"
            " part of what `--resume` must repeat",
        ),
    )


def _run_and_measurement() -> tuple[Option, ...]:
    return (
        Option(
            "--results-dir",
            "where run directories are created (default: results/runs)",
            OUTPUT,
            "results_dir",
            default="results/runs",
            metavar="DIR",
            convert=Path,
            doc="where run directories go (default `results/runs`); outside the project,"
            " write `--results-dir=DIR`",
        ),
        Option(
            "--profile",
            "quick keeps cells to seconds, full uses windows worth trusting (default: quick)",
            MEASUREMENT,
            "profile",
            default="quick",
            metavar="|".join(p.value for p in ProfileName),
            convert=config.parse_profile,
            doc="measurement windows and validity bounds: `quick` (default) keeps cells to"
            " seconds, `full` uses windows worth trusting"
            " ([methodology.md](methodology.md#validity))",
        ),
        Option(
            "--seed",
            "seed for inputs and arrivals (default: 0)",
            MEASUREMENT,
            "seed",
            default=0,
            metavar="N",
            value_type=int,
            convert=config.parse_seed,
            doc="seed for arrivals, inputs and the embedded models (default 0), recorded in"
            " every record",
        ),
        Option(
            "--window",
            "override the profile's measured window",
            MEASUREMENT,
            "profile",
            metavar="SECONDS",
            value_type=float,
            convert=config.parse_window,
        ),
        Option(
            "--requests",
            "override the profile's closed-loop request count",
            MEASUREMENT,
            "profile",
            metavar="N",
            value_type=int,
            convert=config.parse_requests,
        ),
        Option(
            "--dim",
            "size for a named dynamic dimension of a --model's inputs",
            ENGINES,
            "dims",
            metavar="NAME=SIZE",
            action="append",
            convert=config.parse_dim,
            doc="size (or, for the shapes workload, maximum) of a named dynamic dimension of"
            " `--model`'s inputs; a name the model (or, without `--model`, the embedded models)"
            " does not have is a usage error listing the ones it has",
        ),
        Option(
            "--dynamic-batch",
            "serve --model with its fixed batch dimension rewritten as dynamic, in a cached"
            " copy (your file is untouched); recorded in every record",
            ENGINES,
            "dynamic_batch",
            default=False,
            action="store_true",
            doc="serve `--model` with its fixed batch dimension rewritten as dynamic (inputs"
            " and outputs, `dim_param` `batch`), in a copy cached under"
            " `$HARNESS_CACHE_DIR/models/derived/`; your file is untouched. Refused, with the"
            " reason in the skipped cells, when ONNX shape inference shows the graph hard-codes"
            " the batch (e.g. a `Reshape` to `[1, 2048]`). Each record's"
            " `engine_info.user_model` says what was rewritten; part of what `--resume` must"
            " repeat; a usage error without `--model`",
        ),
        Option(
            "--slo",
            "SLOs for goodput and verdicts, e.g. ttft_p99=200ms,tpot_p99=50ms; METRIC: a"
            " latency the selected workloads declare (ttft, tpot, e2e, itl for the built-in"
            " ones)",
            MEASUREMENT,
            "slos",
            metavar="METRIC_pNN=DURATION[,...]",
            convert=config.parse_slo,
            doc="SLOs for goodput and per-cell verdicts, e.g. `ttft_p99=200ms,tpot_p99=50ms`;"
            " METRIC is a latency the selected workloads declare ([SLOs](#slos))",
        ),
    )


def _engine_configurations() -> tuple[Option, ...]:
    return (
        Option(
            "--engine-opt",
            "adapter option, e.g. onnxruntime.intra_op_threads=2",
            ENGINES,
            "engine_options",
            metavar="ENGINE.KEY=VALUE",
            action="append",
            convert=config.parse_engine_opt,
            doc="adapter option, validated at start-up (e.g. `onnxruntime.intra_op_threads=2`,"
            " `vllm.max_num_seqs=8`, `openai.base_url=http://127.0.0.1:8000`;"
            " [engines.md](engines.md#options-per-engine) lists each engine's)",
        ),
        Option(
            "--engine-grid",
            "measure every cell of ENGINE once per value (repeat for more keys: the cross"
            " product), e.g. vllm.max_num_seqs=4,16; the configuration is the cell parameter"
            " config",
            ENGINES,
            "engine_grid",
            metavar="ENGINE.KEY=V1,V2",
            action="append",
            doc="measure every cell of ENGINE once per value (repeat for more keys: the cross"
            " product), e.g. `vllm.max_num_seqs=4,16`; see [Engine-configuration"
            " grids](#engine-configuration-grids---engine-grid)",
        ),
        Option(
            "--engine-grid-file",
            "named engine configurations instead: a TOML table [ENGINE.NAME] of options"
            " per configuration",
            ENGINES,
            "engine_grid",
            metavar="FILE",
            doc="named configurations instead: a TOML table `[ENGINE.NAME]` of options per"
            " configuration",
        ),
    )


def _traffic() -> tuple[Option, ...]:
    return (
        _traffic_option(
            "--dataset",
            "generative dataset workload: your prompts or conversations (ShareGPT JSON, JSONL"
            " with prompt or messages, or json/csv/parquet through Hugging Face datasets)"
            " instead of the generated synthetic conversations",
            metavar="PATH",
            doc="the dataset workload's prompts or conversations: ShareGPT JSON, JSONL"
            " (`prompt` or `messages`, optional `output_tokens`), json/csv/parquet via Hugging"
            " Face `datasets`"
            " ([workloads.md](workloads.md#dataset-the-users-prompts-and-conversations))",
        ),
        _traffic_option(
            "--dataset-format",
            f"{' | '.join(DATASET_FORMATS)} (default: auto, from the file)",
            default="auto",
            metavar="FORMAT",
            doc=f"`--dataset`'s format: {_choices(DATASET_FORMATS)}; `auto` (default) from the"
            " file",
        ),
        _traffic_option(
            "--output-mode",
            "reply lengths of dataset requests: fixed (ignore_eos), reference (the dataset's"
            " reply lengths, ignore_eos) or natural (end of sequence, capped; default:"
            " reference)",
            default="reference",
            metavar="fixed|reference|natural",
            doc="reply lengths of dataset requests: `fixed` with `ignore_eos`, the dataset's"
            " `reference` lengths (default), or `natural` end of sequence capped at"
            " `--output-cap`",
        ),
        _traffic_option(
            "--output-cap",
            "the longest reply in natural mode (default: 128)",
            default=128,
            metavar="TOKENS",
            value_type=int,
        ),
        _traffic_option(
            "--session-spec",
            "multi-turn sessions workload: synthetic sessions instead of --dataset's or the"
            " generated conversations, e.g. turns=4,user=64,reply=48,think=1,rate=2 (user turns"
            " per session, words per message, tokens per reply, median think seconds,"
            " sessions/s)",
            metavar="SPEC",
            doc="the sessions workload's conversations, synthetic:"
            " `turns=4,user=64,reply=48,think=1,rate=2` (user turns per session, words per user"
            " message, tokens per reply, median think seconds, sessions arriving per second;"
            " any key may be left out: 3, 32, 32, 0.2, 4), instead of `--dataset`'s or the"
            " generated ones ([workloads.md](workloads.md#multi-turn-sessions))",
        ),
        _traffic_option(
            "--trace-file",
            "trace-replay workload: a timestamped request log (Mooncake JSONL, Azure LLM"
            " inference CSV, BurstGPT CSV) instead of the generated one",
            metavar="PATH",
            doc="the trace-replay workload's request log: Mooncake JSONL, Azure LLM inference"
            " CSV, BurstGPT CSV ([workloads.md](workloads.md#trace-replay))",
        ),
        _traffic_option(
            "--trace-format",
            f"{' | '.join(TRACE_FORMATS)} (default: auto, from the file)",
            default="auto",
            metavar="FORMAT",
            doc=f"`--trace-file`'s format: {_choices(TRACE_FORMATS)}; `auto` (default) from"
            " the file",
        ),
        _traffic_option(
            "--trace-speed",
            "replay X times as fast (inter-arrival times divided by X)",
            metavar="X",
            value_type=float,
        ),
        _traffic_option(
            "--trace-rate",
            "replay at this mean request rate instead (not with --trace-speed)",
            metavar="REQ_PER_S",
            value_type=float,
        ),
        _traffic_option(
            "--trace-slice",
            "replay trace seconds [START, END) only (either may be empty)",
            metavar="START:END",
        ),
        _traffic_option(
            "--trace-limit",
            "replay the first N requests only",
            metavar="N",
            value_type=int,
        ),
        Option(
            "--lora",
            "generative workloads: requests spread over LoRA adapters by weight (repeat, or"
            " comma-separate; base[@WEIGHT]: the base model's share); the engine serves them",
            INPUTS,
            "lora",
            metavar="NAME=DIR[@WEIGHT]",
            action="append",
            convert=adapters.parse,
            doc="spread the generative requests over LoRA adapters by weight (repeat, or"
            " comma-separate; `base[@WEIGHT]`: the base model's share); the engine serves them,"
            " and each cell's record splits its figures per adapter"
            " ([workloads.md](workloads.md#lora-adapters))",
        ),
    )


def _choices(names: tuple[str, ...]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _repeats_and_clients() -> tuple[Option, ...]:
    return (
        Option(
            "--repeats",
            "measure every cell N times, each time in a fresh worker process, cells"
            " interleaved (all cells once, then again); compare then judges a change against"
            " the spread between repeats rather than within one run (default: 1)",
            MEASUREMENT,
            "repeats",
            default=1,
            metavar="N",
            value_type=int,
            doc="measure every cell N times (default 1), each time in a fresh worker process,"
            " all cells once before any a second time; each repeat is a record of the cell"
            " (`<cell-id>@R.json`), the matrix shows the repeat that went worst, a `--resume`"
            " reruns only the repeats without an `ok` record, and `compare` judges changes"
            " between repeats ([methodology.md](methodology.md#comparing-two-runs)); needs"
            " `--isolation process`, not with `--cells-on=ray` yet",
        ),
        Option(
            "--clients",
            "client processes sharing the load of an HTTP engine, each taking every N-th"
            " scheduled request (default: 1, the load comes from this process); auto: as many"
            " as each cell's offered load needs, from what one client process was measured to"
            " sustain against a no-op server",
            CLIENTS,
            "clients",
            default="1",
            metavar="N|auto",
            convert=config.parse_clients,
            doc="client processes that share the load of an HTTP engine (`network_client`,"
            " e.g. `openai`), each taking every N-th scheduled request (default 1); `auto`: per"
            " open-loop cell, as many as keep each under half of the measured client ceiling;"
            " see [Several client processes](#several-client-processes---clients-n)",
        ),
        Option(
            "--clients-on",
            "local: --clients processes on the cell's machine; ray: Ray actors spread over"
            " the cluster of --ray-address (or of --cells-on=ray), clocks aligned on wall time"
            " (default: local)",
            CLIENTS,
            "clients_on",
            default="local",
            metavar="WHERE",
            convert=config.parse_clients_on,
        ),
        Option(
            "--early-stop",
            "on: a rate point of a sweep or capacity search whose queue and latency grow"
            " without bound stops early, recorded as saturated (past the knee); off: every"
            " point runs its full window. Cells of one fixed load always do (default: on)",
            MEASUREMENT,
            "early_stop",
            default="on",
            metavar="on|off",
            convert=config.parse_early_stop,
            doc="`on` (default): a rate point of a tensor sweep or capacity search, or of the"
            " generative capacity search in one process (with `--clients N` its points run in"
            " full, and the record says why), whose queue and latency grow without bound stops"
            " early, recorded as saturated (`stopped_early`, with its evidence and the seconds"
            " saved) and past the knee; `off`: every point runs its full window. Cells of one"
            " fixed load (soak, shapes, every other workload) and the capacity point's"
            " repetitions always run in full ([methodology.md](methodology.md#load-and-capacity))",
        ),
    )


def _reliability() -> tuple[Option, ...]:
    return (
        _reliability_option(
            "--isolation",
            "process: each engine's cells run in a spawned worker, so a crash or hang costs"
            " one cell; none: in this process (debugging) (default: process)",
            default="process",
            metavar="process|none",
        ),
        _reliability_option(
            "--cell-timeout",
            "deadline of one cell, engine loading excluded; past it the cell is a timeout"
            " (default: 600 quick, 3600 full)",
            metavar="SECONDS",
            value_type=float,
        ),
        _reliability_option(
            "--load-timeout",
            "deadline for starting a worker or loading an engine (default: 600)",
            default=600.0,
            metavar="SECONDS",
            value_type=float,
        ),
        _reliability_option(
            "--request-timeout",
            "a request not answered within this is a failed request (default: 300)",
            default=300.0,
            metavar="SECONDS",
            value_type=float,
        ),
        _reliability_option(
            "--max-restarts",
            "worker restarts per engine after crashes/timeouts before its remaining cells"
            " are failed (default: 3)",
            default=3,
            metavar="N",
            value_type=int,
        ),
        _reliability_option(
            "--worker-memory",
            "kill a worker whose processes hold more than SIZE (e.g. 8GiB) and record its"
            " cell as crashed (default: 90%% of RAM)",
            metavar="SIZE",
            doc="kill a worker whose processes hold more than SIZE (e.g. `8GiB`; default 90 %"
            " of RAM) and record its cell `crashed`",
        ),
        _reliability_option(
            "--resume",
            "finish an interrupted or failed run: run only its cells without an ok record",
            metavar="RUN_DIR",
            doc="finish an interrupted or failed run: run only its planned cells without an"
            " `ok` record, with the same measurement options",
        ),
    )


def _ray_and_internal() -> tuple[Option, ...]:
    return (
        _dist_option(
            "--cells-on",
            "local: cells run on this machine; ray: each cell is a Ray task on a cluster,"
            " records come back into this run directory (default: local)",
            default="local",
            metavar="WHERE",
            doc="`local` (default): cells run on this machine; `ray`: each cell is a Ray task"
            " on a cluster, records come back into this run directory ([Running on a Ray"
            " cluster](#running-on-a-ray-cluster---cells-onray)); not with `--isolation none`",
        ),
        _dist_option(
            "--ray-address",
            "the Ray cluster to run on (default: start a local Ray instance)",
            metavar="HOST:PORT",
            doc="the Ray cluster (default: start a local Ray instance); only with"
            " `--cells-on=ray` or `--clients-on=ray`",
        ),
        _dist_option(
            "--ray-cpus-per-cell",
            "CPUs each cell's Ray task asks for (default: 1)",
            default=1.0,
            metavar="N",
            value_type=float,
        ),
        _dist_option(
            "--ray-gpus-per-cell",
            "GPUs a --device=cuda cell's task asks for; 1 keeps cells off each other's"
            " device (default: 1)",
            default=1.0,
            metavar="N",
            value_type=float,
        ),
        _dist_option(
            "--ray-retries",
            "reruns of a cell lost to the cluster (dead worker or node); a cell that failed"
            " on its own is not rerun (default: 2)",
            default=2,
            metavar="N",
            value_type=int,
        ),
        _dist_option(
            "--ray-python",
            "the Python of a pre-built environment for ENGINE's cells on every node",
            metavar="ENGINE=PATH",
            action="append",
            doc="the Python of a pre-built environment for ENGINE's cells on every node"
            " (repeatable; only with `--cells-on=ray`)",
        ),
        # how a controller starts a worker (harness.session.isolation)
        Option("--harness-worker", argparse.SUPPRESS, INTERNAL, None, metavar="SPEC"),
        # a run of exactly one cell, on a Ray node (harness.dist.remotecell)
        Option("--harness-only", argparse.SUPPRESS, INTERNAL, None, metavar="NODEID"),
        Option("--harness-events-fd", argparse.SUPPRESS, INTERNAL, None, value_type=int),
    )


PROGRESS = Option(
    "--progress",
    "live progress of the cell in flight: rich's display on a terminal, else a plain line"
    " every 10 s and at each cell's end (auto, the default); rich or plain force one; off"
    " shows none",
    OUTPUT,
    None,  # read by harness.session.liveprogress
    default=Mode.AUTO.value,
    metavar="|".join(m.value for m in Mode),
    dest="harness_progress",
    doc="live progress of the cell in flight ([Live progress](#live-progress)): `auto`"
    " (default) shows rich's live display on a terminal and a plain line every 10 s and at"
    " each cell's end elsewhere (CI logs); `rich` or `plain` forces one; `off` shows none",
)

OPTIONS: tuple[Option, ...] = (
    *_engines_and_models(),
    *_run_and_measurement(),
    *_engine_configurations(),
    *_traffic(),
    *_repeats_and_clients(),
    *_reliability(),
    *_ray_and_internal(),
    PROGRESS,
)
"""Every harness option, in ``pytest --help``'s order."""
DERIVED: frozenset[str] = frozenset()
"""``RunSettings`` fields that no option fills (none: every field is an option's)."""

if __name__ == "__main__":
    print(rewrite_usage(OPTIONS))
