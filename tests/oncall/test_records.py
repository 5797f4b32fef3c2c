"""The on-call values (``shardline.oncall.records``): a run's name, and the ledger's items copied as plain
records. Pure: no table needed."""

from __future__ import annotations

import datetime as dt

import pytest

from shardline.oncall.errors import BadRequest
from shardline.oncall.records import FileView, RunRecord, RunRef, ShardRecord, StepRecord
from shardline.oncall.views import file_view

NOW = dt.datetime(2026, 11, 22, 10, 0, 0, tzinfo=dt.UTC)
STARTED = NOW - dt.timedelta(seconds=100)


def test_the_ledger_items_are_copied_as_they_were_read():
    """The records the service reads are pynamodb items; the views get plain copies of them (no table needed)."""
    from shardline.ledger.table import ControlItem, LedgerItem

    control = ControlItem(pk="RUN#p#run-1", sk="STEP#score", status="PARTIAL", attempt=2, started_at=STARTED)
    assert StepRecord.of(control) == StepRecord("PARTIAL", 2, STARTED, None, None)
    assert RunRecord.of(ControlItem(pk="x", sk="RUN", status="FAILED")).status == "FAILED"
    shard = LedgerItem(pk="x", sk="SHARD#2#algo-2", host="algo-2", attempt=2, files_assigned=4, heartbeat_at=NOW)
    assert ShardRecord.of(shard) == ShardRecord("algo-2", 2, None, 4, 0, 0, 0, NOW)
    item = LedgerItem(
        pk="x",
        sk="FILE#a",
        input_key="s3://b/in/a",
        status="FAILED",
        attempt=3,
        rows_in=10,
        error_class="CorruptInputError",
        error_message="bad",
    )
    assert file_view("score", item) == FileView(
        "score", "s3://b/in/a", "FAILED", 3, None, 10, None, "CorruptInputError", "bad"
    )


def test_a_run_is_named_pipeline_slash_run_id():
    ref = RunRef.parse("p/scheduled__2026-11-22T10:00:00+00:00")
    assert (
        ref == RunRef("p", "scheduled__2026-11-22T10:00:00+00:00")
        and str(ref) == "p/scheduled__2026-11-22T10:00:00+00:00"
    )
    for text in ("no-slash", "/r", "p/"):
        with pytest.raises(BadRequest, match="PIPELINE/RUN_ID"):
            RunRef.parse(text)
