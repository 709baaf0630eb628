"""The result store: run directories, atomic never-overwriting cell records, manifests.

Layout::

    <results-dir>/<run-id>/manifest.json       every planned cell; completed last
    <results-dir>/<run-id>/cells/<cell-id>.json one record per cell, written once
    <results-dir>/<run-id>/cells/<cell-id>~N.json   attempt N (N > 1) after ``--resume``
    <results-dir>/<run-id>/cells/<cell-id>@R.json   repeat R (R > 1) with ``--repeats``
    <results-dir>/<run-id>/cells/<cell-id>@R~N.json attempt N of repeat R
    <results-dir>/<run-id>/logs/                  engine worker output (redacted)

A record is written to a temporary file in the same directory, fsynced, then
hard-linked to its final name (``link`` fails if the name exists, so nothing is ever
overwritten) and the directory is fsynced. A crash at any point leaves either no
record or the whole record.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import os
import secrets
import tempfile
from pathlib import Path

from harness.exceptions import RecordError, RecordExists, StorageError
from harness.results.records import CellRecord, M, Manifest, check_id, dump, read, slot

MANIFEST = "manifest.json"
CELLS = "cells"
LOGS = "logs"
ATTEMPT_SEP = "~"  # not an id character, so ``<cell-id>~N`` parses one way only


def _storage_error(exc: OSError, path: Path) -> StorageError:
    why = {
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "disk quota exceeded",
        errno.EROFS: "the file system is read-only",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    return StorageError(exc.errno or 0, f"cannot write in {path}: {why}")


def utcnow() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_run_dir(results_dir: Path) -> Path:
    """Create a fresh run directory; two concurrent runs never get the same one."""
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    for _ in range(100):
        run_dir = results_dir / f"{stamp}-{secrets.token_hex(3)}"
        try:
            run_dir.mkdir()
        except FileExistsError:
            continue
        (run_dir / CELLS).mkdir()
        return run_dir
    raise RuntimeError(f"could not create a unique run directory under {results_dir}")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(directory: Path, data: bytes) -> Path:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, StorageError):
            raise _storage_error(exc, directory) from exc
        raise
    return Path(tmp)


def write_new(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically; raise ``RecordExists`` if it exists."""
    tmp = _write_temp(path.parent, data)
    try:
        os.link(tmp, path)
    except FileExistsError as exc:
        raise RecordExists(f"{path} already exists; records are never overwritten") from exc
    except OSError as exc:
        raise _storage_error(exc, path.parent) from exc
    finally:
        os.unlink(tmp)
    _fsync_dir(path.parent)


def replace(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` (the manifest only: it is the run's index, not a result)."""
    tmp = _write_temp(path.parent, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def cell_path(run_dir: Path, cell_id: str, attempt: int = 1, repeat: int = 1) -> Path:
    suffix = "" if attempt == 1 else f"{ATTEMPT_SEP}{attempt}"
    return run_dir / CELLS / f"{slot(check_id(cell_id), repeat)}{suffix}.json"


def record_path(run_dir: Path, record: CellRecord) -> Path:
    return cell_path(run_dir, record.cell_id, record.attempt, record.repeat)


def write_record(run_dir: Path, record: CellRecord) -> Path:
    path = record_path(run_dir, record)
    write_new(path, dump(record))
    return path


def write_manifest(run_dir: Path, manifest: Manifest) -> Path:
    path = run_dir / MANIFEST
    replace(path, dump(manifest))
    return path


def _read(model: type[M], path: Path) -> M:
    """``records.read``, where a file that cannot be read at all (a directory, a dangling
    link, no permission) is a RecordError naming it like a corrupt one."""
    try:
        return read(model, path)
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise RecordError(f"{path}: cannot read it: {why}") from exc
    except RecursionError as exc:  # JSON nested past the parser's stack
        raise RecordError(f"{path}: corrupt results file (nested too deeply)") from exc


def read_manifest(run_dir: Path) -> Manifest:
    path = run_dir / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no {MANIFEST})")
    return _read(Manifest, path)


def read_cell_file(path: Path) -> CellRecord:
    """One record file; RecordError naming it if it cannot be read, parsed, or is not
    under its own name."""
    record = _read(CellRecord, path)
    if path.name != record_path(path.parent.parent, record).name:
        raise RecordError(
            f"{path}: holds cell {record.cell_id!r} repeat {record.repeat} attempt"
            f" {record.attempt}; the file name does not match (renamed or planted?)"
        )
    return record


def read_all_records(run_dir: Path) -> list[CellRecord]:
    """Every record of a run, every repeat and attempt, by cell id, repeat, then attempt; a
    bad file is an error."""
    cells = run_dir / CELLS
    if not cells.is_dir():
        raise FileNotFoundError(f"{run_dir} has no {CELLS}/ directory")
    paths = [p for p in cells.iterdir() if p.suffix == ".json" and not p.name.startswith(".")]
    found = [read_cell_file(p) for p in paths]
    return sorted(found, key=lambda r: (r.cell_id, r.repeat, r.attempt))


def read_records(run_dir: Path) -> list[CellRecord]:
    """The latest attempt of every repeat of every cell of a run, by cell id and repeat."""
    latest: dict[str, CellRecord] = {}
    for record in read_all_records(run_dir):
        latest[record.slot] = record  # attempts come in ascending order
    return list(latest.values())
