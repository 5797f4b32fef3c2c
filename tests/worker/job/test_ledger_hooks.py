"""The instance's side of the ledger (``shardline.worker.job.ledger_hooks``): an uploaded output's file is recorded
on its upload thread at once, not behind the instance's queue of ledger writes: a claim still queued when the record
lands never moves the file back to RUNNING."""

from __future__ import annotations

import threading

import boto3
import pytest

from shardline.ledger.context import LedgerContext
from shardline.ledger.job_writes import WorkerLedger
from shardline.ledger.keys import file_sk, run_pk
from shardline.ledger.states import FileStatus
from shardline.ledger.table import bind_ledger
from shardline.worker.job.ledger_hooks import LedgerHooks
from shardline.worker.job.uploads import OutputUploader
from shardline.worker.pool.runner import FileResult
from tests.support.records import hold_run

pytestmark = pytest.mark.slow

PIPELINE, RUN_ID, STEP, BUCKET, HOST = "nightly", "run-7", "score", "record-before-claim", "algo-1"
SHA = "ab" * 32


def test_a_claim_queued_behind_a_slow_write_never_moves_the_recorded_file_back(tmp_path, aws_env, ledger_table):
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    output_uri = f"s3://{BUCKET}/out/"
    hold_run(bind_ledger(ledger_table), PIPELINE, RUN_ID, STEP, output_uri)
    context = LedgerContext(
        ledger_table, PIPELINE, RUN_ID, STEP, 1, input_uri=f"s3://{BUCKET}/in/", output_uri=output_uri
    )
    (tmp_path / "a.parquet").write_bytes(b"the output's bytes")
    hooks = LedgerHooks(
        WorkerLedger(context, HOST),
        files_assigned=1,
        heartbeat_interval=60,
        retry_budget_seconds=30,
        output_dir=tmp_path,
        uploader=OutputUploader(tmp_path, output_uri),
    )
    model, key = bind_ledger(ledger_table), (run_pk(PIPELINE, RUN_ID), file_sk(STEP, f"s3://{BUCKET}/in/a.parquet"))
    slow_write = threading.Event()
    with hooks:
        try:
            hooks.pump.put(slow_write.wait, "a write the endpoint is slow to answer")  # the queue waits behind it
            hooks.file_started(FileResult("a.parquet"))
            hooks.file_finished(
                FileResult(
                    "a.parquet", status=FileStatus.SUCCEEDED, output="a.parquet", sha256=SHA, rows_in=3, rows_out=3
                )
            )
            hooks.drain()  # the upload ended and recorded its file, while the claim still waits in the queue
            item = model.get(*key, consistent_read=True)
            assert (item.status, item.output_sha256) == ("SUCCEEDED", SHA)
        finally:
            slow_write.set()  # the claim goes now: it finds its file recorded, and leaves it
    item = model.get(*key, consistent_read=True)
    assert (item.status, item.attempt, item.output_sha256, item.rows_out) == ("SUCCEEDED", 1, SHA, 3)
    assert item.started_at is not None and item.started_at <= item.finished_at  # from the file's own seconds
    assert hooks.withdrawn_outputs() == []  # the ledger accepted it: nothing is withdrawn
