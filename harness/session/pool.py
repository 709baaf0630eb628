"""Engines shared across consecutive cells: one alive at a time, failures remembered."""

from __future__ import annotations

from collections.abc import Callable

from harness.engine import Engine, EngineError

Key = tuple[str, ...]


class NewEngineInstance(BaseException):
    """Raised by a worker's pool when a cell needs a different shared engine than earlier
    cells loaded: the cell is handed to a fresh worker, so that every engine instance
    starts in a clean process (no threads, caches or fragments of the previous one).
    A BaseException so that a workload's ``except Exception`` cannot swallow it."""


class EnginePool:
    """The shared engine of consecutive cells with the same configuration (vLLM takes
    tens of seconds to start). One engine is kept alive at a time: an idle engine (vLLM's
    engine core polls) would take CPU from the one being measured. A failed load is
    remembered so later cells of that configuration fail at once.

    With ``fresh_process_per_instance`` (in a worker), switching to another configuration
    raises ``NewEngineInstance`` instead of loading it next to the leftovers of the last.
    """

    def __init__(self, fresh_process_per_instance: bool = False) -> None:
        self._engines: dict[Key, Engine | EngineError] = {}
        self._this_cell: set[Key] = set()
        self._fresh_process = fresh_process_per_instance

    def new_cell(self) -> None:
        self._this_cell = set()

    def before_new_instance(self) -> None:
        """Call before starting what a new engine configuration needs outside the pool (a
        server): in a worker that holds an earlier configuration's engine, the cell goes to
        a fresh worker first, rather than starting it here and again there."""
        if self._fresh_process and set(self._engines) - self._this_cell:
            raise NewEngineInstance("a new engine configuration")

    def get(self, key: Key, make: Callable[[], Engine]) -> Engine:
        if key not in self._engines:
            if self._fresh_process and set(self._engines) - self._this_cell:
                raise NewEngineInstance(key)
            errors = self.close_all(keep_failures=True)
            if errors:
                raise EngineError("closing the previous shared engine failed: " + "; ".join(errors))
            self._this_cell.add(key)
            try:
                self._engines[key] = make()
            except EngineError as exc:
                self._engines[key] = exc
                raise  # this cell's own failure, in the engine's words
        found = self._engines[key]
        if isinstance(found, EngineError):
            raise EngineError(f"engine failed to load for an earlier cell: {found}")
        return found

    def close_all(self, keep_failures: bool = False) -> list[str]:
        errors = []
        for key, engine in list(self._engines.items()):
            if isinstance(engine, EngineError):
                if not keep_failures:
                    del self._engines[key]
                continue
            del self._engines[key]
            try:
                engine.close()
            except Exception as exc:  # close every engine even if one fails
                errors.append(f"{type(exc).__name__}: {exc}")
        return errors
