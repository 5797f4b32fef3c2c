"""Start on arrival: a pipeline's runs start when each partition's ready marker lands, not on the clock."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from shardline.spec.base import _Strict
from shardline.spec.deadline import Duration

# An SQS queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>, or the embedded endpoint's), or a name.
_QUEUE_NAME = r"([A-Za-z0-9_-]{1,80}|[A-Za-z0-9_-]{1,75}\.fifo)"  # SQS: at most 80 characters, .fifo included
QUEUE_PATTERN = rf"^(https?://[^\s/]+/[0-9A-Za-z_-]+/{_QUEUE_NAME}|{_QUEUE_NAME})$"


class ArrivalSpec(_Strict):
    """Start each partition's run when its ready marker's S3 event arrives on an SQS queue (an Airflow
    AssetWatcher), instead of on the schedule's clock. The schedule still names the partitions (a run scores one
    interval of it), `shardline runs` lists an interval with no run MISSING, and duplicate or out-of-order events
    start each partition once."""

    on: Literal["ready_marker"]
    """what starts a run: the S3 event of the first step's input.ready_marker (the only choice)"""
    queue: Annotated[str, Field(pattern=QUEUE_PATTERN)]
    """the SQS queue the bucket's event notifications (s3:ObjectCreated:*) are sent to: its URL, or its name in the
    Airflow connection's account and region. A queue for this pipeline alone (another spec naming it is an import
    error): Shardline deletes every message it reads, once Airflow has stored what it started"""
    lookback: Duration = 86400
    """how long before a marker's event its partition may have ended: `1h`, `24h`, or seconds (at most 7 days;
    default a day). A marker of an interval that ended earlier, or of one whose folder two intervals in that window
    share, starts nothing and fails the arrivals run, naming it"""

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: Any) -> Any:
        # YAML 1.1 reads a bare `on` key as the boolean true (as GitHub Actions files know): take it as meant.
        if isinstance(data, dict) and True in data and "on" not in data:
            data = {("on" if key is True else key): value for key, value in data.items()}
        return data
