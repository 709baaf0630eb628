"""pytest wiring for the harness: the options and hooks live in harness.plugin, which
loads the fixtures (harness.session.fixtures) with itself.

Installed, the package registers the plugin under the ``pytest11`` entry point named
``harness.plugin`` and this line is a no-op; from a bare source tree it loads it here.
"""

pytest_plugins = ["harness.plugin"]
