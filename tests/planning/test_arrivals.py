"""Which partitions ready-marker events start (pure), and how an SQS message is read as S3 events."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

import pytest
import yaml

from shardline.planning.arrivals import Marker, markers_in, partitions_started
from shardline.spec import parse_spec

HOURLY = Path(__file__).resolve().parents[2] / "dags" / "pipelines" / "tabular_scoring_hourly.yaml"
NOW = dt.datetime(2026, 11, 29, 18, 30, tzinfo=dt.UTC)


def _spec(schedule="@hourly", prefix=None, lookback="24h"):
    data = yaml.safe_load(HOURLY.read_text())
    data.update(schedule=schedule, trigger={"on": "ready_marker", "queue": "q", "lookback": lookback})
    data["steps"][0]["input"]["ready_marker"] = "_SUCCESS"
    if prefix:
        data["steps"][0]["input"]["prefix"] = prefix
    return parse_spec(data, "hourly.yaml")


def _marker(hour: dt.datetime, when=NOW, bucket="shardline-demo") -> Marker:
    return Marker(bucket, f"events/dt={hour:%Y-%m-%d}/hour={hour:%H}/_SUCCESS", when)


def _at(hour: int, day: int = 29) -> dt.datetime:
    return dt.datetime(2026, 11, day, hour, tzinfo=dt.UTC)


def test_each_marker_starts_its_hour_once_oldest_first_whatever_the_order_and_repeats():
    markers = [_marker(_at(17)), _marker(_at(15)), _marker(_at(17)), _marker(_at(16), when=None)]
    starts, unmatched = partitions_started(_spec(), markers, NOW)
    assert unmatched == []
    assert [s.start for s in starts] == [_at(15), _at(16), _at(17)]
    first = starts[0]
    assert first.end == _at(16) and first.partition == "2026-11-29T15:00:00"
    assert first.trigger_arguments() == {
        "trigger_run_id": "arrival__2026-11-29T15:00:00",
        "logical_date": "2026-11-29T15:00:00+00:00",
        "run_after": "2026-11-29T16:00:00+00:00",
    }


def test_the_hour_in_progress_may_be_marked_complete_early_but_not_a_later_one():
    starts, unmatched = partitions_started(_spec(), [_marker(_at(18)), _marker(_at(19))], NOW)
    assert [s.start for s in starts] == [_at(18)]  # it runs once its hour has ended (run_after 19:00)
    assert [u.uri for u in unmatched] == ["s3://shardline-demo/events/dt=2026-11-29/hour=19/_SUCCESS"]


def test_a_marker_older_than_the_lookback_starts_nothing_and_says_which_setting():
    starts, unmatched = partitions_started(_spec(lookback="6h"), [_marker(_at(11)), _marker(_at(13))], NOW)
    assert [s.start for s in starts] == [_at(13)]
    assert len(unmatched) == 1 and "hour=11/" in unmatched[0].uri
    assert "trigger.lookback (21600s)" in unmatched[0].reason and "2026-11-29T18:30:00Z" in unmatched[0].reason
    # The window counts from an interval's end: 12:00-13:00 ended 5.5h before the event, 11:00-12:00 6.5h.
    starts, _ = partitions_started(_spec(lookback="6h"), [_marker(_at(12))], NOW)
    assert [s.start for s in starts] == [_at(12)]


def test_the_lookback_counts_from_when_airflow_read_the_event_not_from_when_the_task_ran():
    late_task = NOW + dt.timedelta(days=3)  # the arrivals DAG paused, say: its events wait in Airflow
    marker = dataclasses.replace(_marker(_at(17)), received=NOW)
    starts, unmatched = partitions_started(_spec(), [marker], late_task)
    assert [s.start for s in starts] == [_at(17)] and unmatched == []


def test_an_event_time_outside_the_lookback_starts_nothing_and_says_why():
    """Found by review: an SQS message made by hand, with an old eventTime, started the run of a partition long
    past trigger.lookback (any day the prefix names); a future one, the run of an interval yet to come."""
    old_day = _at(10, day=3)
    forged = _marker(old_day, when=old_day + dt.timedelta(hours=1, minutes=5))
    future_day = dt.datetime(2026, 12, 25, 10, tzinfo=dt.UTC)
    ahead = _marker(future_day, when=future_day + dt.timedelta(minutes=30))
    held = dataclasses.replace(_marker(_at(17)), received=NOW + dt.timedelta(days=2))  # read two days late
    starts, unmatched = partitions_started(_spec(), [forged, ahead, held], NOW)
    assert starts == []
    reasons = {u.uri: u.reason for u in unmatched}
    assert "more than trigger.lookback (86400s) before Airflow read it (2026-11-29T18:30:00Z)" in reasons[forged.uri]
    assert "2026-11-03T11:05:00Z" in reasons[forged.uri] and "starts no run" in reasons[forged.uri]
    assert "after Airflow read it" in reasons[ahead.uri]
    assert "more than trigger.lookback" in reasons[held.uri]


def test_an_event_time_within_the_lookback_still_reaches_no_interval_past_it():
    """An event time just inside the window does not stretch it: the intervals searched ended within the lookback
    before Airflow read the event, not before the time the message gives."""
    spec = _spec(lookback="6h")
    forged = _marker(_at(6), when=_at(12) + dt.timedelta(minutes=31))  # 06:00-07:00 ended 5.5h before that time
    starts, unmatched = partitions_started(spec, [forged], NOW)
    assert starts == [] and "no interval" in unmatched[0].reason


def test_an_event_time_a_little_after_airflows_clock_is_read_as_now():
    marker = _marker(_at(17), when=NOW + dt.timedelta(minutes=2))  # S3's clock a little ahead
    starts, unmatched = partitions_started(_spec(), [marker], NOW)
    assert [s.start for s in starts] == [_at(17)] and unmatched == []


@pytest.mark.parametrize(
    "marker",
    [
        Marker("other-bucket", "events/dt=2026-11-29/hour=17/_SUCCESS", NOW),
        Marker("shardline-demo", "events/dt=2026-11-29/hour=17/part-0.parquet", NOW),
        Marker("shardline-demo", "events/dt=2026-11-29/hour=17/x_SUCCESS", NOW),
        Marker("shardline-demo", "events/dt=2026-11-29/_SUCCESS", NOW),
    ],
)
def test_an_object_that_is_no_marker_of_a_partition_starts_nothing(marker):
    starts, unmatched = partitions_started(_spec(), [marker], NOW)
    assert starts == [] and [u.uri for u in unmatched] == [marker.uri]


def test_a_daily_pipeline_maps_its_day_folder_with_the_default_lookback():
    spec = _spec(schedule="@daily", prefix="s3://shardline-demo/daily/{{ ds }}/", lookback=86400)
    marker = Marker("shardline-demo", "daily/2026-11-28/_SUCCESS", NOW)
    starts, unmatched = partitions_started(spec, [marker], NOW)
    assert unmatched == [] and [(s.start, s.end) for s in starts] == [(_at(0, 28), _at(0, 29))]


def test_a_monthly_pipeline_maps_the_month_that_just_ended():
    spec = _spec(
        schedule="@monthly",
        prefix="s3://shardline-demo/monthly/{{ data_interval_start.strftime('%Y-%m') }}/",
        lookback="72h",
    )
    early_december = dt.datetime(2026, 12, 2, 6, tzinfo=dt.UTC)
    starts, unmatched = partitions_started(spec, [Marker("shardline-demo", "monthly/2026-11/_SUCCESS")], early_december)
    assert unmatched == [] and [s.start for s in starts] == [dt.datetime(2026, 11, 1, tzinfo=dt.UTC)]


def test_a_folder_that_two_intervals_in_the_window_share_starts_neither_and_names_them():
    # Minutes of the hour with no date: the spec's check at import renders 200 consecutive minutes, all distinct,
    # but within 48 hours two 10:05 intervals have the folder.
    spec = _spec(
        schedule="* * * * *",
        prefix="s3://shardline-demo/events/{{ data_interval_start.strftime('%H-%M') }}/",
        lookback="48h",
    )
    starts, unmatched = partitions_started(spec, [Marker("shardline-demo", "events/10-05/_SUCCESS", NOW)], NOW)
    assert starts == []
    assert "2 intervals" in unmatched[0].reason and "2026-11-28T10:05, 2026-11-29T10:05" in unmatched[0].reason


def _record(key: str, event: str = "ObjectCreated:Put", bucket: str = "shardline-demo") -> dict:
    return {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "eventName": event,
        "eventTime": "2026-11-29T18:01:02.123Z",
        "s3": {"bucket": {"name": bucket}, "object": {"key": key, "size": 0}},
    }


def test_an_s3_notification_names_its_created_objects_with_their_keys_decoded():
    body = json.dumps(
        {"Records": [_record("events/dt%3D2026-11-29/my+file.txt"), _record("gone", "ObjectRemoved:Delete")]}
    )
    assert markers_in(body) == [
        Marker(
            "shardline-demo", "events/dt=2026-11-29/my file.txt", dt.datetime(2026, 11, 29, 18, 1, 2, 123000, dt.UTC)
        )
    ]


def test_an_s3_event_through_sns_and_one_from_eventbridge_are_read_too():
    sns = {"Type": "Notification", "Message": json.dumps({"Records": [_record("a/_SUCCESS")]})}
    assert [m.key for m in markers_in(json.dumps(sns))] == ["a/_SUCCESS"]
    bridge = {
        "source": "aws.s3",
        "detail-type": "Object Created",
        "time": "2026-11-29T18:01:02Z",
        "detail": {"bucket": {"name": "b"}, "object": {"key": "a b/_SUCCESS"}},
    }
    assert markers_in(json.dumps(bridge)) == [
        Marker("b", "a b/_SUCCESS", dt.datetime(2026, 11, 29, 18, 1, 2, tzinfo=dt.UTC))
    ]


def test_s3s_test_event_names_nothing():
    assert markers_in(json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": "b"})) == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("hello", "not JSON"),
        ("[1, 2]", "a JSON list, not an S3 event"),
        ('{"foo": 1}', "neither an S3 event notification"),
        ('{"Records": [{"eventName": "ObjectCreated:Put"}]}', "an S3 event record without 's3'"),
    ],
)
def test_a_message_that_is_no_s3_event_is_an_error_saying_why(body, says):
    with pytest.raises(ValueError, match=says):
        markers_in(body)
