"""WorkerLedger against moto_server over HTTP: file records, heartbeats and attempt fencing."""

from __future__ import annotations

import pytest

from shardline.ledger.context import LedgerContext, StaleAttemptError
from shardline.ledger.job_writes import FinishedFile, WorkerLedger
from shardline.ledger.keys import failures_pk, file_sk, run_pk, shard_sk, step_sk
from shardline.ledger.states import FileStatus, ShardStatus
from shardline.ledger.table import MAX_ERROR_CHARS


def _ledger(table: str, attempt: int, host: str = "algo-1", **kwargs) -> WorkerLedger:
    context = LedgerContext(table=table, pipeline="nightly", run_id="r1", step="score", attempt=attempt, **kwargs)
    return WorkerLedger(context, host)


def _file(ledger: WorkerLedger, key: str):
    return ledger.model.get(run_pk("nightly", "r1"), file_sk("score", key))


BEAT = {"files_assigned": 4, "files_done": 1, "files_failed": 0, "rows_done": 100}


def test_create_ledger_table_is_idempotent(ledger_table, aws_env):
    from shardline.ledger.table import create_ledger_table

    create_ledger_table(ledger_table, "us-east-1", aws_env["AWS_ENDPOINT_URL"])
    assert _ledger(ledger_table, 1).model.exists()


def test_claim_and_finish(ledger_table):
    ledger = _ledger(ledger_table, 1, input_uri="s3://bucket/in")
    ledger.claim_file("d/a.parquet")
    item = _file(ledger, "s3://bucket/in/d/a.parquet")
    assert (item.status, item.attempt, item.host, item.input_key) == (
        "RUNNING",
        1,
        "algo-1",
        "s3://bucket/in/d/a.parquet",
    )
    assert item.started_at is not None and item.finished_at is None
    ledger.finish_file(
        "d/a.parquet",
        FinishedFile(
            FileStatus.SUCCEEDED,
            rows_in=10,
            rows_out=10,
            bytes_in=1000,
            bytes_out=200,
            seconds=1.23456,
            output_key="s3://bucket/out/a",
        ),
    )
    item = _file(ledger, "s3://bucket/in/d/a.parquet")
    assert (item.status, item.rows_in, item.rows_out, item.bytes_in, item.bytes_out) == ("SUCCEEDED", 10, 10, 1000, 200)
    assert item.seconds == pytest.approx(1.235)
    assert item.output_key == "s3://bucket/out/a"
    assert item.finished_at is not None
    assert item.error_class is None and item.failed_pk is None


def test_failed_file_lands_in_the_failures_index_and_a_retry_clears_it(ledger_table):
    first, second = _ledger(ledger_table, 1), _ledger(ledger_table, 2)
    first.claim_file("bad.parquet")
    first.finish_file(
        "bad.parquet",
        FinishedFile(FileStatus.FAILED, error_class="CorruptInputError", error_message="x" * (MAX_ERROR_CHARS + 500)),
    )
    item = _file(first, "bad.parquet")
    assert (item.status, item.error_class) == ("FAILED", "CorruptInputError")
    assert len(item.error_message) == MAX_ERROR_CHARS
    assert item.failed_pk == failures_pk("nightly")
    failures = list(first.model.failures.query(failures_pk("nightly")))
    assert [f.input_key for f in failures] == ["bad.parquet"]
    # a newer attempt claims the file: the failure is cleared
    second.claim_file("bad.parquet")
    item = _file(second, "bad.parquet")
    assert (item.status, item.attempt, item.error_class, item.failed_pk) == ("RUNNING", 2, None, None)
    assert list(first.model.failures.query(failures_pk("nightly"))) == []


