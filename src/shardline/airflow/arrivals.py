"""Start on arrival (``trigger: {on: ready_marker, queue: ...}``): each partition's run starts when its ready marker
lands, not on the schedule's clock.

- The pipeline's DAG keeps its schedule as the names of its partitions, through
  :class:`~shardline.airflow.timetables.ArrivalTimetable`: Airflow infers a run's data interval from it, and the
  scheduler starts no run on its own.
- Beside it, the DAG ``<pipeline>__arrivals`` is scheduled on an asset whose ``AssetWatcher`` is
  :class:`~shardline.airflow.triggers.arrival.ReadyMarkerTrigger`: each marker's S3 event becomes an asset event.
  Its ``partitions`` task finds the interval each marker completes
  (:func:`shardline.planning.arrivals.partitions_started`), and ``start_partition`` starts the pipeline's run of it
  with the run id ``arrival__<interval start>``, the logical date of its start and that data interval, as its
  scheduled run would have had. A partition that has a run already starts none: a duplicate or a late repeat of
  an event is a no-op. ``unmatched_markers`` fails the arrivals run for a marker that names no partition, or whose
  event time is outside ``trigger.lookback`` before Airflow stored the event (a message made by hand).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from airflow.sdk import DAG, Asset, AssetWatcher, BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from shardline.airflow.operators.base import SpecMixin, fails_fast
from shardline.planning.arrivals import Marker, partitions_started
from shardline.spec import PipelineSpec, static_prefix

ARRIVALS_SUFFIX = "__arrivals"
UNMATCHED_XCOM = "unmatched"


def arrivals_dag_id(pipeline: str) -> str:
    return pipeline + ARRIVALS_SUFFIX


def marker_asset(spec: PipelineSpec) -> Asset:
    """The asset whose events are the pipeline's ready markers landing, watched on ``trigger.queue``."""
    from shardline.airflow.triggers.arrival import ReadyMarkerTrigger
    from shardline.orchestration.services import AwsSettings

    assert spec.trigger is not None
    step = spec.steps[0]
    bucket, _, key_prefix = static_prefix(step.input.prefix or "").removeprefix("s3://").partition("/")
    trigger = ReadyMarkerTrigger(
        queue=spec.trigger.queue,
        bucket=bucket,
        key_prefix=key_prefix,
        marker=step.input.ready_marker or "",
        aws=AwsSettings.of(spec).to_json(),
    )
    return Asset(
        name=f"shardline-ready-markers-{spec.pipeline}",
        watchers=[AssetWatcher(name=f"{spec.pipeline}-ready-markers", trigger=trigger)],
    )


class ArrivalPartitionsOperator(SpecMixin, BaseOperator):
    """The partitions the run's ready-marker events complete, as TriggerDagRunOperator's arguments."""

    def __init__(self, *, spec_path: str, **kwargs):
        super().__init__(**kwargs)
        self.spec_path = spec_path

    @fails_fast
    def execute(self, context):
        markers = [_marker_of(event) for event in _marker_events(context)]
        starts, unmatched = partitions_started(self.spec, markers, dt.datetime.now(dt.UTC))
        for start in starts:
            self.log.info("%s completes partition %s: starting run %s", start.marker, start.partition, start.run_id)
        for miss in unmatched:
            self.log.error("%s starts no run: %s", miss.uri, miss.reason)
        context["ti"].xcom_push(key=UNMATCHED_XCOM, value=[f"{m.uri}: {m.reason}" for m in unmatched])
        return [start.trigger_arguments() for start in starts]


def _marker_events(context) -> list:
    """The run's marker events, and every one Airflow stored after the first of them, each once.

    Airflow gives an asset-triggered run the events stored until its queue row was made, then deletes that row: an
    event stored in between (the rest of one batch of messages) waits for the next run, which only the next marker
    would start. Read at task time, those are here too; a partition read twice starts once all the same."""
    events = {_event_key(event): event for batch in context["triggering_asset_events"].values() for event in batch}
    if events:
        since = min(event.timestamp for event in events.values())
        for event in context["inlet_events"][0].after(since.isoformat()):
            events.setdefault(_event_key(event), event)
    return [events[key] for key in sorted(events)]


def _event_key(event) -> tuple[str, str]:
    # A run's triggering events carry no id (AssetEventDagRunReferenceResult); an event is its time and its extra.
    return event.timestamp.isoformat(), json.dumps(event.extra or {}, sort_keys=True)


def _marker_of(event):
    payload = (event.extra or {}).get("payload") or {}
    when = payload.get("event_time")
    # The event's time is the message's word; when Airflow stored the event is Airflow's own clock, which the
    # message's time is checked against (a hand-made eventTime starts no run outside trigger.lookback).
    return Marker(
        str(payload.get("bucket")),
        str(payload.get("key")),
        dt.datetime.fromisoformat(when) if when else None,
        received=event.timestamp,  # aware: Airflow's own clock, UTC
    )


class UnmatchedMarkersOperator(BaseOperator):
    """Fails the arrivals run when a marker named no partition, so no arrival is dropped in silence."""

    def __init__(self, *, partitions_task_id: str, **kwargs):
        kwargs.setdefault("trigger_rule", "all_done")
        super().__init__(**kwargs)
        self.partitions_task_id = partitions_task_id

    def execute(self, context):
        unmatched = context["ti"].xcom_pull(task_ids=self.partitions_task_id, key=UNMATCHED_XCOM)
        if unmatched is None:
            raise AirflowFailException(f"task {self.partitions_task_id} did not say which markers it matched")
        if unmatched:
            raise AirflowFailException(
                f"{len(unmatched)} ready marker(s) started no run (score such a partition with `shardline trigger "
                "PIPELINE --partition START`, or widen trigger.lookback):\n" + "\n".join(unmatched)
            )


def build_arrivals_dag(spec: PipelineSpec, spec_path: Path) -> DAG:
    """``<pipeline>__arrivals``: started by the pipeline's ready markers, it starts each partition's run once."""
    from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator

    with DAG(
        dag_id=arrivals_dag_id(spec.pipeline),
        description=f"Starts {spec.pipeline}'s run of each partition whose ready marker lands ({spec.trigger.queue})",
        schedule=[asset := marker_asset(spec)],
        start_date=dt.datetime.fromisoformat(spec.start_date).replace(tzinfo=dt.UTC),
        catchup=False,
        tags=["shardline", "arrivals"],
        default_args={"owner": spec.owner, "retries": 2, "retry_delay": dt.timedelta(seconds=30)},
        doc_md=f"Generated from `{spec_path.name}` by Shardline: starts `{spec.pipeline}` on arrival.",
    ) as dag:
        partitions = ArrivalPartitionsOperator(task_id="partitions", spec_path=str(spec_path), inlets=[asset])
        # One run per partition: its run id and logical date are the partition's, so a repeat is skipped. The plan task
        # refuses conf keys it does not know, so no OpenLineage parent keys are added to the conf.
        started = TriggerDagRunOperator.partial(
            task_id="start_partition",
            trigger_dag_id=spec.pipeline,
            skip_when_already_exists=True,
            openlineage_inject_parent_info=False,
        ).expand_kwargs(partitions.output)
        unmatched = UnmatchedMarkersOperator(task_id="unmatched_markers", partitions_task_id=partitions.task_id)
        partitions >> [started, unmatched]
    return dag
