"""Engine-configuration grids (``--engine-grid``, ``--engine-grid-file``): parsing and
validation at configuration time, and a run that measures every cell once per
configuration, keeps going past a configuration that cannot start, and records each
configuration as part of the cell's identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engine import registry
from harness.exceptions import UsageError
from harness.results import store
from harness.session.grid import DEFAULT_LABEL, EngineGrid, GridPoint, parse_grid
from tests.support.fakes import FakeGenerativeEngine, FakeTensorEngine

pytest_plugins = ["pytester"]

ENGINES = ("null", "null-gen")


def validate(engine: str, options: object) -> None:
    registry.load(engine).validate_options(options)  # type: ignore[arg-type]


def grid(values: list[str], file: str | None = None, opts: dict | None = None) -> EngineGrid:
    return parse_grid(values, file, ENGINES, opts or {}, validate)


def test_values_of_several_keys_give_their_cross_product_in_order():
    g = grid(["null-gen.token_time_s=0,0.001", "null-gen.prefill_token_s=0,1e-4"])
    labels = g.labels("null-gen")
    assert labels == (
        "token_time_s=0,prefill_token_s=0",
        "token_time_s=0,prefill_token_s=1e-4",
        "token_time_s=0.001,prefill_token_s=0",
        "token_time_s=0.001,prefill_token_s=1e-4",
    )
    assert dict(g.options("null-gen", labels[2])) == {
        "token_time_s": "0.001",
        "prefill_token_s": "0",
    }
    assert g.labels("null") == (DEFAULT_LABEL,)  # an engine without a grid: one config
    assert g.options("null", DEFAULT_LABEL) == {}
    assert g.to_json()["null-gen"][0] == {
        "label": "token_time_s=0,prefill_token_s=0",
        "options": {"token_time_s": "0", "prefill_token_s": "0"},
    }


def test_a_file_names_its_configurations(tmp_path: Path):
    f = tmp_path / "grid.toml"
    f.write_text(
        "[null-gen.fast]\ntoken_time_s = 0\nprefix_cache = true\n\n"
        "[null-gen.slow]\ntoken_time_s = 0.002\n"
    )
    g = grid([], str(f))
    assert g.labels("null-gen") == ("fast", "slow")
    assert dict(g.options("null-gen", "fast")) == {"token_time_s": "0", "prefix_cache": "1"}


@pytest.mark.parametrize(
    ("values", "opts", "message"),
    [
        (["null-gen.token_time_s"], None, "expected ENGINE.KEY=VALUE1,VALUE2"),
        (["token_time_s=1,2"], None, "expected ENGINE.KEY=VALUE1,VALUE2"),
        (["vllm.max_num_seqs=4,16"], None, "'vllm' is not an engine of this run"),
        (["null-gen.token_time_s=0,,1"], None, "a value is empty"),
        (["null-gen.token_time_s=1,1"], None, "a value is given twice"),
        (
            ["null-gen.token_time_s=1", "null-gen.token_time_s=2"],
            None,
            "null-gen.token_time_s is given twice",
        ),
        (
            ["null-gen.token_time_s=0,-1"],
            None,
            "--engine-grid configuration token_time_s=-1 of null-gen: token_time_s must be",
        ),
        (["null-gen.bogus=1"], None, "configuration bogus=1 of null-gen: unknown option"),
        (
            ["null-gen.token_time_s=0,1"],
            {"null-gen": {"token_time_s": "1"}},
            "--engine-grid and --engine-opt both set null-gen.token_time_s",
        ),
    ],
)
def test_bad_grids_are_usage_errors_naming_what_is_wrong(values, opts, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        grid(values, opts=opts)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not toml [", "is not TOML"),
        ("", "names no configuration"),
        ("[vllm.a]\nmax_num_seqs = 4\n", "'vllm' is not an engine of this run"),
        ('[null-gen."bad name"]\ntoken_time_s = 0\n', "configuration name 'bad name'"),
        ("[null-gen.a]\ntoken_time_s = [0, 1]\n", "null-gen.a.token_time_s: give a string"),
        ("[null-gen.a]\nprefix_cache = 3\n", "configuration a of null-gen: prefix_cache must be"),
        ("null-gen = 1\n", r"\[null-gen.NAME\] tables hold"),
    ],
)
def test_bad_grid_files_are_usage_errors(tmp_path: Path, text: str, message: str):
    f = tmp_path / "grid.toml"
    f.write_text(text)
    with pytest.raises(UsageError, match=message):
        grid([], str(f))


def test_a_missing_file_and_both_sources_for_one_engine_are_refused(tmp_path: Path):
    with pytest.raises(UsageError, match="cannot read it"):
        grid([], str(tmp_path / "none.toml"))
    f = tmp_path / "grid.toml"
    f.write_text("[null-gen.a]\ntoken_time_s = 0\n")
    with pytest.raises(UsageError, match="both give configurations of null-gen"):
        grid(["null-gen.token_time_s=0,1"], str(f))


def test_grid_objects_check_themselves():
    with pytest.raises(ValueError, match="distinct labels"):
        EngineGrid({"null": (GridPoint("a"), GridPoint("a"))})
    with pytest.raises(ValueError, match="without '/'"):
        GridPoint("a/b")


CELLS = """
from pathlib import Path
import pytest
from harness.results.records import Headline
from harness.metrics.validity import Evidence

