"""A pipeline's deadline (``deadline:`` in its spec) as Airflow 3's Deadline Alert.

- :class:`PartitionDue` is the alert's reference: when a run's partition is due
  (:func:`shardline.decision.readiness.due_at`), read from the run's own row when Airflow creates the run. Airflow
  finds a custom reference only through a plugin, so Shardline's plugin lists it.
- :func:`deadline_missed` is the alert's callback. The executor runs it once the deadline has passed with the run
  not succeeded (Airflow drops the deadline of a run that succeeds in time; a run that failed is still late). It
  logs the miss as an error, records it on the run's RUN item (`shardline runs` and the page show it), and calls the
  spec's ``deadline.notify``.

Every Airflow process loads the plugin, and so this module: it imports the spec only where a function needs it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseDeadlineReference, DeadlineAlert, SyncCallback

if TYPE_CHECKING:
    from shardline.spec import PipelineSpec

log = logging.getLogger(__name__)


class PartitionDue(BaseDeadlineReference):
    """When a run's partition is due (:func:`~shardline.decision.readiness.due_at`): a scheduled run's data
    interval's end (a run its ready marker started, too); a manual run's, the later of that and the moment it was
    triggered; a backfill's, never."""

    required_kwargs = {"dag_id", "run_id"}

    def _evaluate_with(self, *, session, **kwargs: Any) -> dt.datetime | None:
        from airflow.models import DagRun
        from sqlalchemy import select

        from shardline.decision.readiness import SCHEDULED, due_at
        from shardline.planning.arrivals import ARRIVAL_RUN_PREFIX

        row = session.execute(
            select(DagRun.run_type, DagRun.data_interval_end, DagRun.created_at, DagRun.run_after).where(
                DagRun.dag_id == kwargs["dag_id"], DagRun.run_id == kwargs["run_id"]
            )
        ).one_or_none()
        if row is None:
            return None
        run_type, interval_end, created_at, run_after = row
        kind = str(getattr(run_type, "value", run_type))
        if kwargs["run_id"].startswith(ARRIVAL_RUN_PREFIX):
            kind = SCHEDULED  # started by its marker in place of the clock: its partition is due at its interval's end
        return due_at(
            run_type=kind,
            interval_end=interval_end,
            triggered_at=created_at or run_after,  # the row's creation: when it was triggered
        )


@dataclasses.dataclass(frozen=True)
class DeadlineMissed:
    """What ``deadline.notify`` is called with: a run that had not succeeded by its partition's deadline."""

    pipeline: str
    run_id: str
    partition: str | None  # the run's data interval's start (UTC), as `shardline runs` shows it
    state: str  # the Airflow run's state when the alert fired: queued, running, failed, or success (it ended late)
    deadline: str  # the deadline, ISO 8601 UTC
    command: str  # what on call runs first

    @property
    def message(self) -> str:
        partition = f"partition {self.partition}" if self.partition else "its input"
        if self.state == "success":  # it ended after the deadline, before the scheduler looked
            return f"{self.pipeline}: run {self.run_id} scored {partition} after its deadline {self.deadline}"
        return (
            f"{self.pipeline}: run {self.run_id} had not scored {partition} by its deadline {self.deadline} "
            f"(the Airflow run is {self.state}); on call: {self.command}"
        )

    @property
    def mark(self) -> str:
        """The run's mark in `shardline runs`, `status` and the page."""
        return f"past its deadline {self.deadline} ({self.state} then)"


def deadline_alert(spec: PipelineSpec, spec_path: Path) -> DeadlineAlert | None:
    """The DAG's Deadline Alert for the spec's ``deadline``, or None when it sets none. A ``notify`` that does not
    import is a :class:`~shardline.spec.SpecError` naming the file and the field (an import error in Airflow's UI)."""
    from shardline.spec import SpecError

    if spec.deadline is None:
        return None
    if spec.deadline.notify:
        try:
            notify_function(spec.deadline.notify, spec_path)
        except (ImportError, AttributeError, TypeError) as err:
            raise SpecError(f"{spec_path}: invalid pipeline spec\n  deadline.notify: {err}") from err
    return DeadlineAlert(
        reference=PartitionDue(),
        interval=dt.timedelta(seconds=spec.deadline.after),
        callback=SyncCallback(deadline_missed, kwargs={"spec_path": str(spec_path)}),
        name=f"{spec.pipeline} partition deadline",
    )


def notify_function(path: str, spec_path: Path) -> Callable[[DeadlineMissed], object]:
    """The function ``package.module.function`` names, from the DAG folder (the spec's folder's parent) or an
    installed package."""
    module_name, _, name = path.rpartition(".")
    dags = str(spec_path.resolve().parent.parent)
    if dags not in sys.path:
        sys.path.append(dags)  # as Airflow puts the DAG folder on a task's path
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:  # the module is there; something it imports is not
            raise ImportError(f"{path!r}: module {module_name!r} imports {err.name!r}, which is not installed") from err
        raise ImportError(f"{path!r}: no module {module_name!r} in {dags} or the installed packages") from err
    function = getattr(module, name, None)
    if function is None:
        raise AttributeError(f"{path!r}: module {module_name!r} has no {name!r}")
    if not callable(function):
        raise TypeError(f"{path!r} is not a function")
    return function


def missed_of(pipeline: str, context: dict) -> DeadlineMissed:
    """The miss, from the context Airflow hands a deadline callback (the run as its REST API shows it)."""
    from shardline.airflow.operators.base import partition_text, utc_time

    run = context.get("dag_run") or {}
    run_id = str(run.get("dag_run_id") or run.get("run_id") or "?")
    state = str(run.get("state") or "?")
    ref = f"{pipeline}/{run_id}"
    command = f"shardline failed {ref}" if state == "failed" else f"shardline status {ref}"
    deadline = utc_time((context.get("deadline") or {}).get("deadline_time"))
    return DeadlineMissed(
        pipeline,
        run_id,
        partition_text(run.get("data_interval_start") or run.get("logical_date")),
        state,
        f"{deadline:%Y-%m-%dT%H:%M:%S}Z" if deadline else "?",
        command,
    )


def deadline_missed(spec_path: str, context: dict | None = None) -> None:
    """The Deadline Alert's callback: say the miss in the log first, then record it on the run's RUN item and call
    ``notify``. Each is tried even when the one before it fails (a ledger that cannot be reached still lets the page
    go out); then the first failure is raised, so Airflow records the callback as failed."""
    from shardline.orchestration.deadlines import record_missed
    from shardline.spec import load_spec

    context = context or {}
    missed = missed_of((context.get("dag_run") or {}).get("dag_id") or Path(spec_path).stem, context)
    log.error("deadline missed: %s", missed.message)
    failures: list[Exception] = []
    try:
        spec = load_spec(Path(spec_path))
    except Exception:  # the log line above still said it
        log.exception("deadline missed: the spec %s could not be read to record and notify the miss", spec_path)
        raise
    for what, act in (
        ("record the miss in the ledger", lambda: record_missed(spec, missed.run_id, missed.mark, missed.partition)),
        ("call deadline.notify", lambda: _notify(spec, spec_path, missed)),
    ):
        try:
            act()
        except Exception as err:  # each is tried; the first failure is raised below
            log.exception("deadline missed: could not %s", what)
            failures.append(err)
    if failures:
        raise failures[0]


def _notify(spec: PipelineSpec, spec_path: str, missed: DeadlineMissed) -> None:
    if spec.deadline is not None and spec.deadline.notify:
        notify_function(spec.deadline.notify, Path(spec_path))(missed)
