"""Runs an on-call engineer finds red with nothing left to resubmit, written to a ledger table as the plan task, the
worker and the failure callback write them."""

from __future__ import annotations

from shardline.ledger.keys import StepRef
from shardline.ledger.states import StepStatus
from shardline.ledger.step_writes import ensure_run, finish_step, start_attempt
from shardline.ledger.table import bind_ledger
from shardline.oncall.service import OnCall
from shardline.spec import parse_spec

LOST_HOLD = "the run no longer holds the lock on s3://b/out/"
CALLBACK = "DAG run failed (task_failure); check the failed task's log in Airflow for why"


def red_run(ledger_table: str, run_id: str, *, scored: bool) -> OnCall:
    """A run the failure callback marked FAILED: its plan failed (no STEP item), or (``scored``) its watch failed
    after every file of its step succeeded."""
    from shardline.ledger.context import LedgerContext
    from shardline.ledger.job_writes import FinishedFile, WorkerLedger
    from shardline.ledger.states import FileStatus
    from shardline.ledger.step_writes import set_run_status

    spec = pipeline_p(ledger_table)
    model = bind_ledger(ledger_table)
    ensure_run(model, "p", run_id)
    if scored:
        ref = StepRef("p", run_id, "score")
        start_attempt(model, ref, 1, [("s3://b/in/a.parquet", 1), ("s3://b/in/b.parquet", 1)])
        worker = WorkerLedger(LedgerContext(ledger_table, "p", run_id, "score", 1, input_uri="s3://b/in/"), "algo-1")
        for name in ("a.parquet", "b.parquet"):
            worker.claim_file(name)
            worker.finish_file(name, FinishedFile(FileStatus.SUCCEEDED, rows_in=5, rows_out=5))
        assert finish_step(model, ref, 1, StepStatus.FAILED, LOST_HOLD)
    set_run_status(model, "p", run_id, StepStatus.FAILED, CALLBACK)
    return OnCall({"p": spec})


def pipeline_p(ledger_table: str):
    """A one-step pipeline ``p`` over ``ledger_table``."""
    return parse_spec(
        {
            "pipeline": "p",
            "ledger_table": ledger_table,
            "steps": [
                {
                    "name": "score",
                    "model": {"uri": "s3://b/m.tar.gz", "sha256": "a" * 64},
                    "input": {"prefix": "s3://b/in/"},
                    "output": {"prefix": "s3://b/out/"},
                }
            ],
        },
        "p.yaml",
    )
