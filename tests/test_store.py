import os
import threading

import pytest

from harness.exceptions import RecordExists, StorageError
from harness.results import store
from tests.support.records_factory import manifest, record


def test_record_is_written_once_and_never_overwritten(tmp_path):
    run = store.new_run_dir(tmp_path)
    first = record(run_id=run.name, p50=0.001)
    path = store.write_record(run, first)
    with pytest.raises(RecordExists, match="never overwritten"):
        store.write_record(run, record(run_id=run.name, p50=0.999))
    assert store.read_records(run) == [first]
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp left behind


def test_failure_mid_write_leaves_no_partial_record(tmp_path, monkeypatch):
    run = store.new_run_dir(tmp_path)

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(StorageError, match="no space left on the device"):
        store.write_record(run, record(run_id=run.name))
    monkeypatch.undo()
    assert list((run / store.CELLS).iterdir()) == []


def test_failure_between_temp_write_and_rename_leaves_nothing(tmp_path, monkeypatch):
    run = store.new_run_dir(tmp_path)
    existing = record("batching.fake.rate=1", run_id=run.name)
    store.write_record(run, existing)

    def crash(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "link", crash)
    with pytest.raises(KeyboardInterrupt):
        store.write_record(run, record(run_id=run.name))
    monkeypatch.undo()
    files = sorted(p.name for p in (run / store.CELLS).iterdir())
    assert files == ["batching.fake.rate=1.json"]
    assert store.read_records(run) == [existing]


def test_concurrent_runs_get_distinct_directories(tmp_path):
    made: list[str] = []
    lock = threading.Lock()

    def make():
        for _ in range(20):
            d = store.new_run_dir(tmp_path)
            with lock:
                made.append(d.name)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == len(set(made)) == 80


def test_cell_ids_cannot_escape_the_run_directory(tmp_path):
    with pytest.raises(ValueError, match="safe id"):
        store.cell_path(tmp_path, "../../etc/passwd")


def test_a_corrupt_record_among_good_ones_is_an_error(tmp_path):
    run = store.new_run_dir(tmp_path)
    store.write_record(run, record(run_id=run.name))
    (run / store.CELLS / "zz.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"zz\.json: corrupt"):
        store.read_records(run)


def test_manifest_round_trip(tmp_path):
    run = store.new_run_dir(tmp_path)
    m = manifest([("a.fake.x=1", "fake", {"x": 1})], run_id=run.name, state="running")
    store.write_manifest(run, m)
    assert store.read_manifest(run) == m
    done = m.model_copy(update={"state": "complete"})
    store.write_manifest(run, done)
    assert store.read_manifest(run).state == "complete"
    assert store.read_records(run) == []
