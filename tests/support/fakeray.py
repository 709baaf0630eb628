"""A fake ``ray`` module (a pytest plugin: ``-p tests.support.fakeray``) for testing
harness.dist.raydist without a cluster: tasks run here, one at a time, when their result
is fetched, and the infrastructure losses a test asks for are injected.

``HARNESS_FAKERAY_LOSE="<substring>:<n>"``: the first ``n`` tries of every cell whose node
id contains ``<substring>`` raise ``WorkerCrashedError`` (the worker died);
``HARNESS_FAKERAY_BREAK="<substring>"``: its task raises ``RayTaskError`` (the task's own
error, not a loss). ``HARNESS_FAKERAY_LOG``: a file each try is appended to.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


class WorkerCrashedError(RuntimeError):
    pass


class NodeDiedError(RuntimeError):
    pass


class RayTaskError(RuntimeError):
    pass


class Ref:
    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], name: str) -> None:
        self.fn, self.args, self.name = fn, args, name


class Remote:
    def __init__(self, fn: Callable[..., Any], options: dict[str, Any] | None = None) -> None:
        self.fn, self.opts = fn, options or {}

    def options(self, **kw: Any) -> Remote:
        return Remote(self.fn, kw)

    def remote(self, *args: Any) -> Ref:
        return Ref(self.fn, args, str(self.opts.get("name", "")))


_tries: dict[str, int] = {}


def _rule(var: str) -> tuple[str, int] | None:
    value = os.environ.get(var)
    if not value:
        return None
    what, _, n = value.partition(":")
    return what, int(n or 0)


def get(ref: Ref) -> Any:
    _tries[ref.name] = _tries.get(ref.name, 0) + 1
    log = os.environ.get("HARNESS_FAKERAY_LOG")
    if log:
        with Path(log).open("a") as out:
            out.write(f"{ref.name} try {_tries[ref.name]}\n")
    lose, broken = _rule("HARNESS_FAKERAY_LOSE"), _rule("HARNESS_FAKERAY_BREAK")
    if lose and lose[0] in ref.name and _tries[ref.name] <= lose[1]:
        raise WorkerCrashedError("the worker died unexpectedly (injected)")
    if broken and broken[0] in ref.name:
        raise RayTaskError("the task raised ValueError (injected)")
    return ref.fn(*ref.args)


def wait(refs: Sequence[Ref], num_returns: int = 1, timeout: float | None = None) -> Any:
    return list(refs[:num_returns]), list(refs[num_returns:])


def _module() -> types.ModuleType:
    ray = types.ModuleType("ray")
    ray.__spec__ = importlib.machinery.ModuleSpec("ray", None)
    exceptions = types.ModuleType("ray.exceptions")
    util = types.ModuleType("ray.util")
    for cls in (WorkerCrashedError, NodeDiedError, RayTaskError):
        setattr(exceptions, cls.__name__, cls)
    util.get_node_ip_address = lambda: "10.99.0.7"  # type: ignore[attr-defined]
    fields: dict[str, Any] = {
        "init": lambda **kw: None,
        "shutdown": lambda: None,
        "nodes": lambda: [{"Alive": True}],
        "cluster_resources": lambda: {"CPU": 1.0},
        "get_runtime_context": lambda: types.SimpleNamespace(gcs_address="10.99.0.1:6379"),
        "remote": Remote,
        "get": get,
        "wait": wait,
        "cancel": lambda ref, force=False: None,
        "exceptions": exceptions,
        "util": util,
    }
    for name, value in fields.items():
        setattr(ray, name, value)
    return ray


sys.modules["ray"] = _module()
