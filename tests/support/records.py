"""The ledger's records as the tests write them: an instance heard from some seconds before a poll, and a run held
as planning holds it."""

from __future__ import annotations

import datetime as dt

from shardline.ledger.keys import StepRef
from shardline.ledger.partitions import take
from shardline.ledger.records import ShardRecord
from shardline.ledger.states import SETUP_ERROR, ShardStatus, StepStatus
from shardline.ledger.step_writes import set_run_status

POLL_AT = 1_800_000_000.0  # when the tests' snapshots are taken (epoch seconds)


def heard(
    host: str,
    age: float,
    *,
    finished: bool = False,
    setup_error: str | None = None,
    attempt: int = 1,
    files_assigned: int = 0,
    files_done: int = 0,
    files_failed: int = 0,
) -> ShardRecord:
    """``host``'s SHARD record, its last heartbeat ``age`` seconds before :data:`POLL_AT`; ``finished``: it reported
    a terminal status; ``setup_error``: it could not start, for that reason."""
    status = ShardStatus.FAILED if setup_error else ShardStatus.SUCCEEDED if finished else ShardStatus.RUNNING
    return ShardRecord(
        host,
        attempt,
        status.value,
        files_assigned=files_assigned,
        files_done=files_done,
        files_failed=files_failed,
        heartbeat_at=dt.datetime.fromtimestamp(POLL_AT - age, dt.UTC),
        error_class=SETUP_ERROR if setup_error else None,
        error_message=setup_error,
    )


def hold_run(model, pipeline: str, run_id: str, step: str, output_uri: str = "") -> None:
    """What planning writes before any job of a run starts, written with the ledger's own calls: the run RUNNING,
    and ``step`` holding ``output_uri`` (the worker asks for both before each upload). For tests that start a
    worker themselves, without a plan task."""
    set_run_status(model, pipeline, run_id, StepStatus.RUNNING)
    if output_uri:
        until = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
        take(model, output_uri, StepRef(pipeline, run_id, step), until)
