"""Shared pieces of the generative workloads: model, seeded requests, engine, recording."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from engines import transformers_server, vllm_server
from harness.api import (
    Cell,
    Driver,
    EngineConfig,
    EngineError,
    GenerationRequest,
    GenerativeEngine,
    Headline,
    MonotonicClock,
    OpenEngine,
    OpenLoop,
    RequestRecord,
    RunSettings,
    registry,
    summarize_stream,
)
from harness.dist.rayclients import RayActors
from harness.engine import ExposesCounters, ExposesMetricsText, counter_delta
from harness.load import adapters
from harness.load.clients import (
    ClosedShare,
    Deadlines,
    Launcher,
    OpenShare,
    Share,
    SharedLoad,
    run_shared,
)
from harness.load.localclients import LocalProcesses
from harness.load.saturation import EarlyStop, Watch
from harness.load.streamstop import NO_EARLY_STOP_CLIENTS, open_loop_watched
from harness.metrics import servermetrics
from harness.metrics.slowlog import SlowLog
from harness.session.config import AUTO_CLIENTS
from harness.session.execution import ClientsOn
from harness.session.opening import merge_options
from workloads.lib import clientceiling, features
from workloads.lib.inputs import lengths

NO_LOCAL_MODEL = Path(os.devnull)
"""The model of a server the user runs, when no ``--model`` names a local copy: the
adapter asks the server (``/v1/models``) and keeps no client-side tokenizer."""

FIRST_ID = 4  # ids below are the tokenizer's special tokens (<s>, </s>, <unk>, <pad>)


def model_dir(settings: RunSettings) -> Path:
    """``--model``, or the embedded LLM of the run's model set (``workloads.lib.modelset``: the
    tiny Llama, or the 1B one), built on first use; a cell that needs the latter where
    its libraries are missing is skipped, saying what to install."""
    if settings.model is not None:
        return settings.model
    from workloads.lib import llm, modelset  # noqa: PLC0415  (builds with torch/transformers)

    spec = llm.SPECS[modelset.chosen(llm.TINY.name, settings.model_set)]
    if missing := llm.missing_libraries():
        what = "tiny LLM" if spec == llm.TINY else f"LLM {spec.name}"
        pytest.skip(f"the embedded {what} {llm.needs(missing)}, or give --model DIR")
    return llm.embedded_llm(settings.seed, spec)


def describe_embedded(cell: Cell, model: Path) -> None:
    """Which embedded LLM a cell ran (its name, shape, dtype, build), in its record."""
    if (model / "harness-model.json").is_file():
        from workloads.lib import llm  # noqa: PLC0415

        cell.engine_info["embedded_model"] = llm.describe(model)


def vocab_size(model: Path) -> int:
    config = model / "config.json"
    if not config.is_file():
        raise EngineError(f"{model} has no config.json: give a Hugging Face model directory")
    return int(json.loads(config.read_text())["vocab_size"])


def make_requests(
    n: int, seed: int, vocab: int, prompt: tuple[int, int, int], output: tuple[int, int, int]
) -> list[GenerationRequest]:
    """Unique token-id prompts (no prefix cache can flatter them) and asked output lengths."""
    rng = np.random.default_rng(seed)
    p_lens, o_lens = lengths(rng, n, *prompt), lengths(rng, n, *output)
    requests = []
    for i, (p, o) in enumerate(zip(p_lens, o_lens, strict=True)):
        ids = tuple(int(t) for t in rng.integers(FIRST_ID, vocab, size=p))
        requests.append(GenerationRequest(prompt=ids, max_tokens=o, request_id=f"r{seed}-{i}"))
    if len({r.prompt for r in requests}) != n:
        raise RuntimeError("duplicate prompts: the seeded generator must give unique prompts")
    return requests


def open_generative(
    request: pytest.FixtureRequest,
    open_engine: OpenEngine,
    cell: Cell,
    model: Path,
    options: dict[str, str] | None = None,
) -> GenerativeEngine:
    return _open(request, open_engine, cell, model, options)[0]


def _open(
    request: pytest.FixtureRequest,
    open_engine: OpenEngine,
    cell: Cell,
    model: Path,
    options: dict[str, str] | None = None,
    *,
    prefix_caching: bool | None = None,
) -> tuple[GenerativeEngine, EngineConfig]:
    """The engine, and the config it was opened with (for client processes to repeat).
    ``prefix_caching``: the engine's prefix cache on or off, for a workload that studies
    it (``prefix_cache_setting``); None: as the adapter defaults (off in every adapter,
    so that unique prompts measure no reuse)."""
    opts = dict(options or {})
    settings: RunSettings = request.getfixturevalue("harness_settings")
    endpoint = None
    if prefix_caching is not None:
        opts |= prefix_cache_setting(cell.engine, settings, on=prefix_caching)
    user = settings.options_for(cell.engine, cell.params)
    opts |= features.lora_options(cell.engine, settings, user, {**opts, **user})
    merged = merge_options(cell, settings, opts)  # skips a cell whose options the user fixed
    if cell.engine == "openai" and "base_url" not in user:
        endpoint, started = _served(request, merged, prefix_caching, model)
        opts["base_url"] = merged["base_url"] = endpoint.base_url
    engine = open_engine(model, options=opts, shared=True)
    describe_embedded(cell, model)
    if endpoint is not None:
        endpoint.pin_client()  # after open_engine: closing a previous engine may unpin
        cell.engine_info["server"] = _server_info(endpoint, started)
    if not isinstance(engine, GenerativeEngine):
        raise EngineError(f"{cell.engine} is not a generative engine")
    return engine, EngineConfig(model=model, device=settings.device, options=merged)


SERVER_SETTINGS = {
    "vllm": vllm_server.SERVER_DEFAULTS,
    "transformers": transformers_server.SERVER_DEFAULTS,
}
"""What a run may set of each server the harness starts, and the values it starts it with."""


def server_missing(server: str) -> str | None:
    """Why the harness cannot start ``server`` here (what to install), or None."""
    if server == "transformers":
        from engines.transformers_server import missing  # noqa: PLC0415

        lacking = missing()
        if lacking:
            return (
                "openai.server=transformers needs transformers serve, which needs"
                f" {', '.join(lacking)}: pip install -e '.[transformers]' (tox -e transformers)"
            )
        return None
    if importlib.util.find_spec("vllm") is None:
        return (
            "openai without --engine-opt openai.base_url=URL needs vllm installed so the"
            " harness can start a server (tox -e vllm), or openai.server=transformers"
        )
    return None


def _served(
    request: pytest.FixtureRequest,
    merged: dict[str, str],
    prefix_caching: bool | None,
    model: Path | None = None,
) -> tuple[Any, bool]:
    """The harness-started server a cell asks for (``openai.server``), and whether it was
    started for it; skips (saying why) where it cannot be had here."""
    kind = merged.get("server", "vllm")
    missing = server_missing(kind)
    if missing:
        pytest.skip(missing)
    if kind == "transformers" and prefix_caching is False:
        pytest.skip(transformers_server.CANNOT_SET["prefix_caching_off"])
    servers = request.getfixturevalue("openai_servers")  # workloads/conftest.py
    # defaults filled in: a cell that names a default shares the server of one that does not
    chosen = {k: merged.get(k, v) for k, v in SERVER_SETTINGS[kind].items()}
    if kind == "vllm":  # LoRA adapters, speculative decoding: set only where asked for
        chosen |= {k: merged[k] for k in vllm_server.FEATURES if k in merged}
    return servers.endpoint(  # type: ignore[no-any-return]
        prefix_caching=bool(prefix_caching),
        settings=chosen,
        before_start=request.getfixturevalue("engine_pool").before_new_instance,
        server=kind,
        model=model,  # what the cell opens (the multimodal workload: its VLM)
    )


def _server_info(endpoint: Any, started: bool) -> dict[str, Any]:
    info: dict[str, Any] = {
        "started_by": "the harness",
        "server": endpoint.server,
        "start_s": round(endpoint.start_s, 3),
        "started_for_this_cell": started,
        "settings": dict(endpoint.settings),
    }
    if endpoint.server == "transformers":
        info["version"] = version("transformers")
        info["prefix_caching"] = "on (transformers serve has no switch for it)"
    return info


def prefix_cache_setting(engine: str, settings: RunSettings, *, on: bool) -> dict[str, str]:
    """The option that sets ``engine``'s prefix cache ``on`` or off
    (``Capabilities.prefix_cache_option``); for ``openai``, none: the server the harness
    starts is started so. Skips the cell (saying why) where the setting cannot be had:
    an engine with no such option asked for it on, a server the user runs, or an
    ``--engine-opt`` that fixes it the other way."""
    user = settings.engine_options.get(engine, {})  # a grid's value: merge_options checks it
    if engine == "openai":
        if "base_url" in user:
            pytest.skip(
                "prefix caching is the setting of the server at base_url: benchmark it"
                " started with and without it, and compare the two runs"
            )
        return {}
    option = registry.load(engine).capabilities.prefix_cache_option
    if option is None:
        if on:
            pytest.skip(f"{engine} has no prefix cache the harness can turn on")
        return {}
    value = "1" if on else "0"
    if user.get(option, value) != value:
        pytest.skip(
            f"--engine-opt {option}={user[option]} fixes the prefix cache; this cell"
            f" studies it {'on' if on else 'off'}"
        )
    return {option: value}


def prefix_cache_account(counters: dict[str, float]) -> dict[str, Any]:
    """The engine's own prefix-cache account of a cell (``engine_counters``): prompt
    tokens looked up in the cache and found there (vLLM and null-gen count tokens)."""
    found = {k: v for k, v in counters.items() if PREFIX_COUNTERS in k}
    if not found:
        return {"absent": "the engine exposes no prefix-cache counters"}
    hits = sum(v for k, v in found.items() if "prefix_cache_hits" in k)
    queries = sum(v for k, v in found.items() if "prefix_cache_queries" in k)
    # no queries: the cache is off (vLLM then counts nothing)
    return {"hits": hits, "queries": queries, "hit_rate": hits / queries if queries else None}


@dataclass(frozen=True)
class Sent:
    """A run's requests, and (several client processes) which clients sent them."""

    records: list[RequestRecord]
    clients: dict[str, Any] | None = None
    ceiling: dict[str, Any] | None = None
    """What one client process sustains here, and how this cell's load compared."""
    lora: dict[str, Any] | None = None
    """The figures per LoRA adapter (``--lora``: ``adapters.by_adapter``)."""
    early_stop: EarlyStop | None = None
    early_stop_off: str | None = None
    """A search's early stop: what stopped the point, or why it could not (clients)."""

    @property
    def extra(self) -> dict[str, Any]:
        """For the cell's metrics: the clients, their request counts and lag p99s, the
        client ceiling the cell was sized or checked against, the figures per adapter."""
        out: dict[str, Any] = {} if self.clients is None else {"clients": self.clients}
        out |= {"lora": self.lora} if self.lora else {}
        return out | ({"client_ceiling": self.ceiling} if self.ceiling else {})


