"""Shardline's job-metadata ledger: one DynamoDB table, shared by the worker and Airflow.

This package is the single source of truth for the table's schema, its key layout and
its states. It imports neither Airflow nor the worker, so both sides can depend on it.
"""

from shardline_ledger.keys import file_sk, run_pk, shard_sk, step_sk
from shardline_ledger.states import FileStatus, ShardStatus, StepStatus
from shardline_ledger.table import LedgerItem, bind_ledger, create_ledger_table
from shardline_ledger.worker import LedgerContext, StaleAttemptError, WorkerLedger

__all__ = [
    "FileStatus",
    "LedgerContext",
    "LedgerItem",
    "ShardStatus",
    "StaleAttemptError",
    "StepStatus",
    "WorkerLedger",
    "bind_ledger",
    "create_ledger_table",
    "file_sk",
    "run_pk",
    "shard_sk",
    "step_sk",
]
