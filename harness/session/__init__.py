"""The pytest session: options and their validation (``pytestoptions``, ``config``), the run's
state (``state``), the cell a workload fills (``cell``), process isolation (``isolation``,
``worker``, ``child``), engines shared between cells (``pool``), the exit status
(``outcome``) and pytest-benchmark interplay (``benchbridge``). ``harness.plugin`` wires
them into pytest.
"""
