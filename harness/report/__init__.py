"""Reporting, a pure function of run directories: the result matrix (``matrix``), several
runs as one body of evidence (``runset``), plots (``plots``), the HTML page (``htmlpage``),
``compare`` (did a change make an engine faster?) and ``recommend`` (which engine and
configuration to run under an SLO). The top layer: nothing imports it but the CLI.
"""
