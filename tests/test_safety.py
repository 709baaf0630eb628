"""Secrets, hostile text and hostile file names: what the harness writes stays safe."""

from __future__ import annotations

import json

import pytest

from harness.exceptions import RecordError, UsageError
from harness.report import matrix
from harness.results import records, store
from harness.results import redact as redact_module
from harness.results.records import CellRecord, Status
from harness.results.redact import MASK, redact, redact_text, secrets_in
from harness.session.cell import make_cell_id
from harness.session.child import describe_exit
from harness.session.execution import parse_size
from tests.support.records_factory import manifest, record


def test_secret_named_variables_are_masked_everywhere():
    env = {"OPENAI_API_KEY": "sk-abcdef123456", "HF_TOKEN": "hf_zzzzzzzz", "HOME": "/root"}
    found = secrets_in(env)
    assert set(found) == {"sk-abcdef123456", "hf_zzzzzzzz"}
    data = {"msg": "key sk-abcdef123456 refused", "nested": ["hf_zzzzzzzz"], "n": 3}
    assert redact(data, found) == {"msg": f"key {MASK} refused", "nested": [MASK], "n": 3}
    assert redact_text("/root stays", found) == "/root stays"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("OPENAI_API_KEY", True),
        ("HF_TOKEN", True),
        ("MY_SERVICE_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("db_password", True),
        ("api-key", True),
        ("openai.apikey", True),
        ("GH_PAT", True),
        ("Authorization", True),
        # measurements whose names merely contain a secret's word
        ("token_time_s", False),
        ("prefill_token_s", False),
        ("max_num_batched_tokens", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("keyframe_interval", False),
        ("HOME", False),
        ("PWD", False),  # the shell's working directory: masking it hid every path
        ("OLDPWD", False),
    ],
)
def test_secret_names_are_told_by_their_words(name: str, secret: bool) -> None:
    assert redact_module.is_secret_name(name) is secret


def test_a_measurement_option_is_no_secret_and_its_value_stays_everywhere():
    """--engine-opt null-gen.token_time_s=0.0002 once made every "0.0002" in the
    records, matrices and reports read [REDACTED]."""
    assert redact_module.secrets_in_value("token_time_s", "0.0002") == []
    assert "131072" not in secrets_in({"VLLM_MAX_NUM_BATCHED_TOKENS": "131072"})


def test_inline_credentials_are_masked_without_knowing_them():
    text = "GET /v1?api_key=abc123xyz&x=1 Authorization: Bearer tok-999999"
    out = redact_text(text, ())
    assert "abc123xyz" not in out
    assert "tok-999999" not in out
    assert out.count(MASK) == 2


def test_records_are_redacted_when_written(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "s3cr3t-value-42")
    rec = record(status=Status.FAILED, reasons=("auth failed for s3cr3t-value-42",))
    text = records.dump(rec).decode()
    assert "s3cr3t-value-42" not in text
    assert f"auth failed for {MASK}" in text


def test_cell_ids_cannot_name_paths_outside_the_run():
    cid = make_cell_id("w", "e", {"model": "../../etc/passwd", "x": "a/b"})
    assert "/" not in cid
    assert records.check_id(cid) == cid
    with pytest.raises(ValueError, match="safe id"):
        store.cell_path(store.Path("/r"), "../escape")


def test_a_planted_or_renamed_record_is_an_error(tmp_path):
    run = store.new_run_dir(tmp_path)
    store.write_record(run, record(cell_id="a", run_id=run.name))
    (run / "cells" / "a.json").rename(run / "cells" / "b.json")
    with pytest.raises(RecordError, match=r"b\.json: holds cell 'a'"):
        store.read_records(run)


def test_latest_attempt_wins_and_every_attempt_is_kept(tmp_path):
    run = store.new_run_dir(tmp_path)
    store.write_record(run, record(cell_id="a", run_id=run.name, status=Status.FAILED))
    store.write_record(run, record(cell_id="a", run_id=run.name, attempt=2))
    assert [r.attempt for r in store.read_all_records(run)] == [1, 2]
    [latest] = store.read_records(run)
    assert (latest.attempt, latest.status) == (2, Status.OK)
    assert (run / "cells" / "a~2.json").is_file()


