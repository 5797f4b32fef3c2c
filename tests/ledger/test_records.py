"""The ledger's records (``shardline.ledger.records``): one per item, copied from what a read returned, each
saying its own failure. Pure: no table needed."""

from __future__ import annotations

import datetime as dt

from shardline.ledger.records import FileRecord, RunRecord, ShardRecord, StepRecord
from shardline.ledger.states import SETUP_ERROR, FileStatus
from shardline.ledger.table import ControlItem, LedgerItem
from shardline.oncall.values import FileView
from shardline.oncall.views import file_view

NOW = dt.datetime(2026, 11, 22, 10, 0, 0, tzinfo=dt.UTC)
STARTED = NOW - dt.timedelta(seconds=100)


def test_the_ledger_items_are_copied_as_they_were_read():
    """The reads return pynamodb items; every reader gets plain records of them (no table needed)."""
    control = ControlItem(pk="RUN#p#run-1", sk="STEP#score", status="PARTIAL", attempt=2, started_at=STARTED)
    assert StepRecord.of(control) == StepRecord("PARTIAL", 2, STARTED, None, None)
    planned = ControlItem(
        pk="RUN#p#run-1",
        sk="STEP#score",
        status="RUNNING",
        attempt=3,
        plan_json='{"instance_type": "ml.c5.4xlarge", "capacity_failures": {"ml.c5.2xlarge": 2}, "run_id": "run-1"}',
    )
    # The newest attempt's instance type, and its step's jobs SageMaker could not provision, by type.
    assert StepRecord.of(planned) == StepRecord(
        "RUNNING", 3, None, None, None, "ml.c5.4xlarge", {"ml.c5.2xlarge": 2}, plan_json=planned.plan_json
    )
    for no_plan in (None, "", "not json", "[1, 2]"):
        assert StepRecord.of({"status": "RUNNING", "attempt": 1, "plan_json": no_plan}).instance_type is None
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
    record = FileRecord.of(item)
    assert record == FileRecord(
        "s3://b/in/a", FileStatus.FAILED, 3, rows_in=10, error_class="CorruptInputError", error_message="bad"
    )
    assert file_view("score", record) == FileView(
        "score", "s3://b/in/a", "FAILED", 3, None, 10, None, "CorruptInputError", "bad"
    )


def test_an_attribute_dict_reads_as_its_item_does():
    """What a Query with attributes_to_get returns, or a report's test literal: times as ISO text, numbers as text."""
    as_dict = {
        "sk": "FILE#score#s3://b/in/a",
        "status": "SUCCEEDED",
        "attempt": "2",
        "rows_in": "7",
        "rows_out": 7,
        "seconds": "1.5",
        "started_at": "2026-11-22T09:58:20",  # naive: taken as UTC
    }
    record = FileRecord.of(as_dict)
    assert record.input_key == "s3://b/in/a"  # from the sort key when the item has no input_key
    assert (record.status, record.attempt, record.rows_in, record.rows_out, record.seconds) == (
        FileStatus.SUCCEEDED,
        2,
        7,
        7,
        1.5,
    )
    assert record.started_at == STARTED and record.bytes_in is None and record.error_line() == ""


def test_each_record_says_its_own_failure_in_one_line():
    failed = FileRecord("s3://b/in/a", FileStatus.FAILED, 1, error_class="CorruptInputError", error_message="bad")
    assert failed.error_line() == "CorruptInputError: bad"
    assert FileRecord("k", FileStatus.FAILED, 1, error_message="killed").error_line() == "killed"
    broken = ShardRecord("algo-1", 1, "FAILED", error_class=SETUP_ERROR, error_message="no model file")
    assert broken.error_line() == f"{SETUP_ERROR}: no model file" and broken.setup_error == "no model file"
    assert ShardRecord("algo-1", 1, "FAILED", error_class="Other", error_message="x").setup_error is None
    assert StepRecord("FAILED", 2, message="1 of 2 file(s) failed").error_line() == "1 of 2 file(s) failed"
    assert StepRecord("SUCCEEDED", 2, message="all 2 files succeeded").error_line() == ""
    assert RunRecord("FAILED", message="step score failed").error_line() == "step score failed"


def test_a_shard_ages_from_its_last_heartbeat_and_is_finished_once_it_says_so():
    shard = ShardRecord("algo-1", 1, "RUNNING", heartbeat_at=STARTED)
    assert shard.heartbeat_age(NOW.timestamp()) == 100 and not shard.finished
    assert ShardRecord("algo-1", 1, None).heartbeat_age(NOW.timestamp()) == float("inf")
    assert ShardRecord("algo-1", 1, "PARTIAL").finished and ShardRecord("algo-1", 1, "FENCED").finished


def test_the_attempts_whose_jobs_may_still_run_are_the_newest_and_those_from_live_from():
    assert list(StepRecord("RUNNING", 3).live_attempts) == [3]
    assert list(StepRecord("RUNNING", 3, live_from=1).live_attempts) == [1, 2, 3]
    assert list(StepRecord("RUNNING", 2, live_from=5).live_attempts) == [2]  # never past the newest
    assert list(StepRecord(None, 0).live_attempts) == [1]  # planned, not yet numbered: attempt 1's job
