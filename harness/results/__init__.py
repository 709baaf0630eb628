"""Results on disk: the versioned self-validating records and manifest (``records``), the
store that writes them (``store``), the environment fingerprint and its comparison
(``environment``), a run's provenance (``provenance``), secret masking (``redact``), the
one writer per run directory (``lock``) and the one door readers use (``reading``).
Imports nothing above ``engine``.
"""