def test_a_stale_attempt_cannot_claim_or_finish_after_a_newer_claim(ledger_table):
    old, new = _ledger(ledger_table, 1, host="zombie"), _ledger(ledger_table, 2, host="fresh")
    old.claim_file("a.parquet")
    new.claim_file("a.parquet")
    with pytest.raises(StaleAttemptError, match="attempt 1"):
        old.claim_file("a.parquet")
    with pytest.raises(StaleAttemptError, match="attempt 1"):
        old.finish_file("a.parquet", FinishedFile(FileStatus.SUCCEEDED, rows_in=5, rows_out=5))
    item = _file(new, "a.parquet")
    assert (item.status, item.attempt, item.host, item.rows_in) == ("RUNNING", 2, "fresh", None)
    # the owner still can
    new.finish_file("a.parquet", FinishedFile(FileStatus.SUCCEEDED, rows_in=7, rows_out=7))
    assert (_file(new, "a.parquet").status, _file(new, "a.parquet").rows_in) == ("SUCCEEDED", 7)


def test_a_stale_claim_on_a_file_the_newer_attempt_finished(ledger_table):
    old, new = _ledger(ledger_table, 1), _ledger(ledger_table, 2)
    new.claim_file("b.parquet")
    new.finish_file("b.parquet", FinishedFile(FileStatus.SUCCEEDED, rows_in=1, rows_out=1))
    with pytest.raises(StaleAttemptError):
        old.claim_file("b.parquet")
    assert _file(new, "b.parquet").status == "SUCCEEDED"


def test_heartbeat_writes_the_shard_item(ledger_table):
    ledger = _ledger(ledger_table, 1)
    ledger.heartbeat(ShardStatus.RUNNING, **BEAT)
    ledger.heartbeat(ShardStatus.SUCCEEDED, files_assigned=4, files_done=4, files_failed=0, rows_done=400)
    item = ledger.model.get(run_pk("nightly", "r1"), shard_sk("score", 1, "algo-1"))
    assert (item.status, item.attempt, item.host, item.files_assigned, item.files_done, item.rows_done) == (
        "SUCCEEDED",
        1,
        "algo-1",
        4,
        4,
        400,
    )
    assert item.heartbeat_at is not None


def test_heartbeat_is_fenced_by_the_step_item(ledger_table):
    old, new = _ledger(ledger_table, 1), _ledger(ledger_table, 2)
    model = old.model
    model.Control(run_pk("nightly", "r1"), step_sk("score"), attempt=1, status="RUNNING").save()
    old.heartbeat(ShardStatus.RUNNING, **BEAT)  # attempt 1 still owns the step
    # the orchestrator starts attempt 2
    model.Control(run_pk("nightly", "r1"), step_sk("score"), attempt=2, status="RUNNING").save()
    with pytest.raises(StaleAttemptError, match="moved past attempt 1"):
        old.heartbeat(ShardStatus.SUCCEEDED, files_assigned=4, files_done=4, files_failed=0, rows_done=400)
    zombie = model.get(run_pk("nightly", "r1"), shard_sk("score", 1, "algo-1"))
    assert (zombie.status, zombie.files_done) == ("RUNNING", 1), "a rejected heartbeat writes nothing"
    new.heartbeat(ShardStatus.RUNNING, **BEAT)
    assert model.get(run_pk("nightly", "r1"), shard_sk("score", 2, "algo-1")).status == "RUNNING"


def test_finishing_a_file_another_attempt_holds_is_rejected_and_one_no_attempt_holds_lands(ledger_table):
    old, new = _ledger(ledger_table, 1), _ledger(ledger_table, 2)
    old.claim_file("c.parquet")
    with pytest.raises(StaleAttemptError, match="attempt 2"):
        new.finish_file("c.parquet", FinishedFile(FileStatus.SUCCEEDED, rows_in=1, rows_out=1))
    item = _file(old, "c.parquet")
    assert (item.status, item.attempt) == ("RUNNING", 1)
    # No item at all: this attempt's claim was dropped (a retry would have written its fence item first).
    new.finish_file("claim-dropped.parquet", FinishedFile(FileStatus.SUCCEEDED, rows_in=1, rows_out=1))
    item = _file(new, "claim-dropped.parquet")
    assert (item.status, item.attempt, item.input_key) == ("SUCCEEDED", 2, "claim-dropped.parquet")
