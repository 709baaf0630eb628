"""Engine-neutral core of the inference benchmark harness.

Nothing in this package imports an inference engine: adapters live in ``engines/``
and register through the ``harness.engines`` entry-point group.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("inference-harness")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
