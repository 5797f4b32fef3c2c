"""What the step operators share: the spec a task reads once, and failing fast on an error no retry can mend.

The operators import ``shardline.orchestration`` inside their methods, where a task runs: DAG parsing imports
this package, and must load no boto3 or pynamodb (a parse of every DAG file, every few seconds)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from shardline.decision.readiness import SCHEDULED
from shardline.errors import ShardlineError
from shardline.planning.arrivals import ARRIVAL_RUN_PREFIX
from shardline.spec import PARTITION_FORMAT, load_spec


def fails_fast(method):
    """An operator method whose permanent :class:`~shardline.errors.ShardlineError` (a ``PermanentError``, unless
    its class turns ``permanent`` off) fails the task at once, with its message: the same input or settings would
    fail every retry the same way. Any other error is Airflow's to retry."""

    @functools.wraps(method)
    def run(self, context, *args, **kwargs):
        try:
            return method(self, context, *args, **kwargs)
        except ShardlineError as err:
            if not err.permanent:
                raise
            raise AirflowFailException(str(err)) from err

    return run


class SpecMixin:
    spec_path: str

    @functools.cached_property
    def spec(self):
        """The pipeline spec, parsed once per task: its services (shardline.orchestration.services) are then
        built once too."""
        return load_spec(Path(self.spec_path))


@dataclasses.dataclass(frozen=True)
class TaskRun:
    """What a task knows of its DAG run, read once from Airflow's context (:meth:`of`): the operators pass this down,
    never the context. ``run_type`` is Airflow's ("" in a callback's context, which has no DAG run), ``life`` its DAG
    run's clear_number (0 until the run is first cleared)."""

    run_id: str
    run_type: str = ""
    life: int = 0
    logical_date: dt.datetime | None = None
    interval_start: dt.datetime | None = None
    interval_end: dt.datetime | None = None
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # as the run's trigger set them

    conf: Mapping[str, Any] | None = None
    has_dag_run: bool = False
    ti: Any = dataclasses.field(default=None, compare=False, repr=False)  # to ask Airflow about other runs

    @classmethod
    def of(cls, context) -> TaskRun:
        dag_run = context.get("dag_run")
        run_type = getattr(dag_run, "run_type", None) or ""
        return cls(
            run_id=str(context["run_id"]),  # a context without one is an error, never a run named ""
            run_type=str(getattr(run_type, "value", run_type)),  # the task SDK's DagRunType is a (str, Enum)
            life=int(getattr(dag_run, "clear_number", 0) or 0),
            logical_date=context.get("logical_date"),
            interval_start=context.get("data_interval_start"),
            interval_end=context.get("data_interval_end"),
            params=context.get("params") or {},
            conf=getattr(dag_run, "conf", None),
            has_dag_run=dag_run is not None,
            ti=context.get("ti"),
        )

    def ref(self, pipeline: str) -> str:
        """The run as the `shardline` commands name it: PIPELINE/RUN_ID."""
        return f"{pipeline}/{self.run_id}"

    def param(self, name: str) -> Any:
        """A Param of the run; None when the run has none of that name."""
        return self.params.get(name)

    @property
    def input_run_type(self) -> str:
        """The run type ``input.when_missing`` reads: a run an arrival started is its partition's scheduled run (its
        files may land after its marker, as a scheduled run's land late), whatever type Airflow gives it."""
        return SCHEDULED if self.run_id.startswith(ARRIVAL_RUN_PREFIX) else self.run_type

    @property
    def partition(self) -> str | None:
        """What the run scores, as `shardline runs` shows it: its data interval's start (UTC), else its logical
        date."""
        return partition_text(self.interval_start or self.logical_date)


def partition_text(when: dt.datetime | str | None) -> str | None:
    """A run's partition as Shardline names it everywhere (`shardline runs`, the Asset event's partition key):
    ``2026-11-22T10:00:00``, UTC, the format Airflow's temporal partition mappers read."""
    when = utc_time(when)
    return when.strftime(PARTITION_FORMAT) if when else None


def utc_time(when: dt.datetime | str | None) -> dt.datetime | None:
    """A time as Airflow hands it (a datetime, or ISO text from its REST API), in UTC; a naive one is UTC, as Airflow
    stores it."""
    if not when:
        return None
    if isinstance(when, str):
        when = dt.datetime.fromisoformat(when.replace("Z", "+00:00"))
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)


def note_life(spec, run: TaskRun) -> None:
    """Record on the RUN item the Airflow life (its DAG run's clear_number) a task of the run starts in: a failure
    callback of an earlier life is then late, and ends nothing (``ledger.step_writes.end_life``)."""
    from shardline.ledger.step_writes import note_life as note  # at run time: no AWS client library at DAG parse
    from shardline.orchestration import services

    if run.has_dag_run:
        note(services.ledger_model(spec), spec.pipeline, run.run_id, run.life)
