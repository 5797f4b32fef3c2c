"""The ledger's records as the tests write them: an instance heard from some seconds before a poll."""

from __future__ import annotations

import datetime as dt

from shardline.ledger.records import ShardRecord
from shardline.ledger.states import SETUP_ERROR, ShardStatus

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
