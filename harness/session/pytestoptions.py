"""The harness's pytest options (one group, declared in harness.session.optiontable) and
their validation into ``RunSettings``."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from harness.engine import eventloop
from harness.exceptions import UsageError
from harness.results import redact
from harness.session.config import COMPOSED, RunSettings
from harness.session.optiontable import OPTIONS


def add_options(parser: pytest.Parser) -> None:
    """The one options group, "harness"."""
    group = parser.getgroup("harness", "inference benchmark harness")
    for option in OPTIONS:
        group.addoption(option.flag, **option.addoption_kwargs())


VALUE_OPTIONS = frozenset(o.flag for o in OPTIONS if o.takes_value)
"""The harness's options that take a value."""
OPTION_NAMES = frozenset(o.flag for o in OPTIONS)
"""Every option string of the harness."""
SETTINGS_OPTIONS = tuple(o for o in OPTIONS if o.field is not None)
"""The options that fill ``RunSettings`` (the others steer the session)."""


def check_rootdir(config: pytest.Config) -> None:
    """Refuse a session whose rootdir pytest took from a harness option's value.

    pytest chooses the rootdir and config file from the command line's paths before any
    plugin has added its options, so in ``--results-dir /elsewhere`` it reads
    ``/elsewhere`` as a test path: the session is rooted outside the project, loses its
    configuration (``testpaths``) and collects the project's own tests as well. The
    ``--option=value`` form is never read that way.
    """
    args = config.invocation_params.args
    if any(a.startswith(("--rootdir", "-c", "--config-file", "--inifile")) for a in args):
        return  # the user chose where the session is rooted
    here = config.invocation_params.dir
    culprits = [
        (name, value)
        for name, value in itertools.pairwise(args)
        if name in VALUE_OPTIONS and _names_a_path(here, value)
    ]
    if not culprits:
        return
    intended = _rootdir_without_options(config)
    moved = config.rootpath != intended if intended is not None else config.inipath is None
    if moved:
        fixed = " ".join(f"{name}={value}" for name, value in culprits)
        raise pytest.UsageError(
            "pytest read "
            + ", ".join(f"{value!r} (the value of {name})" for name, value in culprits)
            + " as a test path before the harness's options existed, and so rooted the"
            f" session at {config.rootpath}"
            + (f" instead of {intended}" if intended is not None else "")
            + f"; write {fixed}"
        )


def _names_a_path(here: Path, arg: str) -> bool:
    try:
        return (here / arg.split("::", maxsplit=1)[0]).exists()
    except (OSError, ValueError):
        return False


def _rootdir_without_options(config: pytest.Config) -> Path | None:
    """The rootdir pytest would choose from the command line's real paths alone, asked of
    pytest's own (private, version-dependent) function; None where it cannot be asked."""
    try:
        from _pytest.config.findpaths import determine_setup  # noqa: PLC0415
    except ImportError:
        return None
    wanted: dict[str, Any] = {
        "inifile": None,
        "override_ini": config.option.override_ini,
        "args": list(config.option.file_or_dir or ()),
        "rootdir_cmd_arg": None,
        "invocation_dir": config.invocation_params.dir,
    }
    try:
        params = inspect.signature(determine_setup).parameters
        result = determine_setup(**{k: v for k, v in wanted.items() if k in params})
    except Exception:  # any change of that private API: fall back to the heuristic
        return None
    root = result[0]
    return root if isinstance(root, Path) else None


def option_values(given: Mapping[str, Any]) -> dict[str, Any]:
    """Each ``RunSettings`` option's value, by dest (``given``'s, else its default),
    through the option's own check, in table order."""
    unknown = set(given) - {o.name for o in SETTINGS_OPTIONS}
    if unknown:
        raise TypeError(f"no harness option fills RunSettings from {', '.join(sorted(unknown))}")
    return {o.name: o.converted(given.get(o.name, o.default)) for o in SETTINGS_OPTIONS}


def build_settings(values: Mapping[str, Any]) -> RunSettings:
    """``RunSettings`` from checked option values: a field of one option is its value; the
    others are built, and checked across options, by ``config.COMPOSED`` in its order."""
    fields = {
        o.field: values[o.name] for o in SETTINGS_OPTIONS if o.field and o.field not in COMPOSED
    }
    for name, compose in COMPOSED.items():
        fields[name] = compose(values, fields)
    return RunSettings(**fields)


def parse_settings(**given: Any) -> RunSettings:
    """``RunSettings`` from raw option values by dest (as ``config.getoption`` gives them;
    a missing one: its default), or a ``UsageError`` that says what to do."""
    return build_settings(option_values(given))


def settings_from(config: pytest.Config) -> RunSettings:
    """Every option validated once; a bad value is a usage error, never a traceback
    (``--slo`` is held to the selected cells' latencies once they are collected:
    harness.session.slocheck).

    Secrets in engine options are remembered first, so that no message, record, log or
    report line shows them, even one about a malformed option."""
    for item in config.getoption("engine_opt") or ():
        key, _, value = item.partition("=")
        redact.remember(redact.secrets_in_value(key, value))
    try:
        eventloop.loop_factory()  # HARNESS_EVENT_LOOP, refused before anything runs
        return parse_settings(**{o.name: config.getoption(o.name) for o in SETTINGS_OPTIONS})
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None
