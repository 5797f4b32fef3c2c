"""The ready-marker watcher's two halves against moto_server's SQS: what the filter fires for, and what the queue
producer deletes or hands back once Airflow's shared stream says how each message was resolved."""

from __future__ import annotations

import asyncio
import json
import uuid

import boto3
import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from shardline.airflow.triggers.arrival import QueueMessages, ReadyMarkerTrigger

AWS = {"backend": "local", "aws_conn_id": "aws_default", "ledger_table": "t", "retention_days": 90}


def _event(bucket: str, key: str) -> str:
    record = {"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": bucket}, "object": {"key": key}}}
    return json.dumps({"Records": [record]})


def _trigger() -> ReadyMarkerTrigger:
    return ReadyMarkerTrigger(queue="q", bucket="b", key_prefix="events/", marker="_SUCCESS", aws=AWS)


async def _fired(bodies: list[str]) -> list[dict]:
    async def stream():
        for body in bodies:
            yield body

    return [event.payload async for event in _trigger().filter_shared_stream(stream())]


def test_the_filter_fires_once_per_marker_of_the_pipeline_and_nothing_for_the_rest():
    bodies = [
        _event("b", "events/dt%3D2026-11-29/hour%3D10/_SUCCESS"),
        _event("b", "events/dt=2026-11-29/hour=10/part-0.parquet"),  # a data file
        _event("other", "events/dt=2026-11-29/hour=10/_SUCCESS"),  # another bucket
        _event("b", "archive/dt=2026-11-29/_SUCCESS"),  # outside the input prefix
        json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent"}),
        "not an event",  # outside a shared stream, its refusal is a no-op: it fires nothing
    ]
    fired = asyncio.run(_fired(bodies))
    assert [(e["bucket"], e["key"]) for e in fired] == [("b", "events/dt=2026-11-29/hour=10/_SUCCESS")]


def test_the_trigger_is_identified_by_its_settings_and_shares_one_poll_per_queue():
    classpath, kwargs = _trigger().serialize()
    assert classpath == "shardline.airflow.triggers.arrival.ReadyMarkerTrigger"
    assert ReadyMarkerTrigger(**kwargs).serialize() == (classpath, kwargs)
    assert _trigger().shared_stream_key() == ("sqs", "q", "local", "aws_default")


@pytest.fixture
def queue(aws_env):
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.create_queue(QueueName=f"markers-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    return sqs, url


def _visible(sqs, url) -> list[str]:
    answer = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
    return sorted(m["Body"] for m in answer.get("Messages", []))


async def _read(producer: QueueMessages, count: int) -> list[tuple[str, str]]:
    read = []
    async for body, handle in producer.open_stream():
        read.append((body, handle))
        if len(read) == count:
            return read
    return read


def test_stored_and_refused_messages_are_deleted_and_unconfirmed_ones_are_read_again_at_once(queue):
    sqs, url = queue
    for body in ("stored", "refused", "unconfirmed"):
        sqs.send_message(QueueUrl=url, MessageBody=body)
    producer = QueueMessages(url, AWS)
    read = dict(asyncio.run(_read(producer, 3)))
    assert sorted(read) == ["refused", "stored", "unconfirmed"]
    assert _visible(sqs, url) == []  # read and hidden (900 s) until settled
    batch = [
        AdvanceItem(read["stored"], AdvanceOutcome(acked=1, failed=0)),
        AdvanceItem(read["refused"], AdvanceOutcome(acked=0, failed=0, rejected=1)),
        AdvanceItem(read["unconfirmed"], AdvanceOutcome(acked=0, failed=1)),
    ]
    asyncio.run(producer.advance(batch))
    hidden = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])
    assert hidden["Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "0"  # two deleted, one handed back
    assert _visible(sqs, url) == ["unconfirmed"]  # not after the visibility timeout: now


def test_messages_read_when_the_stream_ends_unsettled_are_read_again_at_once(queue):
    sqs, url = queue
    sqs.send_message(QueueUrl=url, MessageBody="in flight")
    producer = QueueMessages(url.rsplit("/", 1)[-1], AWS)  # by name, as a spec may give it
    assert [body for body, _ in asyncio.run(_read(producer, 1))] == ["in flight"]
    asyncio.run(producer.aclose())
    assert _visible(sqs, url) == ["in flight"]
