"""Which partitions a batch of ready-marker events starts: pure, over the spec and the events' keys and times.

A pipeline with ``trigger: {on: ready_marker}`` names its partitions by its schedule, and its first step's
``input.prefix`` template says where each partition's files are. A marker at ``<rendered prefix><ready_marker>``
completes the interval whose prefix renders to that folder. The intervals searched are those that ended within
``trigger.lookback`` before the event, and the one in progress when it was sent.

An event's time is the message's word: anyone who may send to the queue writes it. So it must fall within
``trigger.lookback`` before Airflow read the event (and not after it), and no interval that ended more than
``trigger.lookback`` before that is started, whatever the message says.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable

from shardline.spec import (
    PARTITION_FORMAT,
    PipelineSpec,
    SpecError,
    data_interval,
    intervals_between,
    partition_interval,
    static_prefix,
)
from shardline.spec.templates import render_interval

ARRIVAL_RUN_PREFIX = "arrival__"  # run ids of the runs an arrival starts: one per partition, so a repeat is refused
# How far after Airflow read it an event's time may be: S3's clock and Airflow's differ a little. No more: a later
# time would start the runs of intervals yet to come.
CLOCK_SKEW = dt.timedelta(minutes=5)


@dataclasses.dataclass(frozen=True)
class Marker:
    """A ready marker's S3 event: where it landed and when, as the message says (None: unknown, read as when it was
    read); ``received``: when Airflow read it off the queue, its own clock (None: now)."""

    bucket: str
    key: str
    event_time: dt.datetime | None = None
    received: dt.datetime | None = None

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


@dataclasses.dataclass(frozen=True)
class PartitionStart:
    """A run to start: the interval a marker completed, and the marker."""

    start: dt.datetime
    end: dt.datetime
    marker: str

    @property
    def partition(self) -> str:
        return self.start.strftime(PARTITION_FORMAT)

    @property
    def run_id(self) -> str:
        return ARRIVAL_RUN_PREFIX + self.partition

    def trigger_arguments(self) -> dict[str, str]:
        """What TriggerDagRunOperator takes: the run id, the logical date (the interval's start, as its scheduled run
        would have) and run_after (its end, from which Airflow infers this data interval)."""
        return {
            "trigger_run_id": self.run_id,
            "logical_date": self.start.isoformat(),
            "run_after": self.end.isoformat(),
        }


@dataclasses.dataclass(frozen=True)
class Unmatched:
    """A marker event that names no partition, and why."""

    uri: str
    reason: str


def partitions_started(
    spec: PipelineSpec, markers: Iterable[Marker], now: dt.datetime
) -> tuple[list[PartitionStart], list[Unmatched]]:
    """The partitions the markers complete, each once and oldest first, and the markers that complete none."""
    arrival = spec.trigger
    if arrival is None:
        raise SpecError(f"pipeline {spec.pipeline} has no trigger: nothing starts on arrival")
    step = spec.steps[0]
    template, marker_name = step.input.prefix or "", step.input.ready_marker or ""
    lookback = dt.timedelta(seconds=arrival.lookback)
    rendered: dict[dt.datetime, str] = {}
    started: dict[dt.datetime, PartitionStart] = {}
    unmatched: list[Unmatched] = []
    for marker in markers:
        uri = marker.uri
        if not uri.endswith("/" + marker_name) or not uri.startswith(static_prefix(template)):
            unmatched.append(Unmatched(uri, f"not a ready marker {template}{marker_name} (input.ready_marker)"))
            continue
        read = marker.received or now
        when = marker.event_time or read
        refused = _implausible(when, read, arrival.lookback)
        if refused:
            unmatched.append(Unmatched(uri, refused))
            continue
        when = min(when, read)
        folder = uri[: -len(marker_name)]
        found = []
        for start, end in _candidates(spec.schedule, when, read - lookback):
            if start not in rendered:
                rendered[start] = render_interval(template, step.model.version, start, end)
            if rendered[start] == folder:
                found.append((start, end))
        window = (
            f"of the schedule {spec.schedule!r} that ended within trigger.lookback ({arrival.lookback}s) before "
            f"Airflow read the event at {read:%Y-%m-%dT%H:%M:%S}Z, or was in progress at the event "
            f"({when:%Y-%m-%dT%H:%M:%S}Z)"
        )
        if not found:
            unmatched.append(Unmatched(uri, f"no interval {window} has the input prefix {folder}"))
            continue
        if len(found) > 1:
            # The prefix does not tell these intervals apart (hour=10/ of two days): starting either could score the
            # wrong one, and skip the right one as already run.
            starts = ", ".join(f"{s:%Y-%m-%dT%H:%M}" for s, _ in sorted(found))
            unmatched.append(
                Unmatched(uri, f"{len(found)} intervals {window} have the input prefix {folder} ({starts})")
            )
            continue
        start, end = found[0]
        started.setdefault(start, PartitionStart(start, end, uri))
    return [started[s] for s in sorted(started)], unmatched


def _implausible(when: dt.datetime, read: dt.datetime, lookback_seconds: int) -> str | None:
    """Why an event's time cannot be taken (a message made by hand, or one held past the lookback), or None."""
    said = f"its event time {when:%Y-%m-%dT%H:%M:%S}Z is"
    at = f"Airflow read it ({read:%Y-%m-%dT%H:%M:%S}Z)"
    if when > read + CLOCK_SKEW:
        return f"{said} after {at}: the message was not sent by S3 and starts no run"
    if when < read - dt.timedelta(seconds=lookback_seconds):
        return (
            f"{said} more than trigger.lookback ({lookback_seconds}s) before {at}: a message held that long, or one "
            "made by hand, starts no run"
        )
    return None


