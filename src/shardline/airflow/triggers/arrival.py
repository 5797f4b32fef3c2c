"""The ready-marker watcher of a pipeline with ``trigger: {on: ready_marker, queue: ...}``: an Airflow 3 event
trigger (an ``AssetWatcher``'s) over the SQS queue that the bucket's S3 event notifications go to.

It reads the queue through the triggerer's shared stream in ack mode: a message is deleted only once Airflow has
stored the asset event it became (or it named no marker of this pipeline), so a triggerer that dies between the
two leaves the message on the queue to be read again. That makes starts at-least-once; the arrivals DAG makes them
once per partition (deterministic run ids). Polling runs in a thread (boto3), so the triggerer's loop never blocks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer, reject_shared_stream_event

log = logging.getLogger(__name__)

CLASSPATH = "shardline.airflow.triggers.arrival.ReadyMarkerTrigger"
WAIT_SECONDS = 10  # SQS long polling: a receive returns at once when a message is there
# The embedded endpoint (backend: local) answers one request at a time, so a long poll would hold up every other
# client for its whole wait: there the queue is polled this often instead.
LOCAL_POLL_SECONDS = 1.0
# A message read and not yet deleted is hidden this long; Airflow stores an event well within it, and the triggerer
# fails an event it has not confirmed after [triggerer] shared_stream_ack_timeout (300 s by default).
VISIBILITY_TIMEOUT_SECONDS = 900
RETRY_SECONDS = 5.0
ERROR_EVERY_SECONDS = 300.0  # a queue that stays unreadable (missing, access denied) is logged again this often


class ReadyMarkerTrigger(BaseEventTrigger):
    """Fires one event per ready marker ``<key_prefix>…/<marker>`` created in ``bucket``; its payload is the
    marker's bucket, key and event time. Messages for other objects are deleted unfired; a message that is no S3
    event at all is logged as a warning and deleted."""

    def __init__(self, queue: str, bucket: str, key_prefix: str, marker: str, aws: dict[str, Any]):
        super().__init__()
        self.queue, self.bucket, self.key_prefix, self.marker, self.aws = queue, bucket, key_prefix, marker, aws

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            CLASSPATH,
            {
                "queue": self.queue,
                "bucket": self.bucket,
                "key_prefix": self.key_prefix,
                "marker": self.marker,
                "aws": self.aws,
            },
        )

    def shared_stream_key(self) -> tuple[str, ...]:
        return ("sqs", self.queue, str(self.aws.get("backend")), str(self.aws.get("aws_conn_id")))

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return QueueMessages(kwargs["queue"], kwargs["aws"])

    def is_marker(self, bucket: str, key: str) -> bool:
        return bucket == self.bucket and key.startswith(self.key_prefix) and key.endswith("/" + self.marker)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        from shardline.planning.arrivals import markers_in

        async for body in shared_stream:
            try:
                markers = markers_in(body)
            except ValueError as err:
                self.log.warning(
                    "queue %s: a message that is no S3 event is dropped (%s): %.300s", self.queue, err, body
                )
                reject_shared_stream_event()
                continue
            for marker in markers:
                if self.is_marker(marker.bucket, marker.key):
                    when = marker.event_time.isoformat() if marker.event_time else None
                    self.log.info("queue %s: ready marker s3://%s/%s", self.queue, marker.bucket, marker.key)
                    yield TriggerEvent({"bucket": marker.bucket, "key": marker.key, "event_time": when})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # The triggerer runs this trigger through filter_shared_stream (its shared_stream_key is never None), so
        # that a message is deleted only once its event is stored. Reading the queue here would lose that.
        raise RuntimeError(f"{CLASSPATH} runs only as a shared stream in Airflow's triggerer (Airflow 3.3 or later)")
        yield  # pragma: no cover - an async generator


class QueueMessages(SharedStreamProducer):
    """Reads the queue (long polling, in a thread) and deletes what Airflow has stored or refused."""

    def __init__(self, queue: str, aws: dict[str, Any]) -> None:
        self.queue, self.aws = queue, aws
        self._client = None
        self._url: str | None = None
        self._unsettled: set[str] = set()  # receipt handles read and neither deleted nor handed back yet

    def _connect(self) -> tuple[Any, str]:
        if self._client is None:
            from shardline.orchestration import services
            from shardline.orchestration.services import AwsSettings

            client = services.of(AwsSettings.from_json(self.aws)).sqs
            url = self.queue if "://" in self.queue else client.get_queue_url(QueueName=self.queue)["QueueUrl"]
            self._client, self._url = client, url
        return self._client, self._url

    @property
    def _long_polls(self) -> bool:
        return self.aws.get("backend") != "local"

    def _receive(self) -> list[dict[str, Any]]:
        client, url = self._connect()
        answer = client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=WAIT_SECONDS if self._long_polls else 0,
            VisibilityTimeout=VISIBILITY_TIMEOUT_SECONDS,
        )
        return answer.get("Messages", [])

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        from shardline.orchestration.step.watch import describe_error

        failing_since, last_logged = None, -ERROR_EVERY_SECONDS
        while True:
            try:
                messages = await asyncio.to_thread(self._receive)
            except Exception as err:  # noqa: BLE001 - an endpoint down, a queue missing: the messages wait
                if time.monotonic() - last_logged >= ERROR_EVERY_SECONDS:
                    # An ERROR, repeated: a queue that is missing or refused to Airflow's credentials is a
                    # setting to change, and until then no marker starts a run.
                    log.error(
                        "queue %s: cannot read it (%s); retrying every %.0fs: no ready marker starts a run "
                        "meanwhile (trigger.queue, and the Airflow connection's sqs:ReceiveMessage, "
                        "sqs:DeleteMessage, sqs:ChangeMessageVisibility and, for a queue named, sqs:GetQueueUrl)",
                        self.queue,
                        describe_error(err),
                        RETRY_SECONDS,
                    )
                    last_logged = time.monotonic()
                failing_since = failing_since or time.monotonic()
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if failing_since is not None:
                log.info("queue %s: readable again after %.0fs", self.queue, time.monotonic() - failing_since)
                failing_since, last_logged = None, -ERROR_EVERY_SECONDS
            if not messages and not self._long_polls:
                await asyncio.sleep(LOCAL_POLL_SECONDS)
            for message in messages:
                self._unsettled.add(message["ReceiptHandle"])
                # A message is resolved (and so deleted) once the filter asks for the next one and its events
                # are stored, whether or not another message follows.
                yield message.get("Body"), message["ReceiptHandle"]

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        # Stored (clean) or refused as no S3 event (rejected): delete. Otherwise (Airflow never confirmed it stored
        # the event, or no trigger took it) the message is made visible again at once, to be read again.
        done, kept = [], []
        for item in batch:
            stored = item.outcome  # Airflow's word: how storing the event went
            settled = stored.is_clean or (stored.rejected > 0 and stored.failed == 0)
            (done if settled else kept).append(item.broker_payload)
            self._unsettled.discard(item.broker_payload)
        if kept:
            log.warning("queue %s: %d message(s) not confirmed stored by Airflow: read again", self.queue, len(kept))
        await asyncio.to_thread(self._settle, done, kept)

    async def aclose(self) -> None:
        # The stream ended (the trigger stopped, or the triggerer): what was read and not settled is read again
        # now rather than after the visibility timeout.
        unsettled, self._unsettled = sorted(self._unsettled), set()
        if unsettled and self._client is not None:
            await asyncio.to_thread(self._settle, [], unsettled)

    def _settle(self, delete: list[str], release: list[str]) -> None:
        # Never raises: a failed advance would end the whole stream. A message neither deleted nor released comes
        # back after its visibility timeout, and its partition's run exists by then (started once).
        for handles, call in ((delete, "delete_message_batch"), (release, "change_message_visibility_batch")):
            for first in range(0, len(handles), 10):
                entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(handles[first : first + 10])]
                if call == "change_message_visibility_batch":
                    entries = [{**entry, "VisibilityTimeout": 0} for entry in entries]
                try:
                    client, url = self._connect()
                    answer = getattr(client, call)(QueueUrl=url, Entries=entries)
                except Exception as err:  # noqa: BLE001 - see above
                    log.warning("queue %s: %s of %d message(s) failed: %s", self.queue, call, len(entries), err)
                    continue
                for failed in answer.get("Failed", []):
                    log.warning("queue %s: %s of a message failed: %s", self.queue, call, failed.get("Message"))
