"""How every reader sees a step (``shardline.ledger.step_reads``): the items one Query returns, and what each
attempt's plan file adds to them for the inputs no instance has claimed."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from shardline.ledger.keys import StepRef
from shardline.ledger.records import FileRecord, StepRecord
from shardline.ledger.step_reads import RunRecords, StepRecords, list_runs, read_run, read_step, with_unclaimed
from shardline.ledger.step_writes import ensure_run, start_attempt
from shardline.ledger.table import bind_ledger


def test_reading_a_step_that_was_never_planned(ledger_table):
    records = read_step(bind_ledger(ledger_table), StepRef("p", "nope", "score"))
    assert records.step is None and records.files == [] and records.shards == []


# -- never claimed: what each attempt's plan file adds to the FILE items (pure) ------------------------------


def _item(key: str, status: str, attempt: int, **more) -> FileRecord:
    return FileRecord.of(SimpleNamespace(input_key=key, status=status, attempt=attempt, **more))


def _records(*files) -> StepRecords:
    return StepRecords(step=None, files=list(files), shards=[], requests=2)


def test_an_input_planned_again_reads_pending_under_the_newer_attempt_until_claimed():
    records = _records(
        _item("s3://b/a", "SUCCEEDED", 1),  # done at 1, not planned again: stays
        _item("s3://b/b", "FAILED", 1, error_class="TimeoutError"),  # retried by 2, not claimed yet
        _item("s3://b/c", "RUNNING", 2),  # retried by 2 and claimed: attempt 2's own record
        _item("s3://b/d", "SUCCEEDED", 1),  # a zombie of attempt 1 finished it after 2 planned it
        _item("s3://b/z", "FAILED", 1, error_class="UnsafeKeyError"),  # refused by the planner: in no plan file
    )
    planned = {
        1: [("s3://b/a", 10), ("s3://b/b", 20), ("s3://b/c", 30), ("s3://b/d", 40), ("s3://b/e", 50)],
        2: [("s3://b/b", 20), ("s3://b/c", 30), ("s3://b/d", 40)],
    }
    seen = {f.input_key: (f.status, f.attempt) for f in with_unclaimed(records, planned).files}
    assert seen == {
        "s3://b/a": ("SUCCEEDED", 1),
        "s3://b/b": ("PENDING", 2),
        "s3://b/c": ("RUNNING", 2),
        "s3://b/d": ("PENDING", 2),  # attempt 1's late write does not count for attempt 2
        "s3://b/e": ("PENDING", 1),  # planned by 1, never claimed, and left out of 2 (on-call chose files)
        "s3://b/z": ("FAILED", 1),
    }
    pending = next(f for f in with_unclaimed(records, planned).files if f.input_key == "s3://b/b")
    assert pending == FileRecord.unclaimed("s3://b/b", 2, 20) and pending.bytes_in == 20 and pending.error_class is None
    assert pending.host is None and pending.rows_out is None  # reads like an item no worker wrote to


def test_without_plan_files_the_items_are_all_there_is():
    """Steps planned before plan files (their PENDING items were written at plan time) read as they did."""
    records = _records(_item("s3://b/a", "PENDING", 1), _item("s3://b/b", "SUCCEEDED", 1))
    seen = with_unclaimed(records, {})
    assert seen.files == records.files and seen.planned_sizes == {}


@pytest.mark.parametrize(
    ("stored", "plan_files"),
    [
        (None, {}),  # a step planned before plan files
        ("", {}),
        ('{"1": "s3://m/attempt-0001.a.files.json.gz"}', {1: "s3://m/attempt-0001.a.files.json.gz"}),
        ('{"2": "s3://m/two", "10": "s3://m/ten"}', {2: "s3://m/two", 10: "s3://m/ten"}),
    ],
)
def test_each_attempts_plan_file_is_read_off_the_step_item_keyed_by_its_number(stored, plan_files):
    assert StepRecord.of(SimpleNamespace(plan_files=stored)).plan_files == plan_files


def test_a_step_item_whose_plan_files_cannot_be_read_is_an_error_not_a_step_with_no_inputs():
    with pytest.raises(ValueError, match="plan files are unreadable"):
        StepRecord.of(SimpleNamespace(plan_files='{"1": "s3://m/one"'))


def test_a_run_is_read_with_its_steps_and_listed_under_its_pipeline(ledger_table):
    model = bind_ledger(ledger_table)
    ensure_run(model, "reads-a", "run-1", partition="2026-11-22T10:00:00+00:00")
    ensure_run(model, "reads-b", "run-2")
    for step in ("score", "post"):
        start_attempt(model, StepRef("reads-a", "run-1", step), 1)
    records = read_run(model, "reads-a", "run-1")
    assert (records.run.status, records.run.partition) == ("RUNNING", "2026-11-22T10:00:00+00:00")
    assert [s.step for s in records.steps] == ["post", "score"]  # in step-name order
    assert records.shards == []
    assert read_run(model, "reads-a", "run-9") == RunRecords(run=None, steps=[], shards=[])
    assert [(r.pipeline, r.run_id) for r in list_runs(model, "reads-a")] == [("reads-a", "run-1")]
    assert {(r.pipeline, r.run_id) for r in list_runs(model)} == {("reads-a", "run-1"), ("reads-b", "run-2")}


def test_runs_are_listed_newest_first_and_indexed_once(ledger_table):
    model = bind_ledger(ledger_table)
    for run in ("r1", "r2", "r3"):
        ensure_run(model, "alpha" if run != "r2" else "beta", run)
        time.sleep(0.01)
    ensure_run(model, "alpha", "r1")  # a retried plan task: no second index entry
    assert [r.run_id for r in list_runs(model)] == ["r3", "r2", "r1"]
    assert [r.run_id for r in list_runs(model, "alpha")] == ["r3", "r1"]
    assert [r.run_id for r in list_runs(model, limit=1)] == ["r3"]
    assert [r.run_id for r in list_runs(model, "alpha", limit=1)] == ["r3"]
    assert [r.run_id for r in list_runs(model, "beta")] == ["r2"]
