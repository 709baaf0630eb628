"""The pytest session: options, declared once in a table (``optiontable``, ``optiondecl``),
registered and validated (``pytestoptions``, ``config``), the run's state (``state``, kept
in pytest's stash: ``stash``), its start and end (``runloop``), the fixtures a workload asks
for (``fixtures``, ``engineopener``), the cell a workload fills (``cell``) and its record
(``recording``), process isolation (``isolation``, ``worker``, ``child``), engines shared
between cells (``pool``), the exit status (``outcome``) and pytest-benchmark interplay
(``benchbridge``). ``harness.plugin`` wires them into pytest.
"""