RUN_GRACE_S = 30.0
"""Past the last scheduled send and the request timeout, before a client is given up."""


@dataclass
class LoadSource:
    """Where a generative workload's load comes from: this process's driver, or, with
    ``--clients N`` (an HTTP engine), N client processes sharing one schedule."""

    driver: Driver
    aio: asyncio.Runner
    settings: RunSettings
    engine: str
    config: EngineConfig
    launcher: Launcher = field(default_factory=LocalProcesses)
    _warmup: tuple[GenerationRequest, ...] = ()
    _warm_users: int = 1
    chosen: int | None = None
    """Client processes chosen for this cell (``--clients auto``); None: the option's."""
    ceiling_check: bool = True
    """Measure the client's ceiling (an HTTP engine) before an open loop; off only where
    a test drives a launcher and no real client."""

    @property
    def clients(self) -> int:
        if self.chosen is not None:
            return self.chosen
        return max(1, self.settings.clients)  # auto, before a rate is known: this process

    @property
    def auto(self) -> bool:
        return self.settings.clients == AUTO_CLIENTS

    def warm_up(self, requests: Sequence[GenerationRequest], users: int) -> None:
        """Here, at once; with client processes, each client before the start barrier
        (``--clients auto``: once the cell's load has said how many there are). With
        ``--lora``, round the adapters: each is loaded before the window."""
        mix = self.settings.lora
        requests = mix.cycle(requests) if mix else requests
        if self.clients > 1 or self.auto:
            self._warmup, self._warm_users = tuple(requests), users
        else:
            self.aio.run(self.driver.closed_loop(requests, users))

    def _warm_here(self) -> None:
        if self._warmup and self.clients == 1:
            self.aio.run(self.driver.closed_loop(self._warmup, self._warm_users))
            self._warmup = ()

    def open_loop(
        self,
        requests: Sequence[GenerationRequest],
        offsets: npt.NDArray[np.float64],
        watch: Watch | None = None,
    ) -> Sent:
        """``watch``: a search's early stop, in this process only (harness.load.streamstop)."""
        ceiling = self._size_for(offsets)
        self._warm_here()
        requests = self._on_adapters(requests)
        if self.clients == 1:
            run = self.aio.run(open_loop_watched(self.driver, requests, offsets, watch))
            sent = Sent(run.records, ceiling=ceiling, early_stop=run.early_stop)
            return self._split(sent, run.ran(requests))
        last = float(offsets[-1]) if offsets.size else 0.0
        sent = self._shared(requests, OpenShare(tuple(offsets.tolist())), last)
        off = NO_EARLY_STOP_CLIENTS if watch else None
        return self._split(replace(sent, ceiling=ceiling, early_stop_off=off), requests)

    def _on_adapters(self, requests: Sequence[GenerationRequest]) -> Sequence[GenerationRequest]:
        mix = self.settings.lora
        return mix.assign(requests, self.settings.seed) if mix else requests

    def _split(self, sent: Sent, requests: Sequence[GenerationRequest]) -> Sent:
        """Record i ran request i (the driver's order): the figures per adapter."""
        mix = self.settings.lora
        return replace(sent, lora=adapters.by_adapter(mix, requests, sent.records)) if mix else sent

    def at_level(
        self, load: str, level: float, requests: Sequence[GenerationRequest], seed: int
    ) -> tuple[Sent, float | None, npt.NDArray[np.float64] | None]:
        """The streaming workloads' loads: ``closed``, ``level`` users; ``open``, Poisson at
        ``level`` requests/s over the requests' count. With the offered rate and the
        schedule (None for a closed loop)."""
        if load == "closed":
            return self.closed_loop(requests, int(level)), None, None
        n = len(requests)
        offsets = OpenLoop(rate=level, duration=n / level).schedule(seed)[:n]
        sent = self.open_loop(requests[: len(offsets)], offsets)
        return sent, len(offsets) / (n / level), offsets

    def _size_for(self, offsets: npt.NDArray[np.float64]) -> dict[str, Any] | None:
        """The client ceiling of an HTTP engine (measured once per process), the client
        processes ``--clients auto`` picks for this schedule, and a warning when each is
        offered more than it sustains quietly."""
        if not self.ceiling_check:
            return None
        found = clientceiling.ceiling(self.engine, self.settings, self.aio)
        if found is None or offsets.size < 2 or offsets[-1] <= offsets[0]:
            return None
        offered = (offsets.size - 1) / float(offsets[-1] - offsets[0])
        if self.auto:
            self.chosen = clientceiling.clients_for(offered, found)
        return found.to_json() | {
            "offered_per_s": offered,
            "clients": self.clients,
            "auto": self.auto,
            "warning": clientceiling.warning(offered, self.clients, found),
        }

    def closed_loop(
        self,
        requests: Sequence[GenerationRequest],
        users: int,
        min_duration_s: float | None = None,
        min_requests: int = 0,
    ) -> Sent:
        self._warm_here()
        requests = self._on_adapters(requests)
        if self.clients == 1:
            run = self.driver.closed_loop(requests, users, min_duration_s, min_requests)
            return self._split(Sent(self.aio.run(run)), requests)
        share = ClosedShare(users, min_duration_s, min_requests)
        return self._split(self._shared(requests, share, None), requests)

    def _shared(
        self, requests: Sequence[GenerationRequest], share: Share, last_send_s: float | None
    ) -> Sent:
        timeout = self.settings.reliability.request_timeout_s
        run_s = self.settings.cell_timeout_s  # a closed loop: as long as the cell may take
        if last_send_s is not None:
            run_s = min(run_s, last_send_s + timeout + RUN_GRACE_S)
        shared = SharedLoad(
            engine=self.engine,
            config=self.config,
            requests=tuple(requests),
            load=share,
            clients=self.clients,
            clock=self.launcher.clock,
            timeout_s=timeout,
            warmup=self._warmup,
        )
        deadlines = Deadlines(ready_s=self.settings.reliability.load_timeout_s, run_s=run_s)
        merged = run_shared(shared, self.launcher, deadlines)
        return Sent(list(merged.records), merged.to_json())


