"""The orchestrator's side of the ledger on moto_server: plans, fenced attempts, Query-only reads."""

from __future__ import annotations

import pytest
from shardline_ledger import bind_ledger
from shardline_ledger.orchestrator import StaleOrchestratorError, ensure_run, read_step, start_attempt
from shardline_ledger.states import FileStatus
from shardline_ledger.worker import FileOutcome, LedgerContext, WorkerLedger


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
    start_attempt(model, "p", "run-2", "score", 2, [("s3://raw/a", 1)])  # a retried task re-plans: fine
    with pytest.raises(StaleOrchestratorError, match=r"moved on \(past attempt 1"):
        start_attempt(model, "p", "run-2", "score", 1, [("s3://raw/a", 1)])
    # An operator's resubmission names the attempt it saw as the newest; if that moved, it loses.
    with pytest.raises(StaleOrchestratorError, match=r"moved on \(past attempt 1"):
        start_attempt(model, "p", "run-2", "score", 3, [("s3://raw/a", 1)], after=1)
    start_attempt(model, "p", "run-2", "score", 3, [("s3://raw/a", 1)], after=2)
    assert read_step(model, "p", "run-2", "score").step.attempt == 3


def test_reading_a_step_that_was_never_planned(ledger_table):
    records = read_step(bind_ledger(ledger_table), "p", "nope", "score")
    assert records.step is None and records.files == [] and records.shards == []