@pytest.mark.requires(family="tensor")
@pytest.mark.parametrize("n", [100, 200])
def test_measure(cell, open_engine, n):
    engine = open_engine(Path("model"), shared=True)
    cell.finish(
        metrics={"x": {"p50": 0.001 * n}},
        evidence=Evidence(samples=n, failed=0, window_s=2.0),
        headline=[Headline(label="p50", metric="x.p50", unit="ms", scale=1e3)],
    )

@pytest.mark.requires(family="tensor")
def test_sets_its_own(cell, open_engine, tmp_path):
    open_engine(tmp_path / "model", options={"fail": "infer"})
"""


@pytest.fixture
def fakes():
    with (
        registry.registered("fake-tensor", FakeTensorEngine),
        registry.registered("fake-generative", FakeGenerativeEngine),
    ):
        yield


def test_a_grid_run_measures_every_configuration_and_survives_one_that_cannot_start(
    pytester, fakes
):
    pytester.makepyfile(test_wl=CELLS)
    results = pytester.path / "runs"
    result = pytester.runpytest(
        "--engine=fake-tensor,fake-generative",
        "--engine-grid=fake-tensor.fail=load,no",
        f"--results-dir={results}",
        "--isolation=none",
    )
    (run_dir,) = list(results.iterdir())
    manifest = store.read_manifest(run_dir)
    planned = [(c.engine, c.params.get("config"), c.workload) for c in manifest.planned]
    # a configuration's cells together, in the grid's order, then the next engine's
    assert planned[:6] == [
        ("fake-tensor", "fail=load", "measure"),
        ("fake-tensor", "fail=load", "measure"),
        ("fake-tensor", "fail=load", "sets_its_own"),
        ("fake-tensor", "fail=no", "measure"),
        ("fake-tensor", "fail=no", "measure"),
        ("fake-tensor", "fail=no", "sets_its_own"),
    ]
    assert {c for e, c, _ in planned[6:]} == {"default"}  # fake-generative has no grid
    assert manifest.settings["engine_grid"] == {
        "fake-tensor": [
            {"label": "fail=load", "options": {"fail": "load"}},
            {"label": "fail=no", "options": {"fail": "no"}},
        ]
    }
    records = {r.cell_id: r for r in store.read_records(run_dir)}
    broken = records["measure.fake-tensor.config=fail=load.n=100"]
    assert broken.status.value == "failed"
    assert "this configuration cannot start" in broken.reasons[0]
    again = records["measure.fake-tensor.config=fail=load.n=200"]
    assert "failed to load for an earlier cell" in again.reasons[0]  # not retried
    ok = records["measure.fake-tensor.config=fail=no.n=100"]
    assert ok.status.value == "ok"
    assert ok.params == {"config": "fail=no", "n": 100}
    assert ok.engine_info["options"] == {"fail": "no"}
    assert ok.engine_info["start"]["in_this_cell"] is True
    shared = records["measure.fake-tensor.config=fail=no.n=200"]
    assert shared.engine_info["start"]["in_this_cell"] is False  # started by the cell before
    assert shared.engine_info["start"]["seconds"] == ok.engine_info["start"]["seconds"]
    own = records["sets_its_own.fake-tensor.config=fail=no"]
    assert own.status.value == "skipped"
    assert own.reasons == (
        "this cell sets fail=infer itself (what it measures), and its --engine-grid"
        " configuration fixes fail=no",
    )
    matrix = (run_dir / "matrix.md").read_text()
    assert "| config | n |" in matrix
    assert "| fail=load | 100 |" in matrix
    result.stdout.fnmatch_lines(["*cells: * failed, * ok, * skipped*"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine-grid=fake-tensor.fail"], "expected ENGINE.KEY=VALUE1,VALUE2"),
        (["--engine-grid=fake-tensor.speed=1,2"], "configuration speed=1 of fake-tensor"),
        (["--engine-grid=onnxruntime.x=1"], "'onnxruntime' is not an engine of this run"),
        (["--engine-grid-file=/no/such.toml"], "--engine-grid-file '/no/such.toml': cannot read"),
    ],
)
def test_bad_grid_options_stop_the_run_before_any_cell(pytester, fakes, args, message):
    pytester.makepyfile(test_wl=CELLS)
    result = pytester.runpytest("--engine=fake-tensor", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])
    assert "Traceback" not in result.stderr.str()


def test_server_settings_become_the_harness_started_servers_flags():
    from engines.vllm_server import command, setting_flags  # noqa: PLC0415

    assert setting_flags({"max_num_seqs": "4"}) == [
        "--max-num-seqs",
        "4",
        "--max-num-batched-tokens",
        "2048",
    ]
    argv = command(Path("m"), 8000, settings={"max_num_batched_tokens": "512"}, cpu_build=True)
    assert argv[argv.index("--max-num-seqs") + 1] == "16"
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "512"
    with pytest.raises(ValueError, match="not a server setting the harness sets: dtype"):
        setting_flags({"dtype": "bf16"})


def test_server_settings_with_a_users_server_are_refused_at_configuration():
    engines = ("openai",)
    user = {"openai": {"base_url": "http://127.0.0.1:9"}}
    with pytest.raises(UsageError, match="max_num_seqs sets the server the harness starts"):
        parse_grid(["openai.max_num_seqs=2,4"], None, engines, user, validate)
    g = parse_grid(["openai.max_num_seqs=2,4"], None, engines, {}, validate)
    assert g.labels("openai") == ("max_num_seqs=2", "max_num_seqs=4")


def test_a_failed_servers_reason_starts_with_its_last_exception():
    from engines.vllm_server import last_error  # noqa: PLC0415

    log = (
        "INFO starting\nTraceback (most recent call last):\n  File 'x.py', line 1\n"
        "ValueError: first\nTraceback (most recent call last):\n"
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig\n"
        "  Value error, max_num_batched_tokens (8) must be >= max_num_seqs (16).\n"
        "INFO shutting down\n"
    )
    assert last_error(log) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig"
        " Value error, max_num_batched_tokens (8) must be >= max_num_seqs (16)."
    )
    assert last_error("INFO all fine\n") == "no exception line in its log"


def test_a_secret_in_a_grid_value_is_masked_from_then_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from harness.results import redact  # noqa: PLC0415
    from harness.results.redact import redact_text  # noqa: PLC0415

    monkeypatch.setattr(redact, "_remembered", set())  # this process's other tests keep theirs

    url = "http://user:grid-hunter2-secret@127.0.0.1:9"
    with pytest.raises(UsageError, match="a value with '/' cannot label a configuration"):
        parse_grid([f"openai.base_url={url}"], None, ("openai",), {}, validate)
    f = tmp_path / "grid.toml"
    f.write_text(f'[openai.mine]\nbase_url = "{url}"\n')
    parse_grid([], str(f), ("openai",), {}, validate)
    assert "grid-hunter2-secret" not in redact_text(f"cannot reach {url}")


@pytest.mark.slow
def test_the_server_of_openai_cells_cannot_vary_in_a_grid(tmp_path: Path):
    from tests.support.runner import pytest_workloads  # noqa: PLC0415

    f = tmp_path / "grid.toml"
    f.write_text(
        '[openai.a]\nbase_url = "http://127.0.0.1:9"\n[openai.b]\nbase_url = "http://127.0.0.1:10"\n'
    )
    proc = pytest_workloads(tmp_path, "--engine=openai", f"--engine-grid-file={f}")
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "openai.base_url cannot vary in a grid" in proc.stderr
    assert "Traceback" not in proc.stderr
