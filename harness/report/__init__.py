"""Reporting, a pure function of run directories: the result matrix (``matrix``: Markdown
and CSV; ``matrixterm``: plain text for a terminal), several
runs as one body of evidence (``runset``), plots (``plots``), the HTML page (``htmlpage``)
and the Decision it opens with (``decision``, Pareto fronts in ``pareto``),
``compare`` (did a change make an engine faster?) and ``recommend`` (which engine and
configuration to run under an SLO), each a package with a module per job (data model,
evidence from the records, verdict or ranking, rendering). It imports no session, Ray or
workload code; the CLI imports it, and the plugin writes a finished run's matrix with it.

Nothing here knows a workload by name. What a workload needs from the reports (its
throughput, scenario, load search, timing floor, plots) is what it declared and its
records carry (harness.results.reportspec); records from before declarations are read
with the rules the reports always applied (harness.results.legacyspec).
"""
