"""A pipeline's deadline (``deadline:`` in its spec) as Airflow 3's Deadline Alert.

- :class:`PartitionDue` is the alert's reference: when a run's partition is due
  (:func:`shardline.decision.readiness.due_at`), read from the run's own row when Airflow creates the run. Airflow
  finds a custom reference only through a plugin, so Shardline's plugin lists it.
- :func:`deadline_missed` is the alert's callback. The executor runs it once the deadline has passed with the run
  not succeeded (Airflow drops the deadline of a run that succeeds in time; a run that failed is still late). It
  logs the miss as an error, records it on the run's RUN item (`shardline runs` and the page show it), and calls the
  spec's ``deadline.notify``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow.sdk import BaseDeadlineReference, DeadlineAlert, SyncCallback

from shardline.spec import PipelineSpec, SpecError

log = logging.getLogger(__name__)


class PartitionDue(BaseDeadlineReference):
    """When a run's partition is due: a scheduled run's data interval's end; any other run's, the later of that and
    the moment it was triggered."""

    required_kwargs = {"dag_id", "run_id"}

    def _evaluate_with(self, *, session, **kwargs: Any) -> dt.datetime | None:
        from airflow.models import DagRun
        from sqlalchemy import select

        from shardline.decision.readiness import due_at

        row = session.execute(
            select(DagRun.run_type, DagRun.data_interval_end, DagRun.created_at, DagRun.run_after).where(
                DagRun.dag_id == kwargs["dag_id"], DagRun.run_id == kwargs["run_id"]
            )
        ).one_or_none()
        if row is None:
            return None
        run_type, interval_end, created_at, run_after = row
        # When it was triggered: the row's creation (a backfill's run_after is its interval's, not now).
        triggered_at = created_at or run_after
        return due_at(
            run_type=str(getattr(run_type, "value", run_type)), interval_end=interval_end, triggered_at=triggered_at
        )


@dataclasses.dataclass(frozen=True)
class DeadlineMissed:
    """What ``deadline.notify`` is called with: a run that had not succeeded by its partition's deadline."""

    pipeline: str
    run_id: str
    partition: str | None  # the run's data interval's start (UTC), as `shardline runs` shows it
    state: str  # the Airflow run's state when the deadline passed: queued, running or failed
    deadline: str  # the deadline, ISO 8601 UTC
    command: str  # what on call runs first

    @property
    def message(self) -> str:
        partition = f"partition {self.partition}" if self.partition else "its input"
        return (
            f"{self.pipeline}: run {self.run_id} had not scored {partition} by its deadline {self.deadline} "
            f"(the Airflow run is {self.state}); on call: {self.command}"
        )

    @property
    def short(self) -> str:
        """The run's mark in `shardline runs` and the page."""
        return f"past its deadline {self.deadline} ({self.state} then)"


def deadline_alert(spec: PipelineSpec, spec_path: Path) -> DeadlineAlert | None:
    """The DAG's Deadline Alert for the spec's ``deadline``, or None when it sets none. A ``notify`` that does not
    import is a :class:`SpecError` naming the file and the field (an import error in Airflow's UI)."""
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
        function = getattr(importlib.import_module(module_name), name)
    except ModuleNotFoundError as err:
        raise ImportError(f"{path!r}: no module {module_name!r} in {dags} or the installed packages") from err
    except AttributeError as err:
        raise AttributeError(f"{path!r}: module {module_name!r} has no {name!r}") from err
    if not callable(function):
        raise TypeError(f"{path!r} is not a function")
    return function


def missed_of(spec: PipelineSpec, context: dict) -> DeadlineMissed:
    """The miss, from the context Airflow hands a deadline callback (the run as its REST API shows it)."""
    from shardline.airflow.operators.base import partition_text

    run = context.get("dag_run") or {}
    run_id = str(run.get("dag_run_id") or run.get("run_id") or "?")
    state = str(run.get("state") or "?")
    when = (context.get("deadline") or {}).get("deadline_time")
    deadline = when if isinstance(when, dt.datetime) else dt.datetime.fromisoformat(str(when).replace("Z", "+00:00"))
    ref = f"{spec.pipeline}/{run_id}"
    command = f"shardline failed {ref}" if state == "failed" else f"shardline status {ref}"
    return DeadlineMissed(
        spec.pipeline,
        run_id,
        partition_text(run.get("data_interval_start") or run.get("logical_date")),
        state,
        f"{deadline.astimezone(dt.UTC):%Y-%m-%dT%H:%M:%S}Z",
        command,
    )


def deadline_missed(spec_path: str, context: dict | None = None) -> None:
    """The Deadline Alert's callback: say the miss in the log, on the run's RUN item and through ``notify``. Each
    is tried even when one before it fails (a ledger that cannot be reached still lets the page go out); then the
    first failure is raised, so Airflow records the callback as failed."""
    from shardline.orchestration.deadlines import record_missed
    from shardline.spec import load_spec

    spec = load_spec(Path(spec_path))
    missed = missed_of(spec, context or {})
    log.error("deadline missed: %s", missed.message)
    failures: list[Exception] = []
    for say in (lambda: record_missed(spec, missed.run_id, missed.short), lambda: _notify(spec, spec_path, missed)):
        try:
            say()
        except Exception as err:  # each is tried; the first failure is raised below
            log.exception("deadline missed: could not say it")
            failures.append(err)
    if failures:
        raise failures[0]


def _notify(spec: PipelineSpec, spec_path: str, missed: DeadlineMissed) -> None:
    if spec.deadline is not None and spec.deadline.notify:
        notify_function(spec.deadline.notify, Path(spec_path))(missed)
