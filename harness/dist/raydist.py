"""``--cells-on=ray``, driver side: every cell is a Ray task; records come back here.

Each cell's task asks Ray for what the cell needs (``--ray-cpus-per-cell``; a CUDA cell
also ``--ray-gpus-per-cell``, a whole device by default, so two cells never share a GPU)
and runs ``harness.dist.remotecell.run_cell`` on the node Ray picks: a local, process-isolated
pytest run of exactly that cell, in the engine family's interpreter. This process writes
the returned record into the one run directory and reports it to pytest, exactly as a
local run would; the record's environment fingerprint is the node's.

Failures stay per cell. A cell that crashed, hung or failed on the node comes back as
its record (crashed, timeout, failed) and is not rerun. A cell lost to the cluster (its
Ray worker process or node died, its result was lost) is run again, at most
``--ray-retries`` times, each loss an incident in the manifest; past that it is recorded
``crashed`` with every loss as a reason. ``--resume`` works on the run directory as for a
local run.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from harness.session.config import RunSettings
from harness.results.environment import RAY_NODE_ENV
from harness.dist.rayconn import connect, node_address, ray_module
from harness.results.records import CellRecord, Status
from harness.exceptions import RecordError
from harness.dist.remotecell import RemoteResult, RemoteSpec, run_cell, spec_for
from harness.session.state import RunState, engine_of, is_cell
from harness.session.worker import rerun_args

POLL_S = 1.0
LOST_TO_CLUSTER = (
    "WorkerCrashedError",
    "NodeDiedError",
    "LocalRayletDiedError",
    "ObjectLostError",
    "ObjectFetchTimedOutError",
    "ObjectReconstructionFailedError",
    "OwnerDiedError",
    "RaySystemError",
)
"""Ray errors that mean the infrastructure lost the task, not that the cell failed.
(Ray's memory monitor killing a task, OutOfMemoryError, is the cell's own: a local run
records an out-of-memory cell as crashed too.)"""


def node_task(spec: RemoteSpec) -> tuple[RemoteResult, str]:
    """The Ray task: run the cell on this node; also say which node it was."""
    node = node_address()
    gcs = str(ray_module().get_runtime_context().gcs_address)
    # the node's fingerprint names the Ray node it ran on (harness.results.environment); client
    # actors of --clients-on=ray join the cluster this task runs on
    env = (*spec.env, (RAY_NODE_ENV, node), ("RAY_ADDRESS", gcs))
    here = dataclasses.replace(spec, env=env)
    return run_cell(here), node


@dataclass
class Task:
    item: pytest.Item
    spec: RemoteSpec
    tries: int
    submitted: float
    losses: list[str]


def lost_to_cluster(exc: BaseException) -> bool:
    # by name: Ray's exception classes are imported only on the driver's Ray path
    return any(cls.__name__ in LOST_TO_CLUSTER for cls in type(exc).__mro__)


class RayRunner:
    """Submits the session's cells to Ray and records what comes back."""

    def __init__(self, session: pytest.Session, state: RunState, settings: RunSettings) -> None:
        self.session = session
        self.config = session.config
        self.state = state
        self.settings = settings
        self.dist = settings.dist
        self.pending: dict[Any, Task] = {}

    # -- the run -------------------------------------------------------------------------
    def run(self, items: Sequence[pytest.Item]) -> None:
        ray = ray_module()
        try:
            self._connect(ray)
        except Exception as exc:
            self._give_up([i for i in items if is_cell(i)], f"could not start Ray: {exc}")
            return
        try:
            remote = ray.remote(node_task)
            for item in items:
                if is_cell(item):
                    self._submit(remote, Task(item, self._spec(item), 1, time.monotonic(), []))
                else:
                    item.config.hook.pytest_runtest_protocol(item=item, nextitem=None)
            self._drain(ray, remote)
        except KeyboardInterrupt:
            self._interrupted(ray)
            raise
        finally:
            ray.shutdown()

    def _connect(self, ray: Any) -> None:
        connect(ray, self.dist.address)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        cpus = ray.cluster_resources().get("CPU", 0)
        where = self.dist.address or "a local Ray instance"
        self._say(f"ray: {len(nodes)} node(s), {cpus:g} CPUs at {where}")

    def _spec(self, item: pytest.Item) -> RemoteSpec:
        engine = engine_of(item) or ""
        python = self.dist.python.get(engine)
        timeout = self.settings.cell_timeout_s + self.settings.reliability.load_timeout_s
        return spec_for(
            item.nodeid,
            rerun_args(self.config),
            self.config.invocation_params.dir,
            str(python) if python else sys.executable,
            timeout,
        )

    def _submit(self, remote: Any, task: Task) -> None:
        gpus = self.dist.gpus_per_cell if self.settings.device.startswith("cuda") else 0
        ref = remote.options(
            num_cpus=self.dist.cpus_per_cell,
            num_gpus=gpus,
            max_retries=0,  # this runner decides what a loss means
            retry_exceptions=False,
            name=f"cell:{task.item.nodeid}"[:200],
        ).remote(task.spec)
        self.pending[ref] = task

    def _drain(self, ray: Any, remote: Any) -> None:
        while self.pending and not self.state.fatal_error:
            if self.session.shouldstop or self.session.shouldfail:
                self._interrupted(ray)
                return
            done, _ = ray.wait(list(self.pending), num_returns=1, timeout=POLL_S)
            for ref in done:
                task = self.pending.pop(ref)
                self._collect(ray, remote, ref, task)

    def _collect(self, ray: Any, remote: Any, ref: Any, task: Task) -> None:
        try:
            result, node = ray.get(ref)
        except Exception as exc:
            self._failed(remote, task, exc)
            return
        if result.record_json is None:
            status = Status.TIMEOUT if result.timed_out else Status.FAILED
            self._lose(task.item, status, [f"on node {node}: {result.error}"], result.tail)
            return
        self._adopt(task.item, result.record_json, node)

    # -- outcomes ------------------------------------------------------------------------
    def _failed(self, remote: Any, task: Task, exc: BaseException) -> None:
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
        if not lost_to_cluster(exc):
            self._lose(task.item, Status.FAILED, [f"the Ray task failed: {why}"], ())
            return
        task.losses.append(why)
        if task.tries > self.dist.retries:
            reasons = [
                f"lost to the cluster {len(task.losses)} time(s) (--ray-retries"
                f" {self.dist.retries}): " + " | ".join(task.losses)
            ]
            self._lose(task.item, Status.CRASHED, reasons, ())
            return
        self.state.incident(
            f"{task.item.nodeid}: lost to the cluster ({why}); running it again"
            f" (try {task.tries + 1} of {self.dist.retries + 1})"
        )
        task.tries += 1
        self._submit(remote, task)

    def _adopt(self, item: pytest.Item, record_json: str, node: str) -> None:
        try:
            node_record = CellRecord.model_validate_json(record_json)
        except (ValueError, RecordError) as exc:
            self._lose(item, Status.FAILED, [f"node {node} sent an unreadable record: {exc}"], ())
            return
        planned = self.state.planned[item.nodeid]
        if node_record.cell_id != planned.cell_id:
            why = f"node {node} ran {node_record.cell_id}, not {planned.cell_id}"
            self._lose(item, Status.FAILED, [why], ())
            return
        record = node_record.model_copy(
            update={"run_id": self.state.manifest.run_id, "attempt": self.state.attempt}
        )
        self.state.adopt(CellRecord.model_validate(record.model_dump()))
        self._report(item, record)

    def _lose(
        self, item: pytest.Item, status: Status, reasons: list[str], tail: Sequence[str]
    ) -> None:
        self.state.lost(item, status, reasons, tail)
        self._report_text(item, "failed", f"{status.value.upper()}: {'; '.join(reasons)}")

    def _give_up(self, items: Sequence[pytest.Item], why: str) -> None:
        for item in items:
            self._lose(item, Status.FAILED, [f"not run: {why}"], ())

    def _interrupted(self, ray: Any) -> None:
        for ref, task in list(self.pending.items()):
            ray.cancel(ref, force=True)
            self._lose(
                task.item,
                Status.FAILED,
                [
                    "interrupted: the run stopped with the cell on the cluster (finish it with"
                    f" --resume {self.state.run_dir})"
                ],
                (),
            )
        self.pending.clear()

    # -- pytest reporting ----------------------------------------------------------------
    def _report(self, item: pytest.Item, record: CellRecord) -> None:
        why = "; ".join(record.reasons)
        if record.status is Status.SKIPPED:
            path, line, _ = item.location
            self._report_text(item, "skipped", (str(path), (line or 0) + 1, f"Skipped: {why}"))
        elif record.status in (Status.OK, Status.INVALID):
            self._report_text(item, "passed", None)
        else:
            self._report_text(item, "failed", f"{record.status.value.upper()}: {why}")

    def _report_text(self, item: pytest.Item, outcome: str, longrepr: Any) -> None:
        hook = self.config.hook
        hook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        report = pytest.TestReport(
            nodeid=item.nodeid,
            location=item.location,
            keywords={},
            outcome=outcome,  # type: ignore[arg-type]
            longrepr=longrepr,
            when="call",
        )
        hook.pytest_runtest_logreport(report=report)
        hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)

    def _say(self, text: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(text)


def run(session: pytest.Session, state: RunState, settings: RunSettings) -> None:
    RayRunner(session, state, settings).run(session.items)
