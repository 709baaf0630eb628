import json

import pytest
from pydantic import ValidationError

from harness.exceptions import NewerSchemaError, RecordError
from harness.results import records
from harness.results.records import CellRecord, Status
from tests.support.records_factory import record


def test_round_trip_is_lossless_including_infinity():
    rec = record()
    data = records.dump(rec)
    back = records.parse(CellRecord, data, "mem")
    assert back == rec
    assert back.metric("e2e.adjusted.p99") == float("inf")
    assert b'"p99": "Infinity"' in data
    assert records.dump(back) == data  # byte-stable


def test_dump_is_strict_json():
    json.loads(records.dump(record()), parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))


def test_newer_schema_is_refused_with_the_file_name(tmp_path):
    data = json.loads(records.dump(record()))
    data["schema_version"] = records.SCHEMA_VERSION + 1
    path = tmp_path / "cell.json"
    path.write_text(json.dumps(data))
    with pytest.raises(NewerSchemaError, match=r"cell\.json.*newer"):
        records.read(CellRecord, path)


def test_corrupt_file_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_bytes(b'{"schema_version": 1, "run_id": ')
    with pytest.raises(RecordError, match=r"broken\.json: corrupt"):
        records.read(CellRecord, path)
    path.write_text('{"schema_version": 1, "run_id": "r"}')
    with pytest.raises(RecordError, match=r"broken\.json: invalid CellRecord"):
        records.read(CellRecord, path)


def test_older_schema_is_migrated(monkeypatch):
    old = json.loads(records.dump(record()))
    old.pop("histograms")
    old["schema_version"] = 1

    def v1_to_v2(d):
        return {**d, "schema_version": 2, "histograms": {"migrated": {"1": 1}}}

    monkeypatch.setattr(records, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(records.MIGRATIONS, 1, v1_to_v2)
    back = records.parse(CellRecord, json.dumps(old).encode(), "old.json")
    assert back.schema_version == 2
    assert back.histograms == {"migrated": {"1": 1}}


def test_record_checks_itself():
    with pytest.raises(ValidationError, match="needs metrics"):
        record(status=Status.OK, metrics={})
    with pytest.raises(ValidationError, match="must say why"):
        record(status=Status.SKIPPED, reasons=())
    with pytest.raises(ValidationError, match="contradicts"):
        record(status=Status.OK, validity=records.ValidityInfo(verdict="invalid", reasons=("x",)))
    with pytest.raises(ValidationError, match="safe id"):
        record(cell_id="../escape")
    with pytest.raises(ValidationError, match="frozen"):
        record().status = Status.FAILED  # type: ignore[misc]


def test_params_keep_declared_order_through_serialization():
    rec = record(params={"rate": 1.0, "mode": "x", "batch": 8})
    back = records.parse(CellRecord, records.dump(rec), "mem")
    assert list(back.params) == ["rate", "mode", "batch"]


def test_schema_3_records_migrate_to_4_without_slow_requests():
    old = json.loads(records.dump(record()))
    old.pop("slow_requests")
    old["schema_version"] = 3
    back = records.parse(CellRecord, json.dumps(old).encode(), "v3.json")
    assert back.schema_version == records.SCHEMA_VERSION
    assert back.slow_requests == ()
    assert all(h.ci is None for h in back.headline)
