"""``--slo`` held to the latencies the selected cells declare, once they are collected and
before anything is measured: an SLO naming a latency no cell declares would apply nowhere,
so it is a usage error (harness.metrics.slo.check_named)."""

from __future__ import annotations

import pytest

from harness.exceptions import UsageError
from harness.metrics.slo import SLO, check_named
from harness.session.config import RunSettings
from harness.session.state import is_cell, report_spec_of

SLO_FIX = (
    "name one of those, or declare the latency in the workload's ReportSpec(latencies=...)"
    " (docs/writing-a-workload.md)"
)


class SloCheck:
    """The plugin that checks ``--slo`` against the collected cells."""

    NAME = "harness-slo-check"

    def __init__(self, slos: tuple[SLO, ...]) -> None:
        self.slos = slos

    @classmethod
    def register(cls, config: pytest.Config, settings: RunSettings) -> None:
        """In the controller only: a worker's cells were checked by its controller, and a
        resumed run's when it started (what is left of it may be fewer)."""
        resumed = settings.reliability.resume is not None
        if settings.slos and not resumed and not config.pluginmanager.has_plugin(cls.NAME):
            config.pluginmanager.register(cls(settings.slos), cls.NAME)

    @pytest.hookimpl(trylast=True)  # after -k, -m and every other deselection
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        cells = [item for item in items if is_cell(item)]
        if not cells:
            return  # no cell, no run: nothing is held to an SLO
        declared = {name for item in cells for name in _declared(item)}
        try:
            check_named(self.slos, declared, where="the selected cells", fix=SLO_FIX)
        except UsageError as exc:
            raise pytest.UsageError(str(exc)) from None


def _declared(item: pytest.Item) -> tuple[str, ...]:
    spec = report_spec_of(item)
    return spec.latency_names() if spec is not None else ()
