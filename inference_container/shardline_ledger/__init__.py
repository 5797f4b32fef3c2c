"""Shardline's job-metadata ledger: one DynamoDB table, shared by the worker and Airflow.

This package is the single source of truth for the table's schema, its key layout and
its states. It imports neither Airflow nor the worker, so both sides can depend on it.
Names are resolved lazily, so importing the states or keys never loads pynamodb.
"""

import importlib

_EXPORTS = {
    "FileStatus": "shardline_ledger.states",
    "ShardStatus": "shardline_ledger.states",
    "StepStatus": "shardline_ledger.states",
    "run_pk": "shardline_ledger.keys",
    "step_sk": "shardline_ledger.keys",
    "file_sk": "shardline_ledger.keys",
    "shard_sk": "shardline_ledger.keys",
    "LedgerContext": "shardline_ledger.context",
    "LedgerConfigError": "shardline_ledger.context",
    "StaleAttemptError": "shardline_ledger.context",
    "LedgerItem": "shardline_ledger.table",
    "bind_ledger": "shardline_ledger.table",
    "create_ledger_table": "shardline_ledger.table",
    "FileOutcome": "shardline_ledger.worker",
    "WorkerLedger": "shardline_ledger.worker",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'shardline_ledger' has no attribute {name!r}")
