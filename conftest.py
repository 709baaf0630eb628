"""pytest wiring for the harness: the options, fixtures and hooks live in harness.plugin.

Installed, the package registers the plugin under the ``pytest11`` entry point named
``harness.plugin`` and this line is a no-op; from a bare source tree it loads it here.
"""

pytest_plugins = ["harness.plugin"]
