"""Shardline's job-metadata ledger: one DynamoDB table, shared by the worker and Airflow.

This package is the single source of truth for the table's schema, its key layout and
its states. It imports neither Airflow nor the worker, so both sides can depend on it.
Names are resolved lazily, so importing the states or keys never loads pynamodb.
"""

import importlib

_EXPORTS = {
    "FileStatus": "shardline.ledger.states",
    "ShardStatus": "shardline.ledger.states",
    "StepStatus": "shardline.ledger.states",
    "run_pk": "shardline.ledger.keys",
    "step_sk": "shardline.ledger.keys",
    "file_sk": "shardline.ledger.keys",
    "shard_sk": "shardline.ledger.keys",
    "LedgerContext": "shardline.ledger.context",
    "LedgerConfigError": "shardline.ledger.context",
    "StaleAttemptError": "shardline.ledger.context",
    "LedgerItem": "shardline.ledger.table",
    "bind_ledger": "shardline.ledger.table",
    "create_ledger_table": "shardline.ledger.table",
    "FileOutcome": "shardline.ledger.job_writes",
    "WorkerLedger": "shardline.ledger.job_writes",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'shardline.ledger' has no attribute {name!r}")