def load_source(
    request: pytest.FixtureRequest,
    open_engine: OpenEngine,
    cell: Cell,
    model: Path,
    aio: asyncio.Runner,
    *,
    prefix_caching: bool | None = None,
    options: dict[str, str] | None = None,
) -> tuple[GenerativeEngine, LoadSource]:
    """The cell's engine (here: describe(), counters) and where its load comes from;
    ``options``: engine settings the workload studies (``features.speculative_setting``)."""
    engine, config = _open(
        request, open_engine, cell, model, options, prefix_caching=prefix_caching
    )
    settings: RunSettings = request.getfixturevalue("harness_settings")
    driver = Driver(engine, MonotonicClock(), settings.reliability.request_timeout_s)
    return engine, LoadSource(driver, aio, settings, cell.engine, config, launcher_for(settings))


def launcher_for(settings: RunSettings) -> Launcher:
    """Where ``--clients N`` processes run: here, or as Ray actors (``--clients-on=ray``;
    on a ``--cells-on=ray`` node the cluster comes from ``RAY_ADDRESS``)."""
    if settings.clients_on is ClientsOn.RAY:
        return RayActors(address=settings.dist.address)
    return LocalProcesses()


HEADLINE = (
    Headline(label="TTFT p50", metric="ttft.p50", unit="ms", scale=1e3, ci="ttft.ci95.p50"),
    Headline(label="p99", metric="ttft.p99", unit="ms", scale=1e3, ci="ttft.ci95.p99"),
    Headline(label="TPOT p50", metric="tpot.p50", unit="ms", scale=1e3),
    Headline(label="E2E p99", metric="e2e.p99", unit="ms", scale=1e3, ci="e2e.ci95.p99"),
    Headline(label="out", metric="throughput.output_tokens_per_s", unit="tok/s"),
    Headline(label="goodput", metric="throughput.goodput_requests_per_s", unit="req/s"),
)