def test_a_schema_1_record_migrates_to_the_current_schema():
    data = json.loads(records.dump(record()))
    for key in ("attempt", "stderr_tail"):
        data.pop(key)
    data["schema_version"] = 1
    back = records.parse(CellRecord, json.dumps(data).encode(), "old.json")
    assert (back.schema_version, back.attempt, back.stderr_tail) == (records.SCHEMA_VERSION, 1, ())


def test_matrix_text_from_engines_is_inert():
    rec = record(
        status=Status.FAILED, reasons=("<img src=x onerror=alert(1)> | [link](http://x) *b*",)
    )
    m = matrix.build(manifest([(rec.cell_id, rec.engine, dict(rec.params))]), [rec])
    md = matrix.to_markdown(m)
    assert "<img" not in md
    assert "&lt;img src=x onerror=alert(1)&gt; \\| \\[link\\](http://x) \\*b\\*" in md
    csv_text = matrix.to_csv(
        matrix.build(
            manifest([(rec.cell_id, rec.engine, dict(rec.params))]),
            [record(status=Status.FAILED, reasons=('=HYPERLINK("http://x")',))],
        )
    )
    assert "'=HYPERLINK" in csv_text


@pytest.mark.parametrize(
    ("text", "size"),
    [("512MiB", 512 * 2**20), ("2G", 2 * 2**30), ("1.5GiB", int(1.5 * 2**30)), ("4096", 4096)],
)
def test_sizes_parse(text, size):
    assert parse_size(text, "--worker-memory") == size


@pytest.mark.parametrize("text", ["lots", "-1G", "0"])
def test_bad_sizes_are_usage_errors(text):
    with pytest.raises(UsageError, match="--worker-memory"):
        parse_size(text, "--worker-memory")


def test_exit_statuses_read_as_words():
    assert describe_exit(-11) == "killed by SIGSEGV"
    assert "out-of-memory killer" in describe_exit(-9)
    assert describe_exit(17) == "exit code 17"


def test_url_credentials_are_masked_without_knowing_them():
    text = "endpoint http://admin:hunter2pw@127.0.0.1:9/v1?x=1&api_key=Q&token=t not usable"
    out = redact_text(text, ())
    assert "hunter2pw" not in out
    assert "admin" not in out
    assert "api_key=Q" not in out
    assert out == (
        f"endpoint http://{MASK}@127.0.0.1:9/v1?x=1&api_key={MASK}&token={MASK} not usable"
    )


def test_secrets_in_option_values_are_remembered(monkeypatch):
    """A URL password also appears decoded, alone, in an engine's message: once the
    option has been seen, the value itself is a secret everywhere."""
    monkeypatch.setattr(redact_module, "_remembered", set())
    redact_module.remember_options(
        {"openai": {"base_url": "http://u:p%40ss-word9@h:1/?api_key=zzzzzz", "model": "m"}},
    )
    redact_module.remember(redact_module.secrets_in_value("api_key", "sk-plain-value"))
    secrets = redact_module.known_secrets()
    assert {"p%40ss-word9", "p@ss-word9", "zzzzzz", "sk-plain-value"} <= set(secrets)
    assert redact_text("login as p@ss-word9 failed") == f"login as {MASK} failed"
    assert "m" not in secrets


def test_masking_never_rewrites_the_ids_a_record_is_filed_under(monkeypatch):
    """A cell parameter named like a credential ("token=1234") was masked inside the cell
    id, and the record no longer named its own file."""
    monkeypatch.setenv("SOME_TOKEN", "1234-5678-90")
    rec = record(
        cell_id="w.e.token=1234-5678-90",
        params={"token": "1234-5678-90"},
        status=Status.FAILED,
        reasons=("token=1234-5678-90 refused",),
    )
    back = records.parse(CellRecord, records.dump(rec), "r.json")
    assert back.cell_id == "w.e.token=1234-5678-90"
    assert back.params == {"token": "1234-5678-90"}
    assert back.reasons == (f"token={MASK} refused",)
