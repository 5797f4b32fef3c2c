"""What the step operators share: the spec a task reads once, and failing fast on an error no retry can mend.

The operators import ``shardline.orchestration`` inside their methods, where a task runs: DAG parsing imports
this package, and must load no boto3 or pynamodb (a parse of every DAG file, every few seconds)."""

from __future__ import annotations

import datetime as dt
import functools
from pathlib import Path

from airflow.sdk.exceptions import AirflowFailException

from shardline.errors import ShardlineError
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


def run_ref(spec, context) -> str:
    """The run as the `shardline` commands name it: PIPELINE/RUN_ID."""
    return f"{spec.pipeline}/{context['run_id']}"


def run_type_of(context) -> str:
    run_type = getattr(context.get("dag_run"), "run_type", None) or ""
    return str(getattr(run_type, "value", run_type))  # the task SDK's DagRunType is a (str, Enum)


def input_run_type(context) -> str:
    """The run type ``input.when_missing`` reads: a run an arrival started is its partition's scheduled run (its
    files may land after its marker, as a scheduled run's land late), whatever type Airflow gives it."""
    from shardline.decision.readiness import SCHEDULED
    from shardline.planning.arrivals import ARRIVAL_RUN_PREFIX

    return SCHEDULED if str(context.get("run_id") or "").startswith(ARRIVAL_RUN_PREFIX) else run_type_of(context)


def partition_of(context) -> str | None:
    """What the run scores, as `shardline runs` shows it: its data interval's start (UTC), else its logical date."""
    return partition_text(context.get("data_interval_start") or context.get("logical_date"))


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


def note_life(spec, context) -> None:
    """Record on the RUN item the Airflow life (its DAG run's clear_number) a task of the run starts in: a failure
    callback of an earlier life is then late, and ends nothing (``ledger.step_writes.end_life``)."""
    from shardline.ledger.step_writes import note_life as note  # at run time: no AWS client library at DAG parse
    from shardline.orchestration import services

    if context.get("dag_run") is not None:
        note(services.ledger_model(spec), spec.pipeline, context["run_id"], life_of(context))


def life_of(context) -> int:
    """The run's Airflow life a task runs in: its DAG run's clear_number (0 until the run is first cleared)."""
    return int(getattr(context.get("dag_run"), "clear_number", 0) or 0)