ENGINE_COUNTERS = (
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:num_preemptions_total",
    # prefix caching (vLLM V1 names, then older ones): what a shared prefix bought
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:gpu_prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits",
    "vllm:spec_decode_",  # speculative decoding: drafts, tokens proposed and accepted
)


PREFIX_COUNTERS = "prefix_cache_"
"""In a counter's name: a prefix-cache counter, of any engine (vLLM's, null-gen's)."""


def read_counters(engine: GenerativeEngine) -> dict[str, float] | None:
    return engine.counters() if isinstance(engine, ExposesCounters) else None


def engine_counters(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, float]:
    """The server's own account of the cell (a vLLM server: /metrics deltas)."""
    if before is None or after is None:
        return {}
    delta = counter_delta(before, after)
    return {k: v for k, v in delta.items() if k.startswith(ENGINE_COUNTERS) or PREFIX_COUNTERS in k}


@dataclass(frozen=True)
class ServerWatch:
    """The engine's server metrics scraped over a cell (``watch_server``), or why none."""

    scraper: servermetrics.Scraper | None
    absent: str = ""

    def observe(
        self, records: Sequence[RequestRecord], slow: SlowLog | None
    ) -> servermetrics.ServerView:
        if self.scraper is None:
            return servermetrics.ServerView({"absent": self.absent}, slow, ())
        return servermetrics.observe(self.scraper.stop(), records, slow)