def _candidates(
    schedule: str | None, when: dt.datetime, not_before: dt.datetime
) -> list[tuple[dt.datetime, dt.datetime]]:
    """The intervals that ended after ``not_before``, up to the one in progress at ``when``."""
    _, last_end = data_interval(schedule, when)
    _, current_end = partition_interval(schedule, last_end)
    # The first interval in the window is the one around not_before (it ended after it), which starts where the last
    # whole interval before that moment ends.
    _, since = data_interval(schedule, not_before)
    return intervals_between(schedule, since, current_end)


def markers_in(body: str) -> list[Marker]:
    """The objects an SQS message says were created: an S3 event notification (sent to SQS, or through SNS) or an
    EventBridge "Object Created" event. S3's own test event names none. Raises ValueError for anything else."""
    import json
    from urllib.parse import unquote_plus

    try:
        message = json.loads(body)
        if isinstance(message, dict) and message.get("Type") == "Notification" and "Message" in message:
            message = json.loads(message["Message"])  # an S3 event sent through an SNS topic
    except (TypeError, ValueError) as err:
        raise ValueError(f"not JSON ({err})") from None
    if not isinstance(message, dict):
        raise ValueError(f"a JSON {type(message).__name__}, not an S3 event")
    if message.get("Event") == "s3:TestEvent":
        return []
    if message.get("source") == "aws.s3" and isinstance(message.get("detail"), dict):
        if message.get("detail-type") != "Object Created":
            return []
        detail = message["detail"]
        try:
            return [Marker(detail["bucket"]["name"], detail["object"]["key"], _event_time(message.get("time")))]
        except (KeyError, TypeError) as err:
            raise ValueError(f"an EventBridge S3 event without {err}") from None
    records = message.get("Records")
    if not isinstance(records, list):
        raise ValueError("neither an S3 event notification (Records) nor an EventBridge S3 event")
    markers = []
    for record in records:
        try:
            if not str(record["eventName"]).startswith("ObjectCreated:"):
                continue
            s3 = record["s3"]
            # S3 writes keys URL-encoded, a space as "+".
            markers.append(
                Marker(s3["bucket"]["name"], unquote_plus(s3["object"]["key"]), _event_time(record.get("eventTime")))
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"an S3 event record without {err}") from None
    return markers


def _event_time(text: object) -> dt.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)
