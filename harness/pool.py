"""Engines shared across consecutive cells: one alive at a time, failures remembered."""

from __future__ import annotations

from collections.abc import Callable

from harness.engine import Engine, EngineError


class EnginePool:
    """The shared engine of consecutive cells with the same configuration (vLLM takes
    tens of seconds to start). One engine is kept alive at a time: an idle engine (vLLM's
    engine core polls) would take CPU from the one being measured. A failed load is
    remembered so later cells of that configuration fail at once."""

    def __init__(self) -> None:
        self._engines: dict[tuple[str, ...], Engine | EngineError] = {}

    def get(self, key: tuple[str, ...], make: Callable[[], Engine]) -> Engine:
        if key not in self._engines:
            errors = self.close_all(keep_failures=True)
            if errors:
                raise EngineError("closing the previous shared engine failed: " + "; ".join(errors))
            try:
                self._engines[key] = make()
            except EngineError as exc:
                self._engines[key] = exc
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
