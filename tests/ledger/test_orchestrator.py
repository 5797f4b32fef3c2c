"""The orchestrator's side of the ledger on moto_server: plans, fenced attempts, Query-only reads."""

from __future__ import annotations

import pytest

from shardline.ledger import bind_ledger
from shardline.ledger.job_writes import FileOutcome, LedgerContext, WorkerLedger
from shardline.ledger.orchestrator import (
    StaleOrchestratorError,
    cancel_step,
    continue_attempt,
    ensure_run,
    read_step,
    start_attempt,
)
from shardline.ledger.states import FileStatus


def test_plan_then_worker_updates_then_read(ledger_table):
    model = bind_ledger(ledger_table)
    ensure_run(model, "p", "run-1")
    ensure_run(model, "p", "run-1")  # idempotent
    keys = [(f"s3://raw/in/part-{i:03d}.parquet", 100 + i) for i in range(60)]  # > 25: several BatchWrites
    assert start_attempt(model, "p", "run-1", "score", 1, keys) == 60

    ctx = LedgerContext(table=ledger_table, pipeline="p", run_id="run-1", step="score", attempt=1,
                        input_uri="s3://raw/in/")
    worker = WorkerLedger(ctx, "algo-1")
    worker.claim_file("part-000.parquet")
    worker.finish_file("part-000.parquet", FileOutcome(FileStatus.SUCCEEDED, rows_in=5, rows_out=5))
    worker.claim_file("part-001.parquet")
    worker.finish_file("part-001.parquet", FileOutcome(FileStatus.FAILED, error_class="CorruptInputError",
                                                       error_message="cannot read"))

    records = read_step(model, "p", "run-1", "score")
    assert records.step.attempt == 1
    statuses = {f.input_key: f.status for f in records.files}
    assert len(statuses) == 60
    assert statuses["s3://raw/in/part-000.parquet"] == "SUCCEEDED"
    assert statuses["s3://raw/in/part-001.parquet"] == "FAILED"
    assert sum(s == "PENDING" for s in statuses.values()) == 58
    assert records.requests == 2  # one page for the step and its shards, one of files


def test_attempts_only_move_forward(ledger_table):
    model = bind_ledger(ledger_table)
    start_attempt(model, "p", "run-2", "score", 1, [("s3://raw/a", 1)])
    start_attempt(model, "p", "run-2", "score", 2, [("s3://raw/a", 1)])
    with pytest.raises(StaleOrchestratorError, match=r"no longer at attempt 0"):
        start_attempt(model, "p", "run-2", "score", 1, [("s3://raw/a", 1)])
    # An operator's resubmission names the attempt it saw as the newest; if that moved, it loses.
    with pytest.raises(StaleOrchestratorError, match=r"no longer at attempt 1"):
        start_attempt(model, "p", "run-2", "score", 3, [("s3://raw/a", 1)], after=1)
    start_attempt(model, "p", "run-2", "score", 3, [("s3://raw/a", 1)], after=2)
    assert read_step(model, "p", "run-2", "score").step.attempt == 3


def test_fencing_two_planners_of_one_attempt_only_one_wins(ledger_table):
    """The sensor's resubmission and an operator's forced one both saw attempt 1: exactly one plans attempt 2."""
    model = bind_ledger(ledger_table)
    start_attempt(model, "p", "run-3", "score", 1, [("s3://raw/a", 1), ("s3://raw/b", 1)])
    start_attempt(model, "p", "run-3", "score", 2, [("s3://raw/a", 1), ("s3://raw/b", 1)], after=1)
    _finish(model, "run-3", "s3://raw/a", attempt=2)  # attempt 2's job finishes a file
    with pytest.raises(StaleOrchestratorError):  # the sensor, planning the attempt after the one it watched
        start_attempt(model, "p", "run-3", "score", 2, [("s3://raw/a", 1), ("s3://raw/b", 1)])
    statuses = {f.input_key: (f.status, int(f.attempt)) for f in read_step(model, "p", "run-3", "score").files}
    assert statuses["s3://raw/a"] == ("SUCCEEDED", 2)  # the loser reset nothing


def test_fencing_a_late_replan_never_resets_a_file_the_attempt_finished(ledger_table):
    """A planner retry that finishes planning an attempt writes only files still PENDING (or older)."""
    model = bind_ledger(ledger_table)
    keys = [("s3://raw/a", 1), ("s3://raw/b", 1), ("s3://raw/c", 1)]
    start_attempt(model, "p", "run-4", "score", 1, keys[:2])
    _finish(model, "run-4", "s3://raw/a", attempt=1)
    assert continue_attempt(model, "p", "run-4", "score", 1, keys) == 2  # b (still pending) and c (new)
    statuses = {f.input_key: f.status for f in read_step(model, "p", "run-4", "score").files}
    assert statuses == {"s3://raw/a": "SUCCEEDED", "s3://raw/b": "PENDING", "s3://raw/c": "PENDING"}
    start_attempt(model, "p", "run-4", "score", 2, keys[1:])
    with pytest.raises(StaleOrchestratorError, match="no longer a planned attempt 1"):
        continue_attempt(model, "p", "run-4", "score", 1, keys)


def test_fencing_cancel_is_conditional_on_the_attempt_seen(ledger_table):
    model = bind_ledger(ledger_table)
    start_attempt(model, "p", "run-5", "score", 1, [("s3://raw/a", 1)])
    start_attempt(model, "p", "run-5", "score", 2, [("s3://raw/a", 1)])
    assert not cancel_step(model, "p", "run-5", "score", 1, "stale view")  # someone resubmitted meanwhile
    assert cancel_step(model, "p", "run-5", "score", 2, "wrong model")
    step = read_step(model, "p", "run-5", "score").step
    assert (step.status, step.message) == ("CANCELLED", "wrong model")
    assert not cancel_step(model, "p", "run-5", "score", 2, "again")  # already ended: left as it is
    with pytest.raises(StaleOrchestratorError):  # and the sensor cannot reopen it
        start_attempt(model, "p", "run-5", "score", 3, [("s3://raw/a", 1)])
    start_attempt(model, "p", "run-5", "score", 3, [("s3://raw/a", 1)], reopen_cancelled=True)  # an operator may


def _finish(model, run_id: str, key: str, attempt: int) -> None:
    from shardline.ledger.keys import file_sk, run_pk

    model(run_pk("p", run_id), file_sk("score", key)).update(
        actions=[model.status.set("SUCCEEDED")], condition=model.attempt == attempt)


def test_reading_a_step_that_was_never_planned(ledger_table):
    records = read_step(bind_ledger(ledger_table), "p", "nope", "score")
    assert records.step is None and records.files == [] and records.shards == []
