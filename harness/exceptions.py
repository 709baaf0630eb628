"""Every error the harness raises on purpose, under one base class, ``HarnessError``.

Each also derives from the built-in exception callers caught before this module existed
(``ValueError`` for bad input, ``OSError`` for storage, ...), so ``except ValueError`` in
a caller keeps working. The modules that raise them re-export them where callers import
them today (``from harness.engine import EngineError``).

Two exceptions are not errors and live with the code that raises them: the pool's
``NewEngineInstance`` (a ``BaseException`` that ends a worker so a fresh process takes
the next engine instance) and the plugin's ``Terminated`` (SIGTERM as a
``KeyboardInterrupt``). ``DamagedRunError`` (``harness.results.reading``) carries that
module's ``Damaged`` entries and derives from ``RecordError`` here.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base of every error the harness raises on purpose."""


class UsageError(HarnessError, ValueError):
    """A bad option value; the plugin turns it into ``pytest.UsageError``."""


# -- engines ------------------------------------------------------------------------------


class EngineError(HarnessError, RuntimeError):
    """The engine failed in a way that invalidates the cell (not a single request)."""


class EngineUnavailable(EngineError):
    """The engine cannot run on this machine; the message says precisely why."""


class RequestError(HarnessError, RuntimeError):
    """One request failed and the engine is fine (an HTTP error status, an error event):
    counted as a failed request whatever its message says."""


class UnknownEngine(HarnessError, LookupError):
    """No adapter of that name is registered; the message lists the registered ones."""

    def __init__(self, name: str, known: list[str]) -> None:
        listing = ", ".join(known) if known else "(none registered: is the package installed?)"
        super().__init__(f"unknown engine {name!r}; registered engines: {listing}")
        self.name = name
        self.known = known


class Cancelled(HarnessError, RuntimeError):
    """The parent called the run off before the start (another client failed to load)."""


# -- results ------------------------------------------------------------------------------


class RecordError(HarnessError, ValueError):
    """A results file that cannot be trusted; the message names the file."""


class NewerSchemaError(RecordError):
    """A results file written by a newer harness than this one."""


class RecordExists(HarnessError, FileExistsError):
    """A cell record is never overwritten: an attempt's file already exists."""


class StorageError(HarnessError, OSError):
    """The results directory cannot take a write (full disk, quota, read-only)."""


class WriteError(StorageError):
    """A report file could not be written; the message names it and the OS's reason.
    A StorageError, so that a run's end-of-run report fails the way its records do."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()  # without OSError's "[Errno N]" prefix


class RunLocked(HarnessError, RuntimeError):
    """Another live process is writing this run directory."""
