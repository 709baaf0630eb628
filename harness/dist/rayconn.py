"""Ray as the harness uses it: imported only when a Ray path runs, untyped (Ray may be
absent, as in the lint environment), and joined one way by every driver."""

from __future__ import annotations

from typing import Any

NAMESPACE = "inference-harness"


def ray_module() -> Any:
    """Ray, untyped: typed or not depending on whether it is installed (lint env)."""
    import ray  # noqa: PLC0415  (only on a Ray path; validated at configuration)

    return ray


def connect(ray: Any, address: str | None) -> None:
    """Join the cluster at ``address`` (None: ``RAY_ADDRESS``, else a new local instance),
    without a dashboard and without Ray's logging taking over this process's output."""
    ray.init(
        address=address,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        namespace=NAMESPACE,
    )


def node_address() -> str:
    """The address of the Ray node this process runs on (inside a task or an actor)."""
    return str(ray_module().util.get_node_ip_address())