def watch_server(request: pytest.FixtureRequest, engine: GenerativeEngine) -> ServerWatch:
    """Scrape the engine's server metrics (``ExposesMetricsText``) from now until
    ``finish(server=...)`` (at the latest the test's end), for ``metrics.server``: call
    it just before the measured requests. An engine without them is recorded as absent."""
    if not isinstance(engine, ExposesMetricsText):
        name = type(engine).__name__
        return ServerWatch(None, f"{name} exposes no Prometheus metrics (ExposesMetricsText)")
    source = functools.partial(engine.metrics_text, servermetrics.SERVER_NAMES)
    scraper = servermetrics.Scraper(source)
    scraper.start()
    request.addfinalizer(scraper.stop)
    return ServerWatch(scraper)


def finish(
    cell: Cell,
    settings: RunSettings,
    records: list[RequestRecord],
    *,
    offered_rate: float | None,
    seed: int,
    extra: dict[str, Any] | None = None,
    single_stream: str | None = None,
    samples: dict[str, list[float]] | None = None,
    headline: Sequence[Headline] = HEADLINE,
    server: ServerWatch | None = None,
) -> None:
    """Summarize the requests into the cell's metrics, evidence, samples and slow log;
    ``single_stream`` as in ``Cell.finish`` (a sample key, for one request in flight);
    ``samples`` adds to the latency samples (the traffic carried: ``traffic_samples``);
    ``server`` (``watch_server``): the server's own view, as ``metrics.server``, its
    state in each slow request, and a warning where the client's latency exceeds it."""
    summary = summarize_stream(records, settings.slos, offered_rate)
    extra, by_request = adapters.lift_samples(extra or {})  # --lora: each request's adapter
    headline = (*headline, *features.lora_headlines(extra))
    warned = ((extra or {}).get("client_ceiling") or {}).get("warning")
    evidence = summary.evidence
    if warned:
        evidence = replace(evidence, notes=(*evidence.notes, warned))
    seen = server.observe(records, summary.slow) if server is not None else None
    if seen is not None:
        evidence = replace(evidence, notes=(*evidence.notes, *seen.warnings))
    cell.finish(
        metrics=summary.metrics | (extra or {}) | ({"server": seen.metrics} if seen else {}),
        evidence=evidence,
        headline=headline,
        samples=summary.samples | (samples or {}) | by_request,
        window={"duration_s": summary.evidence.window_s, "requests": len(records)},
        seeds={"requests": seed, "model": settings.seed},
        slow=seen.slow if seen is not None else summary.slow,
        single_stream=single_stream,
    )


def traffic_samples(
    records: Sequence[RequestRecord], offsets: npt.NDArray[np.float64] | None
) -> dict[str, list[float]]:
    """What traffic the cell carried, per successful request: input tokens as the engine
    (or tokenizer) counted them, tokens asked for and received; and the inter-arrival
    times of the schedule (open loop only). The report draws them beside the latencies."""
    ok = [r for r in records if r.ok]
    out = {
        "input_tokens": [float(r.n_in) for r in ok],
        "asked_tokens": [float(r.n_asked) for r in ok],
        "output_tokens": [float(r.n_out) for r in ok],
    }
    if offsets is not None and offsets.size > 1:
        out["interarrival"] = [round(float(d), 7) for d in np.diff(offsets)]
    return out
