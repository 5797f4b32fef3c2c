"""Every ledger write sets the TTL attribute the table declares, so error text (which can echo input rows)
expires; the retention is the pipeline's ``ledger_retention_days``."""

from __future__ import annotations

import datetime as dt

import pytest

from shardline.ledger.context import LedgerConfigError, LedgerContext
from shardline.ledger.job_writes import FinishedFile, WorkerLedger
from shardline.ledger.keys import RUN_SK, StepRef, file_sk, run_pk, shard_sk, step_sk
from shardline.ledger.states import FileStatus, ShardStatus, StepStatus
from shardline.ledger.step_writes import ensure_run, finish_step, start_attempt
from shardline.ledger.table import bind_ledger


def _expires_in_days(item, before: dt.datetime, after: dt.datetime, days: int) -> bool:
    return (
        before + dt.timedelta(days=days) - dt.timedelta(seconds=1)
        <= item.expires_at
        <= after + dt.timedelta(days=days) + dt.timedelta(seconds=1)
    )


def test_retention_every_item_the_orchestrator_and_the_worker_write_expires(ledger_table):
    before = dt.datetime.now(dt.UTC)
    model = bind_ledger(ledger_table, retention_days=7)
    ensure_run(model, "p", "r1")
    start_attempt(model, StepRef("p", "r1", "score"), 1, [("s3://b/in/a.parquet", 10)])
    context = LedgerContext(
        table=ledger_table, pipeline="p", run_id="r1", step="score", attempt=1, input_uri="s3://b/in", retention_days=7
    )
    worker = WorkerLedger(context, "algo-1")
    worker.claim_file("a.parquet")
    worker.finish_file(
        "a.parquet",
        FinishedFile(
            FileStatus.FAILED, error_class="InputSchemaError", error_message="row 3: ssn=123-45-6789 is not a number"
        ),
    )
    worker.heartbeat(ShardStatus.PARTIAL, files_assigned=1, files_done=1, files_failed=1, rows_done=0)
    finish_step(model, StepRef("p", "r1", "score"), 1, StepStatus.FAILED, "1 file failed")
    after = dt.datetime.now(dt.UTC)
    pk = run_pk("p", "r1")
    for sk in (RUN_SK, step_sk("score"), file_sk("score", "s3://b/in/a.parquet"), shard_sk("score", 1, "algo-1")):
        item = model.get(pk, sk, consistent_read=True)
        assert item.expires_at is not None, sk
        assert _expires_in_days(item, before, after, 7), (sk, item.expires_at)


def test_retention_reaches_the_worker_from_its_environment():
    env = {
        "SHARDLINE_LEDGER_TABLE": "t",
        "SHARDLINE_PIPELINE": "p",
        "SHARDLINE_RUN_ID": "r",
        "SHARDLINE_STEP": "s",
        "SHARDLINE_ATTEMPT": "1",
    }
    assert LedgerContext.from_env(env).retention_days == 90
    assert LedgerContext.from_env({**env, "SHARDLINE_LEDGER_RETENTION_DAYS": "14"}).retention_days == 14
    with pytest.raises(LedgerConfigError, match="SHARDLINE_LEDGER_RETENTION_DAYS"):
        LedgerContext.from_env({**env, "SHARDLINE_LEDGER_RETENTION_DAYS": "-1"})


def test_retention_is_a_spec_setting_sent_to_the_job():
    from shardline.planning.request import worker_environment
    from shardline.spec import parse_spec
    from tests.planning.test_request import attempt
    from tests.support.specs import minimal

    spec = parse_spec(minimal(ledger_retention_days=30), "p.yaml")
    assert worker_environment(spec, spec.steps[0], attempt())["SHARDLINE_LEDGER_RETENTION_DAYS"] == "30"
    assert parse_spec(minimal(), "p.yaml").ledger_retention_days == 90
